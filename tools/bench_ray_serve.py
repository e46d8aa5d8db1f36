#!/usr/bin/env python3
"""Aggregate streaming tokens/s of qkv on Ray Serve against one qkv-server (issue 51's target:
2 replicas of 1 thread serving 16 concurrent streams at ≥ 0.9× one qkv-server with 2 threads).

    python3 tools/bench_ray_serve.py [--model FILE] [--streams 16] [--tokens 64] [--rounds 2]

Both serve the same GGUF; each round sends `--streams` concurrent streamed chat requests of
`--tokens` tokens (EOS ignored) and counts the tokens the usage chunks report over the wall
time. qkv-server comes from $CARGO_TARGET_DIR (or target/)/release/qkv-server. The load
average is printed: numbers taken above ~1 are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent


def wait_up(url: str, secs: float = 300) -> None:
    end = time.time() + secs
    while time.time() < end:
        try:
            if requests.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    sys.exit(f"{url} did not come up")


def load(url: str, streams: int, tokens: int) -> float:
    done: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        body = {
            "messages": [{"role": "user", "content": f"Write a story about the number {i}."}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
            r.raise_for_status()
            n = 0
            for line in r.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    c = json.loads(line[6:])
                    if c.get("usage"):
                        n = c["usage"]["completion_tokens"]
        with lock:
            done.append(n)

    t = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    return sum(done) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import qkv

    model = args.model or qkv.default_model_path()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {model}")
    server_bin = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release" / "qkv-server"
    srv = subprocess.Popen(
        [str(server_bin), "--model", model, "--threads", "2", "--port", "8081", "--ctx", "512", "--max-sequences", str(args.streams)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_up("http://127.0.0.1:8081")
        load("http://127.0.0.1:8081", 2, 4)
        server = [load("http://127.0.0.1:8081", args.streams, args.tokens) for _ in range(args.rounds)]
    finally:
        srv.terminate()
        srv.wait()

    import ray
    from ray import serve

    import qkv.serve

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 8000})
        app = qkv.serve.build_app(
            {"model_path": model, "num_replicas": 2, "n_threads": 1, "n_ctx": 512, "max_sequences": args.streams, "num_cpus": 1}
        )
        serve.run(app, name="qkv", route_prefix="/", blocking=False)
        wait_up("http://127.0.0.1:8000")
        load("http://127.0.0.1:8000", 2, 4)
        rays = [load("http://127.0.0.1:8000", args.streams, args.tokens) for _ in range(args.rounds)]
    finally:
        serve.shutdown()
        ray.shutdown()
    s, r = max(server), max(rays)
    print(f"{args.streams} streams x {args.tokens} tokens: qkv-server (2 threads) {s:.1f} tok/s | Ray Serve (2 replicas x 1 thread) {r:.1f} tok/s | ratio {r / s:.2f} (target >= 0.9)")
    print(f"  rounds: server {['%.1f' % x for x in server]} ray {['%.1f' % x for x in rays]}; load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
