#!/usr/bin/env python3
"""Makes the default model's quantized GGUF files that the tests and benchmarks run.

    python3 tools/quantized_models.py

Builds llama.cpp's tools once into $QKV_CACHE/llamacpp (tools/peers.py),
then writes SmolLM2-135M-Instruct.{F16,F32,Q8_0,Q4_0,Q5_1,Q4_K_M,Q5_K_M,Q6_K}.gguf into
$QKV_CACHE/llamacpp/models with `llama-quantize` (the quantized ones from the F32 file, itself
the published Q4_1 file dequantized). Files already there are kept. The published Q4_1 file
must be in the cache first (`cargo run --release --bin decode -- --prompt Hi -n 1` fetches it).
Prints the models directory on stdout.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402


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
        models = b.ensure_models(lc, cache, quant, None, ("F16", "F32") + b.QUANT_TYPES)
        for kind, path in models.items():
            b.log(f"{kind}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
        sys.stdout.flush()
    finally:
        os.dup2(real_stdout, 1)
    print(lc / "models")


if __name__ == "__main__":
    main()
