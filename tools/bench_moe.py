#!/usr/bin/env python3
"""qkv against llama-bench on the Qwen3-30B-A3B-shaped mixture of experts (4 layers).

    python3 tools/bench_moe.py [--types Q4_K_M,Q8_0] [--reps 3] [--threads 2]

The files come from `tools/real_shapes.py --models 30b-a3b` (made here on first use). Each row
alternates llama-bench and qkv's `decode` `--reps` times, as tools/bench_vs_llamacpp.py does:
  tg64:  llama-bench `-p 0 -n 64`;  qkv: the 4-token prompt, `-n 64`, generated tokens/s.
  pp256: llama-bench `-p 256 -n 0`; qkv: a 256-token prompt, `-n 0`, prompt tokens/s.
Prints the medians and spreads of both, and their ratio.
"""

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402
import real_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K_M,Q8_0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bench-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="tg64,pp256")
    args = ap.parse_args()
    cache = b.cache_dir()
    lc = cache / "llamacpp"
    bench, _ = b.ensure_llamacpp(lc)
    # The binary where cargo builds it (not the shared snapshot in the llama.cpp cache, which
    # tools/bench_vs_llamacpp.py may be running at the same time).
    b.run(["cargo", "build", "--release", "--bin", "decode"], cwd=b.REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or b.REPO / "target")
    qkv = target / "release" / "decode"
    rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=b.REPO,
                         capture_output=True, text=True).stdout.strip()
    files = real_shapes.ensure("30b-a3b", args.types.split(","))
    short = lc / "prompts" / "short.txt"
    short.parent.mkdir(parents=True, exist_ok=True)
    short.write_text("Once upon a time")
    p256 = b.make_prompt(lc, qkv, cache / b.SOURCE_GGUF, 256)
    t = args.threads
    print(f"qkv git {rev}; {t} threads; {args.reps} alternations; llama-bench -r "
          f"{args.bench_reps}")
    for ty, model in files.items():
        for row in args.rows.split(","):
            lcpp, ours = [], []
            for _ in range(args.reps):
                if row == "tg64":
                    ts, _, lcmd = b.llama_bench(bench, model, t, 0, 64, reps=args.bench_reps)
                    s, qcmd = b.qkv_decode(qkv, model, None, t, short, 64, 256)
                    ours.append(s["generated_tokens_per_s"])
                else:
                    ts, _, lcmd = b.llama_bench(bench, model, t, 256, 0, reps=args.bench_reps)
                    s, qcmd = b.qkv_decode(qkv, model, None, t, p256, 0, 320)
                    assert s["prompt_tokens"] == 256, s
                    ours.append(s["prompt_tokens_per_s"])
                lcpp.append(ts)
            ml, mq = statistics.median(lcpp), statistics.median(ours)
            print(f"{row}_{ty}: llama.cpp {ml:.2f} tok/s ({b.spread(lcpp)}), qkv {mq:.2f} "
                  f"tok/s ({b.spread(ours)}), qkv/llama.cpp {mq / ml:.2f}x", flush=True)
            print(f"    {lcmd}\n    {qcmd}", flush=True)


if __name__ == "__main__":
    main()
