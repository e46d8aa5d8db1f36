#!/usr/bin/env python3
"""Makes the default model's quantized GGUF files that the tests and benchmarks run.

    python3 tools/quantized_models.py

Builds llama.cpp's tools once into $QKV_CACHE/llamacpp (tools/peers.py), then writes into
$QKV_CACHE/llamacpp/models, with `llama-quantize`, SmolLM2-135M-Instruct.<T>.gguf for F16, F32,
BF16 (from the F32 file, kept as bf16 by qkv: tests/bf16_files.rs), peers.py's QUANT_TYPES and LOW_BIT_TYPES, and the `--pure` files of PURE_TYPES (the quantized
ones from the F32 file, itself the published Q4_1 file dequantized), and the IMATRIX_TYPES
files (SmolLM2-135M-Instruct.<T>.gguf) with an importance matrix that `llama-imatrix`
makes once from the F32 file on tools/perplexity_text.py's text. Files already there are
kept. The published Q4_1 file
must be in the cache first (`cargo run --release --bin decode -- --prompt Hi -n 1` fetches it).
Prints the models directory on stdout.
"""

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402

# Low-bit mixes that llama-quantize makes without an importance matrix. SmolLM2's width (576)
# is not a multiple of 256, so most of their matrices fall back to 32-element types (Q4_0 for
# Q2_K and Q3_K, IQ4_NL for IQ4_XS; tests/quantized_files.rs lists what each file holds).
LOW_BIT_TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS")

# Types whose standard mixes leave none of their own blocks in this model (the Q2_K mix
# makes ffn_down Q3_K, and every other matrix falls back to Q4_0), made again with `--pure`
# (one type for every matrix, before the width's fallback) as SmolLM2-135M-Instruct.<T>_PURE.gguf:
# ffn_down, the only matrices of width 1536, then hold Q2_K blocks.
PURE_TYPES = ("Q2_K",)

# The IQ and ternary types, made with an importance matrix (llama-quantize refuses IQ2_XXS,
# IQ2_XS, IQ2_S, IQ1_S and IQ1_M without one). As with the low-bit K types, only the
# matrices of width 1536 (ffn_down) can hold their 256-element blocks; the rest fall back.
# llama-quantize's IQ2_S mix stores IQ2_XS blocks (even with `--pure`); IQ2_M's are IQ2_S.
IMATRIX_TYPES = ("IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M",
                 "TQ1_0", "TQ2_0")

# Characters of tools/perplexity_text.py's text and 512-token chunks the importance matrix
# is computed on (about a minute and a half on 2 threads).
IMATRIX_CHARS, IMATRIX_CHUNKS = 60_000, 20


def ensure_imatrix(lc: Path, quant: Path) -> Path:
    """The F32 file's importance matrix from `llama-imatrix` (built beside llama-quantize and
    kept once made)."""
    target = lc / "models" / f"{b.MODEL_STEM}.imatrix.gguf"
    if target.is_file():
        return target
    tool = b.build_llamacpp(lc, ["llama-imatrix"]) / "llama-imatrix"
    text = lc / "imatrix.txt"
    b.run([sys.executable, Path(__file__).resolve().parent / "perplexity_text.py", text,
           "--chars", IMATRIX_CHARS])
    src = lc / "models" / f"{b.MODEL_STEM}.F32.gguf"
    tmp = target.with_suffix(".tmp")
    b.log(f"importance matrix of {src.name} on {text.name}")
    with open(lc / "imatrix.log", "w") as log:
        b.run([tool, "-m", src, "-f", text, "-o", tmp, "-t", 2, "-c", 512, "--chunks",
               IMATRIX_CHUNKS], stdout=log, stderr=subprocess.STDOUT)
    tmp.rename(target)
    return target


def ensure_with_imatrix(lc: Path, quant: Path, imatrix: Path, ty: str) -> Path:
    """The F32 file quantized to `ty`'s standard mix with the importance matrix."""
    models = lc / "models"
    target = models / f"{b.MODEL_STEM}.{ty}.gguf"
    if not target.is_file():
        src = models / f"{b.MODEL_STEM}.F32.gguf"
        b.log(f"quantizing {src.name} -> {target.name} (--imatrix)")
        tmp = target.with_suffix(".tmp")
        with open(lc / f"quantize-{ty}.log", "w") as quant_log:
            b.run([quant, "--allow-requantize", "--imatrix", imatrix, src, tmp, ty],
                  stdout=quant_log, stderr=subprocess.STDOUT)
        tmp.rename(target)
    return target


def ensure_pure(lc: Path, quant: Path, ty: str) -> Path:
    """The F32 file quantized to `ty` with `llama-quantize --pure` (kept once made)."""
    models = lc / "models"
    target = models / f"{b.MODEL_STEM}.{ty}_PURE.gguf"
    if not target.is_file():
        src = models / f"{b.MODEL_STEM}.F32.gguf"
        b.log(f"quantizing {src.name} -> {target.name} (--pure)")
        tmp = target.with_suffix(".tmp")
        with open(lc / f"quantize-{ty}_PURE.log", "w") as quant_log:
            b.run([quant, "--allow-requantize", "--pure", src, tmp, ty], stdout=quant_log,
                  stderr=subprocess.STDOUT)
        tmp.rename(target)
    return target


def main():
    cache = b.cache_dir()
    lc = cache / "llamacpp"
    # Everything but the directory goes to stderr, the child processes' output (pip, cmake)
    # included, so that `$(…)` gets only the directory.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        _, quant = b.ensure_llamacpp(lc)
        kinds = ("F16", "F32", "BF16") + b.QUANT_TYPES + LOW_BIT_TYPES
        models = b.ensure_models(lc, cache, quant, None, kinds)
        for ty in PURE_TYPES:
            models[f"{ty.lower()}_pure"] = ensure_pure(lc, quant, ty)
        imatrix = ensure_imatrix(lc, quant)
        for ty in IMATRIX_TYPES:
            models[ty.lower()] = ensure_with_imatrix(lc, quant, imatrix, ty)
        for kind, path in models.items():
            b.log(f"{kind}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
        sys.stdout.flush()
    finally:
        os.dup2(real_stdout, 1)
    print(lc / "models")


if __name__ == "__main__":
    main()
