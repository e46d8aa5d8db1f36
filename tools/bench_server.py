#!/usr/bin/env python3
"""qkv-server beside llama-server on the same GGUF, driven by the same load generator.

    python3 tools/bench_server.py [--streams 1,4,16,64] [--rounds 2] [--model GGUF]
                                  [--qkv-args "--step-tokens 128"] [--json-out FILE]
                                  [--only qkv|llama] [--no-build]
                                  [--spec off,ngram,draft [--model-draft GGUF] [--spec-max N]
                                   [--prompt-style open|copy]]

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

With `--spec`, qkv-server alone runs, once per listed setting in every round (the order
turning by one each round, so that none always runs first): `off` (no speculation), `ngram`
(`--spec ngram`: drafts looked up in each sequence's own text) and `draft` (`--model-draft
FILE --spec draft`: a second model of the vocabulary drafts). The table then gives, per stream
count and setting, the aggregate tokens/s and its ratio to the first setting (list `off`
first), the latencies, and the drafted and kept tokens the server's `/metrics` counted during
the run. `--prompt-style copy` asks the load generator for prompts that end by starting to
repeat their own text, which drafts can follow; `open` (the default) for plain continuations.

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


def spec_args(setting, model_draft, spec_max):
    """qkv-server's flags for a `--spec` setting."""
    extra = ["--spec-max", str(spec_max)] if spec_max else []
    if setting == "off":
        return ["--spec", "off"]
    if setting == "ngram":
        return ["--spec", "ngram", *extra]
    if setting == "draft":
        if not model_draft:
            sys.exit("--spec draft needs --model-draft FILE")
        return ["--model-draft", str(model_draft), "--spec", "draft", *extra]
    sys.exit(f"--spec {setting}: off, ngram or draft")


def start(kind, exe, model, slots, port, qkv_args=()):
    if kind.startswith("qkv"):
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


def spec_counters(port):
    """qkv-server's speculation counters (tokens drafted, of those kept) from `/metrics`, or
    zeros from a server that has none."""
    import urllib.request

    want = {"qkv_spec_draft_tokens_total": 0, "qkv_spec_accepted_tokens_total": 0}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in want:
                    want[name] = float(value)
    except OSError:
        pass
    return want["qkv_spec_draft_tokens_total"], want["qkv_spec_accepted_tokens_total"]


def load(port, streams, pid=None, retries=0, stats=None, max_other=float("inf"),
         style="open"):
    for attempt in range(retries + 1):
        first = NEXT_PROMPT[0]
        NEXT_PROMPT[0] += streams
        drafted0, kept0 = spec_counters(port)
        watch = Watch(pid) if pid else None
        out = subprocess.run(
            [sys.executable, str(ROOT / "tools/server_load.py"), "--base-url",
             f"http://127.0.0.1:{port}/v1", "--streams", str(streams),
             "--prompt-tokens", "128", "--max-tokens", "128", "--first-prompt", str(first),
             "--prompt-style", style, "--json"],
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
    drafted1, kept1 = spec_counters(port)
    r["drafted"], r["kept"] = drafted1 - drafted0, kept1 - kept0
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
    ap.add_argument("--spec", help="compare qkv-server's speculation settings instead of the "
                    "two servers: a comma list of off, ngram, draft (the first is the "
                    "baseline of the ratios)")
    ap.add_argument("--model-draft", type=Path, help="the draft model of --spec draft")
    ap.add_argument("--spec-max", type=int, help="most tokens per draft (qkv's --spec-max)")
    ap.add_argument("--prompt-style", choices=["open", "copy"], default="open",
                    help="plain continuations, or prompts that start repeating themselves")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    cache = b.cache_dir()
    model = Path(args.model) if args.model else cache / b.SOURCE_GGUF
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "qkv-server"],
                       cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    qkv_args = args.qkv_args.split()
    extra = {}
    if args.spec:
        settings = args.spec.split(",")
        extra = {f"qkv-{s}": spec_args(s, args.model_draft, args.spec_max) for s in settings}
        exes = {k: target / "release/qkv-server" for k in extra}
    else:
        exes = {"qkv": target / "release/qkv-server",
                "llama": ensure_llama_server(cache / "llamacpp")}
        if args.only:
            exes = {args.only: exes[args.only]}
    kinds = list(exes)
    stats = {"repeated": 0}
    results = {(k, s): [] for k in exes for s in streams}
    for rnd in range(args.rounds):
        # Each round starts with the next server (or setting), so none always runs first.
        order = kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]
        for kind in order:
            port = free_port()
            proc = start(kind, exes[kind], model, max(streams), port,
                         qkv_args + extra.get(kind, []))
            NEXT_PROMPT[0] = 0
            try:
                load(port, 1, style=args.prompt_style)  # warm-up
                for s in streams:
                    r = load(port, s, proc.pid, args.retries, stats, args.max_other,
                             args.prompt_style)
                    results[(kind, s)].append(r)
                    log(f"round {rnd + 1} {kind} {s} streams: {r['tok_s']:.1f} tok/s, "
                        f"TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms, "
                        f"ITL p50/p99 {r['itl_p50_ms']:.1f}/{r['itl_p99_ms']:.1f} ms"
                        + (f", drafted {r['drafted']:.0f} kept {r['kept']:.0f}"
                           if r["drafted"] else "")
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
    if args.spec:
        base = kinds[0]
        print(f"prompts: {args.prompt_style}; ratios against {base}; drafted and kept: "
              "medians per run")
        print("| streams | setting | tok/s | / " + base + " | TTFT p50 ms | ITL p50/p99 ms | "
              "drafted | kept | other cores |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in streams:
            for k in kinds:
                # The ratio of each round's pair, then their median: the runs of one round
                # met the same host.
                ratio = statistics.median(
                    r["tok_s"] / b0["tok_s"]
                    for r, b0 in zip(results[(k, s)], results[(base, s)]))
                print(f"| {s} | {k[4:]} | {med(k, s, 'tok_s'):.1f} | {ratio:.2f}× | "
                      f"{med(k, s, 'ttft_p50_ms'):.0f} | {med(k, s, 'itl_p50_ms'):.1f} / "
                      f"{med(k, s, 'itl_p99_ms'):.1f} | {med(k, s, 'drafted'):.0f} | "
                      f"{med(k, s, 'kept'):.0f} | {med(k, s, 'other_cores'):.2f} |")
        return
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
