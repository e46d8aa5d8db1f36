#!/usr/bin/env python3
"""qkv-server beside llama-server on the same GGUF, driven by the same load generator.

    python3 tools/bench_server.py [--streams 1,4,16,64] [--rounds 2] [--model GGUF]

Both servers load the same file (default: the default model, Q4_1) with 2 threads, 512
positions per sequence and as many parallel sequences as the largest stream count (llama-
server: `-c 512·N -np N`, its context split into N slots; qkv-server: `--ctx 512
--max-sequences N`). tools/server_load.py then runs, for each stream count, that many
concurrent streams of one request each: ~128-token prompts, 128 generated tokens
(`ignore_eos`), temperature 0. Each round starts each server afresh (qkv first in odd rounds,
llama-server first in even ones) and runs every stream count; the table has the medians over
rounds of aggregate generated tokens/s, p50/p99 time to first token and p50/p99 inter-token
latency, and qkv's ratio. llama-server is built by `--build` from the llama.cpp source that
tools/bench_vs_llamacpp.py unpacks (target llama-server).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import bench_vs_llamacpp as b  # noqa: E402


def log(msg):
    print(f"[server-bench] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, timeout=120):
    import urllib.request

    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit("server not ready")


def ensure_llama_server(lc: Path) -> Path:
    src = lc / f"llama_cpp_python-{b.LLAMA_CPP_PY_VERSION}" / "vendor" / "llama.cpp"
    exe = src / "build" / "bin" / "llama-server"
    if exe.is_file():
        return exe
    b.ensure_llamacpp(lc)
    cmake = b.shutil.which("cmake") or "cmake"
    log("building llama-server (cmake target llama-server)")
    b.run([cmake, "-S", src, "-B", src / "build", "-DLLAMA_BUILD_SERVER=ON",
           "-DLLAMA_BUILD_TOOLS=ON"], stdout=sys.stderr)
    b.run([cmake, "--build", src / "build", "--config", "Release", "-j2", "--target",
           "llama-server"], stdout=sys.stderr)
    return exe


def start(kind, exe, model, slots, port):
    if kind == "qkv":
        cmd = [exe, "--model", model, "--port", str(port), "--threads", "2", "--ctx", "512",
               "--max-sequences", str(slots), "--queue", str(4 * slots), "--model-name", "m"]
    else:
        cmd = [exe, "-m", model, "--port", str(port), "-t", "2", "-tb", "2",
               "-c", str(512 * slots), "-np", str(slots), "--alias", "m", "--no-webui"]
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_ready(port, proc)
    return proc


def load(port, streams):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/server_load.py"), "--base-url",
         f"http://127.0.0.1:{port}/v1", "--model", "m", "--streams", str(streams),
         "--prompt-tokens", "128", "--max-tokens", "128", "--json"],
        capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"load failed: {out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    cache = b.cache_dir()
    model = Path(args.model) if args.model else cache / b.SOURCE_GGUF
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "qkv-server"],
                   cwd=ROOT, check=True)
    exes = {"qkv": ROOT / "target/release/qkv-server",
            "llama": ensure_llama_server(cache / "llamacpp")}
    results = {(k, s): [] for k in exes for s in streams}
    for rnd in range(args.rounds):
        order = ["qkv", "llama"] if rnd % 2 == 0 else ["llama", "qkv"]
        for kind in order:
            port = free_port()
            proc = start(kind, exes[kind], model, max(streams), port)
            try:
                load(port, 1)  # warm-up
                for s in streams:
                    r = load(port, s)
                    results[(kind, s)].append(r)
                    log(f"round {rnd + 1} {kind} {s} streams: {r['tok_s']:.1f} tok/s, "
                        f"TTFT p50 {r['ttft_p50_ms']:.0f} ms, ITL p50 {r['itl_p50_ms']:.1f} ms")
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def med(kind, s, key):
        return statistics.median(r[key] for r in results[(kind, s)])

    print("| streams | llama-server tok/s | qkv tok/s | qkv / llama | TTFT p50/p99 ms llama | "
          "TTFT p50/p99 ms qkv | ITL p50/p99 ms llama | ITL p50/p99 ms qkv |")
    print("|---|---|---|---|---|---|---|---|")
    for s in streams:
        lq, ql = med("llama", s, "tok_s"), med("qkv", s, "tok_s")
        print(f"| {s} | {lq:.1f} | {ql:.1f} | {ql / lq:.2f}× | "
              f"{med('llama', s, 'ttft_p50_ms'):.0f} / {med('llama', s, 'ttft_p99_ms'):.0f} | "
              f"{med('qkv', s, 'ttft_p50_ms'):.0f} / {med('qkv', s, 'ttft_p99_ms'):.0f} | "
              f"{med('llama', s, 'itl_p50_ms'):.1f} / {med('llama', s, 'itl_p99_ms'):.1f} | "
              f"{med('qkv', s, 'itl_p50_ms'):.1f} / {med('qkv', s, 'itl_p99_ms'):.1f} |")


if __name__ == "__main__":
    main()
