#!/usr/bin/env python3
"""qkv-server beside llama-server on the same GGUF, driven by the same load generator.

    python3 tools/bench_server.py [--streams 1,4,16,64] [--rounds 2] [--model GGUF]
                                  [--qkv-args "--step-tokens 128"] [--json-out FILE]
                                  [--only qkv|llama] [--no-build]

Both servers load the same file (default: the default model, Q4_1) with 2 threads, 512
positions per sequence and as many parallel sequences as the largest stream count (llama-
server: `-c 512·N -np N`, its context split into N slots; qkv-server: `--ctx 512
--max-sequences N`). tools/server_load.py then runs, for each stream count, that many
concurrent streams of one request each: ~128-token prompts, 128 generated tokens
(`ignore_eos`), temperature 0. Each round starts each server afresh (qkv first in odd rounds,
llama-server first in even ones) and runs every stream count; the table has the medians over
rounds of aggregate generated tokens/s, p50/p99 time to first token and p50/p99 inter-token
latency, and qkv's ratio. llama-server is built (once, target llama-server) from the
llama.cpp source that tools/peers.py unpacks; qkv-server is built with
`cargo build --release` into $CARGO_TARGET_DIR (or target/) unless --no-build.

Neither server is given a model name: the load generator asks each one's `/v1/models`.

Paused runs are run again. This machine is shared, and other benchmarks stop niced
processes (SIGSTOP) while they run; a stopped server or load generator makes latencies
that say nothing about either server. A watcher thread samples every 50 ms the state of
the server (and its own clock); a load run during which the server was seen stopped, or
the watcher itself missed more than 0.5 s, is discarded and repeated (up to --retries
times), and the number of repeats is printed with the table. Each run also records the
CPU that other processes took meanwhile (`other_cores`: all busy CPU time on the machine
from /proc/stat, less the server's and the load generator's, over the wall time); a run
where they averaged more than --max-other cores is repeated too, and the table gives the
median of `other_cores` per row, so a reader sees how quiet the host was.
"""

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import peers as b  # noqa: E402


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
    return b.build_llamacpp(lc, ["llama-server"], b.SERVER_CMAKE) / "llama-server"


def start(kind, exe, model, slots, port, qkv_args=()):
    if kind == "qkv":
        cmd = [exe, "--model", model, "--port", str(port), "--threads", "2", "--ctx", "512",
               "--max-sequences", str(slots), "--queue", str(4 * slots), *qkv_args]
    else:
        cmd = [exe, "-m", model, "--port", str(port), "-t", "2", "-tb", "2",
               "-c", str(512 * slots), "-np", str(slots), "--no-webui"]
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_ready(port, proc)
    return proc


def busy_seconds():
    """CPU seconds the whole machine spent busy (not idle or waiting) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def process_seconds(pid):
    """CPU seconds process `pid` has used (user and system), or 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def children_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Watch:
    """Notices, while a load runs, whether the server was stopped or this process starved,
    and how much CPU the rest of the machine took."""

    def __init__(self, pid):
        self.pid, self.paused, self.done = pid, False, threading.Event()
        self.t0, self.busy0 = time.monotonic(), busy_seconds()
        self.own0 = process_seconds(pid) + children_seconds() + process_seconds(os.getpid())
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def other_cores(self):
        """Cores' worth of CPU that other processes used since the start."""
        own = process_seconds(self.pid) + children_seconds() + process_seconds(os.getpid())
        wall = time.monotonic() - self.t0
        return max(0.0, (busy_seconds() - self.busy0) - (own - self.own0)) / max(wall, 1e-9)

    def run(self):
        last = time.monotonic()
        while not self.done.wait(0.05):
            now = time.monotonic()
            if now - last > 0.5:
                self.paused = True
            last = now
            try:
                with open(f"/proc/{self.pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state in ("T", "t"):
                self.paused = True

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.paused


# The next unused slice of server_load.py's prompt text for the running server: every run,
# and every repeat of a run, takes fresh prompts, so none is served from the prefix cache of
# an earlier one. Reset at each server's start, so that both servers meet the same prompts.
NEXT_PROMPT = [0]


def load(port, streams, pid=None, retries=0, stats=None, max_other=float("inf")):
    for attempt in range(retries + 1):
        first = NEXT_PROMPT[0]
        NEXT_PROMPT[0] += streams
        watch = Watch(pid) if pid else None
        out = subprocess.run(
            [sys.executable, str(ROOT / "tools/server_load.py"), "--base-url",
             f"http://127.0.0.1:{port}/v1", "--streams", str(streams),
             "--prompt-tokens", "128", "--max-tokens", "128", "--first-prompt", str(first),
             "--json"],
            capture_output=True, text=True, timeout=1800)
        other = watch.other_cores() if watch else 0.0
        paused = watch.stop() if watch else False
        if out.returncode != 0:
            sys.exit(f"load failed: {out.stderr}")
        if not paused and other <= max_other:
            break
        if stats is not None:
            stats["repeated"] += 1
        why = "paused" if paused else f"other processes took {other:.2f} cores"
        log(f"{streams} streams: {why} during the run (attempt {attempt + 1}), "
            + ("running it again" if attempt < retries else "kept, marked"))
    r = json.loads(out.stdout)
    r["paused"] = paused
    r["other_cores"] = other
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model")
    ap.add_argument("--qkv-args", default="", help="extra qkv-server flags, split on spaces")
    ap.add_argument("--only", choices=["qkv", "llama"], help="run one server only")
    ap.add_argument("--retries", type=int, default=4, help="repeats of a paused load run")
    ap.add_argument("--max-other", type=float, default=0.5,
                    help="repeat a run where other processes averaged more cores than this")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    cache = b.cache_dir()
    model = Path(args.model) if args.model else cache / b.SOURCE_GGUF
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "qkv-server"],
                       cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    exes = {"qkv": target / "release/qkv-server",
            "llama": ensure_llama_server(cache / "llamacpp")}
    if args.only:
        exes = {args.only: exes[args.only]}
    qkv_args = args.qkv_args.split()
    stats = {"repeated": 0}
    results = {(k, s): [] for k in exes for s in streams}
    for rnd in range(args.rounds):
        order = [k for k in (["qkv", "llama"] if rnd % 2 == 0 else ["llama", "qkv"])
                 if k in exes]
        for kind in order:
            port = free_port()
            proc = start(kind, exes[kind], model, max(streams), port, qkv_args)
            NEXT_PROMPT[0] = 0
            try:
                load(port, 1)  # warm-up
                for s in streams:
                    r = load(port, s, proc.pid, args.retries, stats, args.max_other)
                    results[(kind, s)].append(r)
                    log(f"round {rnd + 1} {kind} {s} streams: {r['tok_s']:.1f} tok/s, "
                        f"TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms, "
                        f"ITL p50/p99 {r['itl_p50_ms']:.1f}/{r['itl_p99_ms']:.1f} ms"
                        + f", other processes {r['other_cores']:.2f} cores"
                        + (" (paused)" if r["paused"] else ""))
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def med(kind, s, key):
        return statistics.median(r[key] for r in results[(kind, s)])

    if args.json_out:
        args.json_out.write_text(json.dumps(
            dict(model=str(model), qkv_args=qkv_args, repeated=stats["repeated"],
                 runs=[dict(r, server=k) for (k, s), rs in results.items()
                       for r in rs]), indent=1))
    print(f"model {model.name}; medians of {args.rounds} rounds; runs repeated (paused or "
          f"busy host): {stats['repeated']}")
    if args.only:
        print("| streams | tok/s | TTFT p50/p99 ms | ITL p50/p99 ms | other cores |")
        print("|---|---|---|---|---|")
        k = args.only
        for s in streams:
            print(f"| {s} | {med(k, s, 'tok_s'):.1f} | {med(k, s, 'ttft_p50_ms'):.0f} / "
                  f"{med(k, s, 'ttft_p99_ms'):.0f} | {med(k, s, 'itl_p50_ms'):.1f} / "
                  f"{med(k, s, 'itl_p99_ms'):.1f} | {med(k, s, 'other_cores'):.2f} |")
        return

    print("| streams | llama-server tok/s | qkv tok/s | qkv / llama | TTFT p50/p99 ms llama | "
          "TTFT p50/p99 ms qkv | ITL p50/p99 ms llama | ITL p50/p99 ms qkv | "
          "other cores llama / qkv |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in streams:
        lq, ql = med("llama", s, "tok_s"), med("qkv", s, "tok_s")
        print(f"| {s} | {lq:.1f} | {ql:.1f} | {ql / lq:.2f}× | "
              f"{med('llama', s, 'ttft_p50_ms'):.0f} / {med('llama', s, 'ttft_p99_ms'):.0f} | "
              f"{med('qkv', s, 'ttft_p50_ms'):.0f} / {med('qkv', s, 'ttft_p99_ms'):.0f} | "
              f"{med('llama', s, 'itl_p50_ms'):.1f} / {med('llama', s, 'itl_p99_ms'):.1f} | "
              f"{med('qkv', s, 'itl_p50_ms'):.1f} / {med('qkv', s, 'itl_p99_ms'):.1f} | "
              f"{med('llama', s, 'other_cores'):.2f} / {med('qkv', s, 'other_cores'):.2f} |")


if __name__ == "__main__":
    main()
