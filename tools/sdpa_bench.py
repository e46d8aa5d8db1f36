#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes of kernels/benches/attention.rs.

    pip install torch
    python3 tools/sdpa_bench.py [--threads 2] [--reps 15]

Causal prefill tq = tk in {512, 2048, 4096} and decode tq = 1, tk in {512, 2048, 8192};
9 query heads over 3 KV heads (K/V repeated to 9 heads, as SDPA on CPU needs), head_dim 64,
f32. Prints the median, min and max wall time of each shape in milliseconds.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, D = 9, 3, 64


def bench(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for tq, tk in [(512, 512), (2048, 2048), (4096, 4096), (1, 512), (1, 2048), (1, 8192)]:
            q = torch.rand(1, HEADS, tq, D) - 0.5
            k = (torch.rand(1, KV_HEADS, tk, D) - 0.5).repeat_interleave(HEADS // KV_HEADS, dim=1)
            v = (torch.rand(1, KV_HEADS, tk, D) - 0.5).repeat_interleave(HEADS // KV_HEADS, dim=1)
            causal = tq == tk  # decode: the single query sees every key anyway
            med, lo, hi = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.reps)
            kind = "prefill_causal" if tq > 1 else "decode"
            print(f"sdpa {kind:15s} tq={tq:5d} tk={tk:5d}: median {med:9.3f} ms  (min {lo:.3f}, max {hi:.3f})")


if __name__ == "__main__":
    main()
