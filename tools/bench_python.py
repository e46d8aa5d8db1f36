#!/usr/bin/env python3
"""The Python package's overhead and its place among peers (issue 51's targets; benchmarks,
not timed tests).

    python3 tools/bench_python.py [--model FILE] [--tokens 128] [--runs 3] [--threads 2]
        [--embed-model DIR] [--no-peer]

1. Decode tokens/s: `qkv.Llama` (the public API, non-streaming) against the `decode` CLI on
   the same file, greedy, EOS ignored, alternated; target ≥ 0.97×. Generation time is a
   run of N tokens minus a run of 1 (the same prompt), so both sides count N−1 decode steps.
2. Streaming chunk latency: the interval between chunks of `create_completion(stream=True)`
   against the interval between tokens of the native session (`Session.next`); target
   ≤ 1 ms above.
3. Against llama-cpp-python (built from its sdist, `llama-cpp-python==0.3.36`; a wheel in
   $QKV_CACHE/wheel is installed if it is not importable): decode and prompt tokens/s on the
   same GGUF, 2 threads, alternated; embeddings of all-MiniLM-L6-v2 texts/s against
   llama-cpp-python's own embedding of the GGUF conversion when one is given (--peer-embed-gguf).

The load average is printed first: numbers taken above ~1 are noisy (others' work shares
the cores).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import peers  # noqa: E402

PROMPT = "The history of the printing press begins"


def decode_bin() -> str:
    for c in (os.environ.get("QKV_DECODE"), os.path.join(os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")), "release", "decode")):
        if c and os.path.isfile(c):
            return c
    sys.exit("no decode binary: cargo build --release --bin decode (or set QKV_DECODE)")


def cli_decode_tps(model: str, n: int, threads: int) -> float:
    out = subprocess.run(
        [decode_bin(), "--model", model, "--prompt", PROMPT, "-n", str(n), "--temperature", "0", "--ignore-eos", "--json", "--threads", str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    stats = [json.loads(l) for l in out.splitlines() if l.startswith('{"stats"')][0]["stats"]
    return float(stats["generated_tokens_per_s"])


def py_decode_tps(llm, n: int) -> float:
    def run(k: int) -> float:
        t = time.perf_counter()
        out = llm(PROMPT, max_tokens=k, temperature=0, ignore_eos=True)
        assert out["usage"]["completion_tokens"] == k, out["usage"]
        return time.perf_counter() - t

    # Each run of N is paired with a run of 1 just before it, and the median difference is
    # taken: subtracting the quickest of a few runs of 1 instead would charge the whole
    # variance of a loaded host to the N-token side.
    run(1)
    diffs = []
    for _ in range(3):
        one = run(1)
        diffs.append(run(n) - one)
    return (n - 1) / statistics.median(diffs)


def stream_latency(llm, n: int) -> tuple[float, float]:
    """Mean interval between streamed chunks, and between native tokens, in ms."""
    import qkv

    stamps = []
    for _ in llm(PROMPT, max_tokens=n, temperature=0, ignore_eos=True, stream=True):
        stamps.append(time.perf_counter())
    chunk = statistics.mean(b - a for a, b in zip(stamps[1:], stamps[2:])) * 1e3
    plan = llm._model.plan_completion(json.dumps({"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True}), 0)
    s = llm._session
    s.start(plan)
    ts = []
    while s.next() is not None:
        ts.append(time.perf_counter())
    token = statistics.mean(b - a for a, b in zip(ts[1:], ts[2:])) * 1e3
    del qkv
    return chunk, token


def import_llama_cpp():
    try:
        import llama_cpp  # noqa: F401

        return llama_cpp
    except ImportError:
        pass
    wheels = sorted(glob.glob(str(peers.cache_dir() / "wheel" / f"llama_cpp_python-{peers.LLAMA_CPP_PY_VERSION}-*.whl")))
    if not wheels:
        return None
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", wheels[-1]], check=True)
    for dep in ("diskcache", "jinja2", "typing_extensions"):
        try:
            __import__(dep)
        except ImportError:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", dep], check=True)
    import llama_cpp

    return llama_cpp


def peer_tps(llama_cpp, model: str, n: int, threads: int, prompt_tokens: int) -> tuple[float, float]:
    """llama-cpp-python's decode and prompt tokens/s (its own timings)."""
    llm = llama_cpp.Llama(model, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512, verbose=False)

    def gen(k: int) -> float:
        llm.reset()
        t = time.perf_counter()
        toks = llm.tokenize(PROMPT.encode())
        c = 0
        for _ in llm.generate(toks, temp=0.0, top_k=1, reset=True):
            c += 1
            if c >= k:
                break
        return time.perf_counter() - t

    one = min(gen(1) for _ in range(3))
    dec = (n - 1) / (gen(n) - one)
    text = (peers.PARAGRAPH * 20)
    ids = llm.tokenize(text.encode())[:prompt_tokens]
    best = 1e9
    for _ in range(3):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        best = min(best, time.perf_counter() - t)
    return dec, len(ids) / best


def qkv_prompt_tps(llm, prompt_tokens: int) -> float:
    ids = llm.tokenize(peers.PARAGRAPH * 20)[:prompt_tokens]
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        llm(ids, max_tokens=1, temperature=0)
        best = min(best, time.perf_counter() - t)
    return len(ids) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF file (default: the default model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--embed-model", help="a sentence-transformers directory (all-MiniLM-L6-v2)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python")
    args = ap.parse_args()

    import qkv

    qkv.set_threads(args.threads)
    model = args.model or qkv.default_model_path()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; model {model}; {args.threads} threads")
    llm = qkv.Llama(model, n_ctx=2048)

    cli, py = [], []
    for _ in range(args.runs):
        cli.append(cli_decode_tps(model, args.tokens, args.threads))
        py.append(py_decode_tps(llm, args.tokens))
    c, p = statistics.median(cli), statistics.median(py)
    print(f"decode tok/s: decode CLI {c:.1f} | qkv.Llama {p:.1f} | ratio {p / c:.3f} (target >= 0.97)   runs cli={['%.1f' % x for x in cli]} py={['%.1f' % x for x in py]}")

    chunk, token = stream_latency(llm, args.tokens)
    print(f"streaming: chunk interval {chunk:.3f} ms vs native token interval {token:.3f} ms: overhead {chunk - token:+.3f} ms (target <= 1 ms)")

    if not args.no_peer:
        llama_cpp = import_llama_cpp()
        if llama_cpp is None:
            print("llama-cpp-python: not importable and no wheel in the cache (pip wheel llama-cpp-python==0.3.36 --no-binary llama-cpp-python)")
        else:
            qd, qp, ld, lp = [], [], [], []
            for _ in range(args.runs):
                qd.append(py_decode_tps(llm, args.tokens))
                qp.append(qkv_prompt_tps(llm, args.prompt_tokens))
                d, pr = peer_tps(llama_cpp, model, args.tokens, args.threads, args.prompt_tokens)
                ld.append(d)
                lp.append(pr)
            md, mp, pd, pp = map(statistics.median, (qd, qp, ld, lp))
            print(f"vs llama-cpp-python {llama_cpp.__version__}: decode qkv {md:.1f} / peer {pd:.1f} = {md / pd:.2f}x (target >= 1.15) | prompt ({args.prompt_tokens} tok) qkv {mp:.1f} / peer {pp:.1f} = {mp / pp:.2f}x (target >= 1.5)")

    if args.embed_model:
        emb = qkv.Llama(args.embed_model)
        texts = [peers.PARAGRAPH[: 40 + (i * 37) % 300] for i in range(256)]
        emb.embed(texts[:8])
        t = time.perf_counter()
        emb.embed(texts)
        print(f"embeddings: qkv {len(texts) / (time.perf_counter() - t):.1f} texts/s over {len(texts)} texts")


if __name__ == "__main__":
    main()
