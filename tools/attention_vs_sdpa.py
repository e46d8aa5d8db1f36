#!/usr/bin/env python3
"""qkv's attention kernel against PyTorch's scaled_dot_product_attention, side by side.

    pip install torch
    python3 tools/attention_vs_sdpa.py [--alternations 3] [--reps 11] [--threads 2]

For each shape (causal prefill tq = tk in {512, 2048, 4096}; decode tq = 1, tk in
{512, 2048, 8192}; 9 query heads over 3 KV heads, head_dim 64, f32), the two run in
alternation: PyTorch in this process, qkv as `kernels/examples/attention_time` (built here
with cargo). Both read K/V head-major for decode (PyTorch's [B, H, T, D]; qkv's Llama cache
layout) and qkv reads them position-major for prefill (its activations' layout). Each run
reports the median of REPS calls; the table gives the median over alternations and the
ratio PyTorch / qkv (> 1: qkv is faster). The machine is shared and noisy, so the two
alternate, in ABBA order: whichever runs first in a pair meets a different machine state.
"""
import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
HEADS, KV_HEADS, D = 9, 3, 64
SHAPES = [(512, 512), (2048, 2048), (4096, 4096), (1, 512), (1, 2048), (1, 8192)]


def sdpa_median(tq, tk, reps):
    q = torch.rand(1, HEADS, tq, D) - 0.5
    k = (torch.rand(1, KV_HEADS, tk, D) - 0.5).repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = (torch.rand(1, KV_HEADS, tk, D) - 0.5).repeat_interleave(HEADS // KV_HEADS, dim=1)
    causal = tq == tk  # a single decode query sees every key anyway
    with torch.inference_mode():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def qkv_median(binary, tq, tk, reps, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    layout = "head" if tq == 1 else "pos"
    out = subprocess.run([binary, str(tq), str(tk), "f32", str(reps), "1", layout], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[out.index("median_ms") + 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "qkv-kernels",
                    "--example", "attention_time"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = str(target / "release" / "examples" / "attention_time")
    print(f"torch {torch.__version__}, {args.threads} threads, "
          f"{args.alternations} alternations of {args.reps} calls")
    rows = []
    for tq, tk in SHAPES:
        t_torch, t_qkv = [], []
        for i in range(args.alternations):
            # ABBA: whichever side runs first in a pair meets a different machine state
            # (caches, clocks), so the order flips every alternation.
            sides = [lambda: t_torch.append(sdpa_median(tq, tk, args.reps)),
                     lambda: t_qkv.append(qkv_median(binary, tq, tk, args.reps, args.threads))]
            for side in sides if i % 2 == 0 else sides[::-1]:
                side()
        mt, mq = statistics.median(t_torch), statistics.median(t_qkv)
        kind = "prefill causal" if tq > 1 else "decode"
        rows.append((kind, tq, tk, mt, mq, mt / mq, min(t_torch), max(t_torch), min(t_qkv), max(t_qkv)))
        print(f"{kind:14s} tq={tq:5d} tk={tk:5d}: sdpa {mt:9.3f} ms  qkv {mq:9.3f} ms  ratio {mt / mq:5.2f}",
              flush=True)
    print("\n| shape | PyTorch SDPA (ms) | qkv (ms) | SDPA / qkv | spread SDPA | spread qkv |")
    print("|---|---|---|---|---|---|")
    for kind, tq, tk, mt, mq, r, t0, t1, q0, q1 in rows:
        print(f"| {kind}, tq={tq}, tk={tk} | {mt:.3f} | {mq:.3f} | {r:.2f}× | {t0:.3f}–{t1:.3f} | {q0:.3f}–{q1:.3f} |")


if __name__ == "__main__":
    main()
