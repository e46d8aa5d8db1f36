#!/usr/bin/env python3
"""Aggregate streaming tokens/s of qkv on Ray Serve against one qkv-server (issue 51's target:
2 replicas of 1 thread serving 16 concurrent streams at ≥ 0.9× one qkv-server with 2 threads,
and a replica killed mid-load with nothing lost).

    python3 tools/bench_ray_serve.py [--model FILE] [--streams 16] [--tokens 64] [--rounds 2]
        [--kill-requests 48]

Both serve the same GGUF. A round sends `--streams` concurrent streamed chat requests of
`--tokens` tokens (EOS ignored) and divides the tokens the usage chunks report by the wall
time; every stream must end with `[DONE]` and all its tokens, or the round is reported as
failed (a lost stream is never counted as a slow one). qkv-server (2 threads) comes from
$CARGO_TARGET_DIR (or target/)/release/qkv-server; the Ray Serve deployment is
`qkv.serve.build_app` with 2 replicas of 1 thread (one CPU each), measured once both
replicas run.

Then the kill round: `--kill-requests` streamed requests over `--streams` clients, one
replica killed with `ray.kill` once the load is under way. A client retries what a dying
replica costs it (a 503, a dropped connection, a stream cut before `[DONE]`); every request
must complete, and the tokens/s of that round (retries included) are printed beside the
retries.

The load average is printed: numbers taken above ~1 are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
SERVER_PORT = 8081
SERVE_PORT = 8000


class Retry(Exception):
    """A failure a client retries: a 503, a lost connection, a stream cut short."""


def wait_up(url: str, secs: float = 300) -> None:
    end = time.time() + secs
    while time.time() < end:
        try:
            if requests.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    sys.exit(f"{url} did not come up in {secs:.0f} s")


def stream(url: str, i: int, tokens: int) -> int:
    """One streamed chat request; the completion tokens its usage chunk reports. Raises
    Retry for what a client should retry."""
    body = {
        "messages": [{"role": "user", "content": f"Write a story about the number {i}."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        r = requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600)
    except requests.RequestException as e:
        raise Retry(f"connect: {e}")
    with r:
        if r.status_code in (429, 500, 502, 503, 504):
            raise Retry(f"status {r.status_code}: {r.text[:200]}")
        r.raise_for_status()
        n, done = None, False
        try:
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    done = True
                    break
                c = json.loads(line[6:])
                if "error" in c:
                    raise Retry(f"error chunk: {c['error']}")
                if c.get("usage"):
                    n = c["usage"]["completion_tokens"]
        except (requests.RequestException, ValueError) as e:
            raise Retry(f"stream broke: {e}")
    if not done or n is None:
        raise Retry("stream ended before [DONE] or without usage")
    return n


def load(url: str, streams: int, tokens: int) -> tuple[float, list[str]]:
    """One round of `streams` concurrent streams: (tokens/s, what went wrong)."""
    got: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            n = stream(url, i, tokens)
            problem = None if n == tokens else f"stream {i}: {n} tokens of {tokens}"
        except Exception as e:  # noqa: BLE001 - every failure is reported, none retried here
            n, problem = 0, f"stream {i}: {type(e).__name__}: {e}"
        with lock:
            got.append(n)
            if problem:
                errors.append(problem)

    t = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    return sum(got) / (time.perf_counter() - t), errors


def rounds(url: str, args) -> list[float]:
    load(url, 2, 4)  # warm-up
    rates = []
    for k in range(args.rounds):
        rate, errors = load(url, args.streams, args.tokens)
        if errors:
            sys.exit(f"{url}: round {k} lost streams: {errors[:5]}")
        rates.append(rate)
    return rates


def replica_actors(ray) -> list[dict]:
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]


def running_replicas(serve) -> int:
    try:
        app = serve.status().applications["qkv"]
    except (KeyError, AttributeError):
        return 0
    return sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())


def wait_replicas(serve, n: int, secs: float = 300) -> None:
    end = time.time() + secs
    while running_replicas(serve) < n:
        if time.time() > end:
            sys.exit(f"Ray Serve did not get {n} replicas running in {secs:.0f} s")
        time.sleep(1)


def kill_round(ray, url: str, args) -> None:
    """`--kill-requests` requests over `--streams` clients with one replica killed mid-load:
    every request must complete (retrying what the kill costs)."""
    todo = list(range(args.kill_requests))
    done: dict[int, int] = {}
    retries: list[str] = []
    failed: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            for attempt in range(8):
                try:
                    n = stream(url, i, args.tokens)
                    with lock:
                        done[i] = n
                    break
                except Retry as e:
                    with lock:
                        retries.append(f"request {i} attempt {attempt}: {e}")
                    time.sleep(0.5 * (attempt + 1))
                except Exception as e:  # noqa: BLE001 - reported, not retried
                    with lock:
                        failed.append(f"request {i}: {type(e).__name__}: {e}")
                    break

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.streams)]
    for t in threads:
        t.start()
    # Kill once the first requests have completed: the next ones are then mid-stream on both
    # replicas.
    while len(done) == 0 and time.perf_counter() - t0 < 60 and any(t.is_alive() for t in threads):
        time.sleep(0.2)
    actors = replica_actors(ray)
    killed = None
    if len(actors) == 2:
        victim = ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"])
        ray.kill(victim, no_restart=True)
        killed = time.perf_counter() - t0
    for t in threads:
        t.join(timeout=1800)
    secs = time.perf_counter() - t0
    tokens = sum(done.values())
    lost = sorted(set(range(args.kill_requests)) - set(done))
    short = [i for i, n in done.items() if n != args.tokens]
    when = f"killed at {killed:.1f} s" if killed is not None else f"NOT killed ({len(actors)} replicas seen)"
    print(f"kill round: {len(done)}/{args.kill_requests} requests completed in {secs:.1f} s, one replica "
          f"{when}; {len(retries)} retries; {tokens / secs:.1f} tok/s with the retries")
    for r in retries[:6]:
        print("  retry:", r)
    if lost or short or failed or killed is None:
        sys.exit(f"the kill round lost work: lost {lost[:10]}, short {short[:10]}, failed {failed[:5]}")
    print("  nothing lost: every request completed with all its tokens")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kill-requests", type=int, default=48)
    args = ap.parse_args()
    import qkv

    model = args.model or qkv.default_model_path()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {model}", flush=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    server_bin = target / "release" / "qkv-server"
    if not server_bin.is_file():
        sys.exit(f"no {server_bin}: cargo build --release -p qkv-server")
    srv = subprocess.Popen(
        [str(server_bin), "--model", model, "--threads", "2", "--port", str(SERVER_PORT), "--ctx", "512",
         "--max-sequences", str(args.streams)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{SERVER_PORT}"
    try:
        wait_up(url)
        server = rounds(url, args)
    finally:
        srv.terminate()
        srv.wait()
    print(f"qkv-server (2 threads): rounds {['%.1f' % x for x in server]} tok/s", flush=True)

    import ray
    from ray import serve

    import qkv.serve

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    url = f"http://127.0.0.1:{SERVE_PORT}"
    try:
        # Serve's HTTP proxy must come up within Ray's fixed 60 s; on a loaded machine the
        # first worker processes may take longer to start, so try again.
        for attempt in range(3):
            try:
                serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT})
                break
            except (ray.exceptions.RayError, TimeoutError) as e:
                print(f"serve.start, attempt {attempt}: {type(e).__name__}")
                serve.shutdown()
                time.sleep(5)
        app = qkv.serve.build_app(
            {"model_path": model, "num_replicas": 2, "n_threads": 1, "n_ctx": 512,
             "max_sequences": args.streams, "num_cpus": 1}
        )
        serve.run(app, name="qkv", route_prefix="/", blocking=False)
        wait_up(url)
        wait_replicas(serve, 2)
        rays = rounds(url, args)
        print(f"Ray Serve (2 replicas x 1 thread): rounds {['%.1f' % x for x in rays]} tok/s", flush=True)
        kill_round(ray, url, args)
    finally:
        serve.shutdown()
        ray.shutdown()
    s, r = statistics.median(server), statistics.median(rays)
    print(f"{args.streams} streams x {args.tokens} tokens (median of {args.rounds} rounds): qkv-server "
          f"(2 threads) {s:.1f} tok/s | Ray Serve (2 replicas x 1 thread) {r:.1f} tok/s | ratio "
          f"{r / s:.2f} (target >= 0.9)")
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
