#!/usr/bin/env python3
"""Tiny random-weight models of every decoder family qkv runs, with transformers' references.

    python3 tools/family_fixtures.py            # prints the fixtures directory on stdout

For each family (Llama 3 with llama3 RoPE scaling, Qwen2, Qwen3, Mistral with a sliding window,
Phi-3, Gemma 2, Gemma 3 text, the mixtures of experts Qwen3-MoE, Mixtral and Qwen2-MoE, and Qwen3
with YaRN scaling) this makes a model with transformers' own config class and random
weights, saves it as a Hugging Face directory (f32 safetensors, a small byte-level BPE
tokenizer.json trained here on local text), converts that directory to an f32 GGUF with
llama.cpp's convert_hf_to_gguf.py (from the llama-cpp-python 0.3.36 sdist that
tools/quantized_models.py unpacks into $QKV_CACHE/llamacpp), and writes transformers' f32
reference: the logits of every position of a prompt longer than any sliding window, and a greedy
32-token continuation. tests/families.rs compares qkv against them in both layouts.

The BF16_FAMILIES are the same networks with their weights rounded to bfloat16 and stored
that way (safetensors saved from the model in torch.bfloat16, a GGUF converted with
`--outtype bf16`); their reference is still transformers in f32, on those rounded weights.

Everything lands in $QKV_CACHE/families/<family>/ (hf/, model.gguf, reference.json, logits.bin);
a family whose reference.json carries the current VERSION is left alone.

Two things are adjusted when driving the converter, both outside the network itself:
- the tokenizer's pre-tokenizer is reported as "gpt-2" (the converter only knows the hashes of
  published tokenizers), and every family writes the tokenizer as a GPT-2 style vocabulary;
- Mistral: the converter maps MistralForCausalLM onto the `llama` architecture and drops
  `sliding_window` (llama.cpp then runs such files with full attention). The fixture writes the
  window back as the standard `llama.attention.sliding_window` key, which qkv reads.
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
import peers as b  # noqa: E402

# Bump when the models or the reference change: older fixtures are then regenerated.
VERSION = 2
VOCAB = 320
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
FFN = 128
WINDOW = 16
PROMPT_LEN = 40
GREEDY = 32
# Families stored in bfloat16, each with the family whose network it takes: Qwen2's, for its
# tied head (the bf16 embedding is gathered row by row and read as the head) and its biases.
BF16_FAMILIES = {"qwen2_bf16": "qwen2"}


def log(msg):
    print(f"[families] {msg}", file=sys.stderr, flush=True)


def configs():
    """family -> (transformers config, architecture name)."""
    import transformers as T

    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return {
        # Llama 3.1-style RoPE scaling: with head_dim 16 and base 10000 the wavelengths are
        # 6.3 … 19869, so an original context of 256 (low-frequency wavelength 256, high 64)
        # leaves pairs 0-2 alone, smooths pair 3 and divides pairs 4-7 by the factor.
        "llama": (
            T.LlamaConfig(
                **common,
                head_dim=HEAD_DIM,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
            ),
            "LlamaForCausalLM",
        ),
        # Q/K/V biases; tied head as in Qwen2.5-0.5B.
        "qwen2": (
            T.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                          tie_word_embeddings=True),
            "Qwen2ForCausalLM",
        ),
        # QK-norm, and a head dimension (32) other than hidden / heads (16).
        "qwen3": (
            T.Qwen3Config(**common, head_dim=32, tie_word_embeddings=True),
            "Qwen3ForCausalLM",
        ),
        # A sliding window shorter than the prompt, on every layer.
        "mistral": (
            T.MistralConfig(**common, head_dim=HEAD_DIM, sliding_window=WINDOW,
                            tie_word_embeddings=False),
            "MistralForCausalLM",
        ),
        # Fused QKV and gate/up tensors; Phi-3-mini's sliding window, scaled down.
        "phi3": (
            T.Phi3Config(**common, sliding_window=24, tie_word_embeddings=False),
            "Phi3ForCausalLM",
        ),
        # Alternating sliding/global layers, soft-capped attention and final logits, GeGLU,
        # (1 + w) norms, post-attention/post-FFN norms, √dim embedding scale. Caps small enough
        # to bite on this model's scores. query_pre_attn_scalar = head_dim, as in Gemma 2 2B/9B
        # (GGUF stores no scalar: llama.cpp derives it from the head dimension).
        "gemma2": (
            T.Gemma2Config(**common, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM,
                           sliding_window=WINDOW, attn_logit_softcapping=5.0,
                           final_logit_softcapping=3.0, tie_word_embeddings=True),
            "Gemma2ForCausalLM",
        ),
        # Gemma 3's pattern (five local layers, then a global one), QK-norm, a local RoPE base
        # apart from the global one, and linear RoPE scaling on the global layers only (as in
        # Gemma 3 4B and up).
        "gemma3": (
            T.Gemma3TextConfig(
                **{**common, "num_hidden_layers": 6},
                head_dim=HEAD_DIM,
                query_pre_attn_scalar=HEAD_DIM,
                sliding_window=WINDOW,
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
                tie_word_embeddings=True,
            ),
            "Gemma3ForCausalLM",
        ),
        # Qwen3-30B-A3B's routing: softmax over 8 experts, the top 2 renormalised
        # (norm_topk_prob, which llama.cpp always applies to qwen3moe), QK-norm.
        "qwen3moe": (
            T.Qwen3MoeConfig(**common, head_dim=HEAD_DIM, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=32, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[],
                             tie_word_embeddings=False),
            "Qwen3MoeForCausalLM",
        ),
        # Mixtral: the llama architecture with 8 experts of intermediate_size, top 2.
        "mixtral": (
            T.MixtralConfig(**common, head_dim=HEAD_DIM, num_local_experts=8,
                            num_experts_per_tok=2, tie_word_embeddings=False),
            "MixtralForCausalLM",
        ),
        # Qwen2-MoE: Q/K/V biases, top-2 of 8 experts without renormalising, and a shared
        # expert behind a sigmoid gate.
        "qwen2moe": (
            T.Qwen2MoeConfig(**common, num_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=32, shared_expert_intermediate_size=48,
                             norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
                             tie_word_embeddings=False),
            "Qwen2MoeForCausalLM",
        ),
        # YaRN at factor 4 over an original context of 32 positions, shorter than the prompt
        # (40) and the continuation: with head_dim 32 and base 10000 the ramp runs over pairs
        # 0-3 and the attention factor is 0.1·ln 4 + 1.
        "qwen3yarn": (
            T.Qwen3Config(**{**common, "max_position_embeddings": 128}, head_dim=32,
                          tie_word_embeddings=True,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                           "factor": 4.0,
                                           "original_max_position_embeddings": 32}),
            "Qwen3ForCausalLM",
        ),
    }


def training_text():
    """Local English-ish text for the tokenizer: Python's own docstrings."""
    import this  # noqa: F401  (prints the Zen of Python on import)
    import codecs
    import inspect
    import json as j

    zen = codecs.decode(sys.modules["this"].s, "rot13")
    parts = [zen, b.PARAGRAPH * 4]
    for mod in (j, inspect, random, subprocess, textwrap):
        parts.append(inspect.getdoc(mod) or "")
    return "\n".join(parts)


def make_tokenizer(hf: Path):
    """A byte-level BPE tokenizer.json of exactly VOCAB tokens (one of them special)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # "<|endoftext|>" is there so that Qwen2's tokenizer class, which adds it when missing,
    # keeps the vocabulary at VOCAB.
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    stdout = sys.stdout
    sys.stdout = sys.stderr  # `import this` prints
    try:
        text = training_text()
    finally:
        sys.stdout = stdout
    tok.train_from_iterator([text], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
    }))


def randomize(model, gemma_norms: bool):
    """Weights with some spread: matrices from the config's init, every norm weight and bias
    random too (transformers initialises them to constants)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                noise = torch.randn(p.shape, generator=g) * 0.1
                if "norm" in name:
                    # Gemma's norms scale by (1 + w): keep w near 0 there, near 1 elsewhere.
                    p.copy_(noise if gemma_norms else 1.0 + noise)
                else:
                    p.copy_(noise)


def reference(model, prompt):
    """Logits of every prompt position and a greedy continuation (full recompute each step,
    no cache), with the smallest top-1/top-2 logit margin seen."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = model(ids, use_cache=False).logits[0].float()
        seq = list(prompt)
        greedy, margin = [], float("inf")
        last = logits[-1]
        for _ in range(GREEDY):
            top = torch.topk(last, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            nxt = int(top.indices[0])
            greedy.append(nxt)
            seq.append(nxt)
            last = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
    return logits, greedy, margin


def convert(hf: Path, out: Path, family: str, arch: str, src: Path, outtype: str = "f32"):
    """convert_hf_to_gguf.py on `hf`, driven from a child Python with the two adjustments the
    module docs describe."""
    driver = textwrap.dedent(f"""
        import runpy, sys
        sys.path.insert(0, {str(src)!r})
        sys.path.insert(1, {str(src / 'gguf-py')!r})
        import conversion
        from conversion.base import TextModel
        TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
        cls = conversion.get_model_class({arch!r})
        cls.set_vocab = lambda self: self._set_vocab_gpt2()
        if {family == "mistral"!r}:
            base = cls.set_gguf_parameters
            def with_window(self):
                base(self)
                self.gguf_writer.add_sliding_window(self.hparams["sliding_window"])
            cls.set_gguf_parameters = with_window
        sys.argv = ["convert_hf_to_gguf.py", {str(hf)!r}, "--outtype", {outtype!r},
                    "--outfile", {str(out)!r}]
        runpy.run_path({str(src / 'convert_hf_to_gguf.py')!r}, run_name="__main__")
    """)
    subprocess.run([sys.executable, "-c", driver], check=True, stdout=sys.stderr,
                   stderr=sys.stderr, cwd=src)



def build(family: str, config, arch: str, out: Path, src: Path):
    import torch
    import transformers as T
    from safetensors.torch import save_file  # noqa: F401  (save_pretrained needs it)

    hf = out / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config.architectures = [arch]
    model = getattr(T, arch)._from_config(config, attn_implementation="eager",
                                          dtype=torch.float32)
    model.eval()
    randomize(model, gemma_norms=family.startswith("gemma"))
    bf16 = family in BF16_FAMILIES
    if bf16:
        # Stored in bfloat16; reloaded below in f32, which widens each weight exactly.
        model = model.to(torch.bfloat16)
    model.save_pretrained(hf, safe_serialization=True)
    make_tokenizer(hf)
    # Reload as a user would, to make sure the saved directory is what the reference ran.
    model = T.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                   attn_implementation="eager")
    model.eval()

    # A prompt whose greedy continuation is unambiguous: every step's best logit leads the
    # second by at least 1e-3 of the prompt logits' range (f32 reorderings move logits by
    # ~1e-6 of it), so equality of the continuations is a fair test.
    rng = random.Random(family)
    for attempt in range(50):
        prompt = [rng.randrange(3, VOCAB) for _ in range(PROMPT_LEN)]
        logits, greedy, margin = reference(model, prompt)
        span = float(logits.max() - logits.min())
        if margin >= 1e-3 * span:
            break
    else:
        sys.exit(f"{family}: no prompt with a clear greedy continuation in 50 tries")
    log(f"{family}: prompt found after {attempt + 1} tries; logit range {span:.3f}, "
        f"smallest greedy margin {margin:.4f}")

    gguf = out / "model.gguf"
    convert(hf, gguf, family, arch, src, "bf16" if bf16 else "f32")
    (out / "logits.bin").write_bytes(logits.contiguous().numpy().astype("<f4").tobytes())
    ref = {
        "version": VERSION,
        "family": family,
        "model_type": config.model_type,
        "architecture": arch,
        "vocab": VOCAB,
        "prompt": prompt,
        "greedy": greedy,
        "logit_range": span,
        "greedy_margin": margin,
        "transformers": T.__version__,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1))


def main():
    cache = b.cache_dir()
    src = cache / "llamacpp" / f"llama_cpp_python-{b.LLAMA_CPP_PY_VERSION}" / "vendor" / "llama.cpp"
    if not (src / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"{src} has no convert_hf_to_gguf.py: run tools/quantized_models.py first "
                 "(it unpacks llama.cpp's source)")
    root = cache / "families"
    only = set(sys.argv[1:])
    families = configs()
    for family, base in BF16_FAMILIES.items():
        families[family] = configs()[base]
    for family, (config, arch) in families.items():
        if only and family not in only:
            continue
        out = root / family
        ref = out / "reference.json"
        if ref.is_file() and json.loads(ref.read_text()).get("version") == VERSION \
                and (out / "model.gguf").is_file():
            log(f"{family}: up to date")
            continue
        log(f"{family}: building")
        build(family, config, arch, out, src)
    print(root)


if __name__ == "__main__":
    main()
