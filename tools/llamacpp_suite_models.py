#!/usr/bin/env python3
"""Local stand-ins for the models llama.cpp's server tests download, and the map from each
download to its file.

    python3 tools/llamacpp_suite_models.py     # builds what is missing, prints the map's path

There is no network here, so tools/llamacpp_server_suite.py gives both servers these files
instead (tools/llamacpp_server_shim.py swaps a server's `--hf-repo`/`--hf-file`/`--model-url`
for the mapped file; tools/llamacpp_suite_plugin.py makes the tests' own `download_file`
return the mapped file for a URL). Everything not named here runs the default model
(SmolLM2-135M-Instruct Q4_1).

- `ggml-org/stories15M_MOE` (test_lora's and test_speculative's main model): the tiny
  random-weight Llama of tools/lora_fixture.py, the base of its peft adapters.
- `moe_shakespeare15M.gguf` (test_lora's adapter): that fixture's `first` adapter (rank 4 on
  every projection and the output head), as convert_lora_to_gguf.py wrote it in f16.
- `stories15M-q4_0.gguf` (test_speculative's draft): the same base written again by
  convert_hf_to_gguf.py in Q8_0, so that drafts come from a close but not identical model
  of the same vocabulary.
- `ggml-org/test-model-stories260K-infill` (test_infill's model, and one of the router's):
  a tiny random-weight Llama (transformers' own classes) whose byte-level BPE vocabulary
  holds the fill-in-the-middle markers `<fim_prefix>`, `<fim_suffix>`, `<fim_middle>`,
  `<fim_pad>`, `<repo_name>` and `<file_sep>`, converted with convert_hf_to_gguf.py; both
  servers find the markers by their text.

The stand-ins are random models, so the tests that expect the real models' words (a
Shakespearean adapter, a bedtime story) fail on both servers alike; what they compare is
the rest: the routes, the fields, and that two servers given the same file agree.

Files land in $QKV_CACHE/llamacpp_server_suite/models/ with map.json; a map of the current
VERSION whose files all exist is left alone.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import family_fixtures as ff  # noqa: E402
import peers  # noqa: E402

VERSION = 1
TOOLS = Path(__file__).resolve().parent
FIM_TOKENS = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
              "<repo_name>", "<file_sep>"]
# What each download becomes; the values name files of `build`'s.
REPOS = {
    "ggml-org/stories15M_MOE": "lora_base",
    "ggml-org/test-model-stories260K-infill": "infill",
}
URLS = {
    "moe_shakespeare15M.gguf": "lora_adapter",
    "stories15M-q4_0.gguf": "draft",
}


def log(msg):
    print(f"[suite-models] {msg}", file=sys.stderr, flush=True)


def llamacpp_src() -> Path:
    return peers.llamacpp_source(peers.cache_dir() / "llamacpp")


def fim_tokenizer(hf: Path):
    """A byte-level BPE tokenizer.json of ff.VOCAB tokens, the FIM markers among them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=ff.VOCAB, special_tokens=FIM_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    stdout = sys.stdout
    sys.stdout = sys.stderr  # the training text's `import this` prints
    try:
        text = ff.training_text()
    finally:
        sys.stdout = stdout
    tok.train_from_iterator([text], trainer=trainer)
    assert tok.get_vocab_size() == ff.VOCAB, tok.get_vocab_size()
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "eos_token": "<|endoftext|>",
    }))


def build_infill(out: Path, src: Path) -> Path:
    """The FIM-capable tiny Llama, as an f32 GGUF."""
    import torch
    import transformers as T

    config, arch = ff.configs()["llama"]
    config.architectures = [arch]
    # The FIM vocabulary puts <|endoftext|> first; it ends a sequence here.
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 0, 0, 4
    hf = out / "infill-hf"
    hf.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    model = getattr(T, arch)._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    model.eval()
    ff.randomize(model, gemma_norms=False)
    model.save_pretrained(hf, safe_serialization=True)
    fim_tokenizer(hf)
    gguf = out / "infill-f32.gguf"
    ff.convert(hf, gguf, "llama", arch, src)
    return gguf


def lora_fixture() -> Path:
    """tools/lora_fixture.py's directory, built when missing."""
    out = subprocess.run([sys.executable, str(TOOLS / "lora_fixture.py")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    return Path(out)


def build(out: Path) -> dict:
    src = llamacpp_src()
    lora = lora_fixture()
    out.mkdir(parents=True, exist_ok=True)
    draft = out / "draft-q8_0.gguf"
    log(f"the draft: {lora / 'base'} in Q8_0")
    ff.convert(lora / "base", draft, "llama", "LlamaForCausalLM", src, outtype="q8_0")
    log("the infill model")
    files = {
        "lora_base": lora / "base.gguf",
        "lora_adapter": lora / "first-f16.gguf",
        "draft": draft,
        "infill": build_infill(out, src),
    }
    return {
        "version": VERSION,
        "repos": {repo: str(files[name]) for repo, name in REPOS.items()},
        "urls": {url: str(files[name]) for url, name in URLS.items()},
    }


def ensure() -> Path:
    """The map's path, building the stand-ins first when they are missing or stale."""
    out = peers.cache_dir() / "llamacpp_server_suite" / "models"
    path = out / "map.json"
    if path.is_file():
        have = json.loads(path.read_text())
        paths = [*have.get("repos", {}).values(), *have.get("urls", {}).values()]
        if have.get("version") == VERSION and all(Path(p).is_file() for p in paths):
            return path
    log("building the stand-ins")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build(out), indent=1))
    return path


if __name__ == "__main__":
    print(ensure())
