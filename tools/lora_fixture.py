#!/usr/bin/env python3
"""A tiny random-weight Llama with two peft LoRA adapters, and transformers+peft's logits.

    python3 tools/lora_fixture.py          # prints the fixture's directory on stdout

The base model is tools/family_fixtures.py's Llama (transformers' own config class, random
weights, an untied output head), saved as a Hugging Face directory and converted to an f32
GGUF with llama.cpp's convert_hf_to_gguf.py. On it, peft makes two LoRA adapters with random
A and random non-zero B (peft starts B at zero, which would test nothing):

- `first`: rank 4, alpha 8, on every projection (q, k, v, o, gate, up, down) and on the
  output head (lm_head);
- `second`: rank 2, alpha 2, on q, v and down only.

Each is saved as a peft directory and converted with llama.cpp's convert_lora_to_gguf.py
(`--base` the base directory): `first` as f32, f16 and q8_0, `second` as f32.

The reference (f32, no cache, every position of one prompt) is written for: the base model
(adapters off), `first` at scale 1, `first` at scale 0.5 (peft's scaling times 0.5), `first`
at 1 with `second` at 2 on the same sequence, and `first` merged into the weights at scale 1
(peft's merge_and_unload), and `first` at scale 1 with its A and B rounded as its f16 and
its q8_0 file hold them. tests/lora.rs compares qkv's logits with each.

Everything lands in $QKV_CACHE/lora/ (base/ and base.gguf, first/ and second/ with their
GGUFs, reference.json, <case>.bin logits); a reference.json of the current VERSION is left alone.
"""

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import family_fixtures as ff  # noqa: E402
import peers as b  # noqa: E402

VERSION = 2
PROMPT_LEN = 24
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
ADAPTERS = {
    # name: (rank, alpha, target modules, GGUF output types)
    "first": (4, 8, ALL, ["f32", "f16", "q8_0"]),
    "second": (2, 2, ["q_proj", "v_proj", "down_proj"], ["f32"]),
}


def log(msg):
    print(f"[lora] {msg}", file=sys.stderr, flush=True)


def convert_adapter(adapter: Path, base: Path, out: Path, outtype: str, src: Path):
    """convert_lora_to_gguf.py on a peft directory, with the base model's config from `base`."""
    driver = textwrap.dedent(f"""
        import runpy, sys
        sys.path.insert(0, {str(src)!r})
        sys.path.insert(1, {str(src / 'gguf-py')!r})
        sys.argv = ["convert_lora_to_gguf.py", {str(adapter)!r}, "--base", {str(base)!r},
                    "--outtype", {outtype!r}, "--outfile", {str(out)!r}]
        runpy.run_path({str(src / 'convert_lora_to_gguf.py')!r}, run_name="__main__")
    """)
    subprocess.run([sys.executable, "-c", driver], check=True, stdout=sys.stderr,
                   stderr=sys.stderr, cwd=src)


def set_scales(model, scales):
    """peft's scaling of each adapter: alpha / rank times the user's scale."""
    for module in model.modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict):
            for name in scaling:
                rank, alpha = ADAPTERS[name][0], ADAPTERS[name][1]
                scaling[name] = scales.get(name, 0.0) * alpha / rank


def rounded(t, outtype):
    """`t` through the storage of `outtype` and back, as gguf-py's quantizer rounds it."""
    import gguf
    import torch
    from gguf import quants

    if outtype == "q8_0" and t.shape[-1] % 32 == 0:
        kind = gguf.GGMLQuantizationType.Q8_0
        blocks = quants.quantize(t.numpy().astype("float32"), kind)
        return torch.from_numpy(quants.dequantize(blocks, kind).astype("float32"))
    return t.half().float()


def logits_of(model, prompt):
    import torch

    with torch.no_grad():
        return model(torch.tensor([prompt]), use_cache=False).logits[0].float().contiguous()


def build(out: Path, src: Path):
    import torch
    import transformers as T
    from peft import LoraConfig, PeftModel, get_peft_model

    config, arch = ff.configs()["llama"]
    config.architectures = [arch]
    config.tie_word_embeddings = False
    hf = out / "base"
    hf.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = getattr(T, arch)._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    model.eval()
    ff.randomize(model, gemma_norms=False)
    model.save_pretrained(hf, safe_serialization=True)
    ff.make_tokenizer(hf)
    ff.convert(hf, out / "base.gguf", "llama", arch, src)

    # The adapters: random A, and B random too (peft zeroes it), each from its own seed.
    for i, (name, (rank, alpha, targets, outtypes)) in enumerate(ADAPTERS.items()):
        base = T.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                      attn_implementation="eager")
        lora = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha,
                                               target_modules=targets, lora_dropout=0.0,
                                               bias="none"))
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for pname, p in lora.named_parameters():
                if "lora_A" in pname or "lora_B" in pname:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        directory = out / name
        lora.save_pretrained(directory)
        # The converter reads the base model's name from here; --base gives the directory.
        cfg = json.loads((directory / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(hf)
        (directory / "adapter_config.json").write_text(json.dumps(cfg, indent=1))
        for outtype in outtypes:
            convert_adapter(directory, hf, out / f"{name}-{outtype}.gguf", outtype, src)

    # The references, with both adapters loaded into one peft model.
    base = T.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                  attn_implementation="eager")
    model = PeftModel.from_pretrained(base, out / "first", adapter_name="first")
    model.load_adapter(out / "second", adapter_name="second")
    model.eval()
    rng = random.Random("lora")
    prompt = [rng.randrange(3, ff.VOCAB) for _ in range(PROMPT_LEN)]
    cases = {}
    with model.disable_adapter():
        cases["base"] = logits_of(model, prompt)
    model.base_model.set_adapter(["first", "second"])
    for case, scales in [("first_1", {"first": 1.0}), ("first_0.5", {"first": 0.5}),
                         ("first_1_second_2", {"first": 1.0, "second": 2.0})]:
        set_scales(model, scales)
        cases[case] = logits_of(model, prompt)
    # `first` as its f16 and q8_0 files hold it: each of A and B rounded as the converter
    # rounds it (q8_0 blocks along rows of a multiple of 32 values, f16 otherwise).
    params = {n: p for n, p in model.named_parameters() if ".first." in n and "lora_" in n}
    exact = {n: p.detach().clone() for n, p in params.items()}
    set_scales(model, {"first": 1.0})
    for outtype in ["f16", "q8_0"]:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(rounded(exact[n], outtype))
        cases[f"first_1_{outtype}"] = logits_of(model, prompt)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(exact[n])
    # peft's merged model: `first` at scale 1 folded into the weights.
    set_scales(model, {"first": 1.0, "second": 1.0})
    model.base_model.set_adapter("first")
    merged = model.merge_and_unload(adapter_names=["first"])
    cases["first_1_merged"] = logits_of(merged, prompt)

    ranges = {}
    for case, logits in cases.items():
        (out / f"{case}.bin").write_bytes(logits.numpy().astype("<f4").tobytes())
        ranges[case] = float(logits.max() - logits.min())
    delta = float((cases["first_1"] - cases["base"]).abs().max())
    log(f"largest change of a logit under `first`: {delta:.4f} (range {ranges['base']:.3f})")
    ref = {
        "version": VERSION,
        "vocab": ff.VOCAB,
        "prompt": prompt,
        "ranges": ranges,
        "adapters": {n: {"rank": r, "alpha": a, "targets": t, "outtypes": o}
                     for n, (r, a, t, o) in ADAPTERS.items()},
        "transformers": T.__version__,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1))


def main():
    cache = b.cache_dir()
    src = cache / "llamacpp" / f"llama_cpp_python-{b.LLAMA_CPP_PY_VERSION}" / "vendor" / "llama.cpp"
    if not (src / "convert_lora_to_gguf.py").is_file():
        sys.exit(f"{src} has no convert_lora_to_gguf.py: run tools/quantized_models.py first "
                 "(it unpacks llama.cpp's source)")
    out = cache / "lora"
    ref = out / "reference.json"
    if ref.is_file() and json.loads(ref.read_text()).get("version") == VERSION:
        log("up to date")
    else:
        log("building")
        build(out, src)
    print(out)


if __name__ == "__main__":
    main()
