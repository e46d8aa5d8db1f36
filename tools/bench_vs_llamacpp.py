#!/usr/bin/env python3
"""Side-by-side: qkv's `decode --json` against llama.cpp's `llama-bench`, same machine, same model.

    python3 tools/bench_vs_llamacpp.py [--reps 3] [--rows 1b,8b,tg128_f16,...] [--threads 2]

What it does, idempotently (everything cached under $QKV_CACHE/llamacpp; QKV_CACHE defaults as in
fetch/src/lib.rs: $QKV_CACHE, else $XDG_CACHE_HOME/qkv, else ~/.cache/qkv):

1. llama.cpp: `pip download` the sdist of llama-cpp-python 0.3.36 (only that package from source,
   so pip does not also compile cmake from source), untar it, and build the vendored llama.cpp with
   cmake (Release, -DGGML_NATIVE=ON, targets llama-bench and llama-quantize, -j2).
2. qkv: `cargo build --release --bin decode` (honours CARGO_TARGET_DIR); the binary is copied
   to the cache so that rebuilds by others during the run do not change what is measured.
3. Models: the Q4_1 source GGUF of SmolLM2-135M-Instruct (fetched by qkv itself on first use),
   converted with `llama-quantize --allow-requantize … F16` and `… F32`. Both engines read the
   same converted files.
4. Prompts with an exact token count (checked with qkv's tokenizer via `decode --json -n 0`).
5. For each row, alternate llama-bench and qkv `--reps` times; print both medians, the spread,
   the ratio qkv/llama.cpp, and a markdown table with the exact commands. Just before every
   engine run, `kernels/examples/roofline.rs` measures the machine's two ceilings (the read
   bandwidth over the model's 269 MB of f16 weights, and the FMA peak); each run is compared
   with its own probe, since the host's bandwidth moves by tens of percent within a minute. Both engines are
   measured warm: llama-bench makes a warm-up run before its repetitions, and `decode
   --warmup` runs the prompt once untimed and starts over (without it, a fresh process's
   first 512-token prefill also pays first touches of the weights and buffers, ~10% here).

With `--ik`, ik_llama.cpp is a second peer: built once from $QKV_IK_LLAMA_SRC (a clone of it)
into the cache, its llama-bench run with run-time repacking off and on (`-rtr 0`, `-rtr 1`) on
every row without depth, alternated with the others; the table shows each peer at its best
setting.

Ceilings, from each file's own header (`Shape`, with gguf-py; SmolLM2-135M: 30 layers, 9
query and 3 KV heads of 64, FFN 1536, vocab 49152):

- decode rows: read bandwidth / bytes per token = the file's 2-D tensors as stored (269 MB
  in f16, twice that in f32, the blocks' bytes for a quantized file; a tied embedding counts
  once, as the output head it doubles as) plus an f16 KV cache at the row's mean context
  (23040 bytes per position for SmolLM2). Each decode step must read all of them once.
- prefill rows: FMA peak / FLOPs per token = 2 x the layers' matmul multiply-adds (106.2 M
  for SmolLM2) plus 4 x head size x heads x layers FLOPs per visible key (the LM head runs
  for the last position only).

The rows at real sizes (`--rows 1b`, `--rows 8b`) run random-weight files at the layer
shapes of Llama 3.2 1B and Llama 3.1 8B with the default model's vocabulary, made on first
use by tools/real_shapes.py (a few minutes for 1B; the 8B source is 15 GB and takes about
half an hour): tg128 and pp512 on 1B in Q4_0, Q4_K_M, Q3_K_M, IQ4_XS, Q8_0, F16 and BF16
(qkv runs BF16 as stored, widening in registers), tg32 and pp128 on 8B in Q4_0, Q4_K_M, Q3_K_M
and IQ4_XS, and tg64 after 4096 tokens on 1B Q4_K_M (flash attention off and on for
llama.cpp). The probe's own buffer is SmolLM2's f16 weights (269 MB), already far larger
than the caches.

Rows and what each engine measures (the quantized rows, `*_q4_1` for the published file and
`*_q8_0`, `*_q4_k_m` for files made by `llama-quantize` from the F32 one, run tg128, pp512 and
tg64 @ d2048 as the f16 rows do, on the file's own blocks in both engines; their decode
ceiling counts the file's matrix bytes instead of the f16 weights, and an f16 KV cache):

- tg128_f16, tg128_f32: llama-bench `-p 0 -n 128`; qkv: a 4-token prompt, `-n 128`,
  generated_tokens_per_s (greedy, sampling + detokenisation included: ~1 step per token).
- tg64_d2048_f16 (flash attention off and on for llama.cpp): llama-bench `-p 0 -n 64 -d 2048`;
  qkv: a 2048-token prompt then `-n 64`, generated_tokens_per_s (exactly tg64 at depth 2048).
- pp512_f16: llama-bench `-p 512 -n 0`; qkv: a 512-token prompt, prompt_tokens_per_s.
- pp512_d2048_f16: llama-bench `-p 512 -n 0 -d 2048`; qkv: `decode --depth 2048` (2048 context
  tokens prefilled untimed) then the 512-token prompt, prompt_tokens_per_s. `--pp-depth bench`
  takes qkv's figure from the Criterion bench `e2e/f16/pp512_d2048` instead (benches/e2e.rs:
  2048 tokens cached once, then truncate(2048) + prefill(512) per iteration; its median; the
  binary is built once and copied to the cache like `decode`).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_shapes  # noqa: E402
from peers import (REPO, cache_dir, ensure_ik_llamacpp, ensure_llamacpp,  # noqa: E402
                   ensure_models, ensure_qkv, llama_bench, log, make_prompt, qkv_decode, run,
                   spread)


def ensure_e2e_bench(lc: Path):
    log("building qkv's e2e bench: cargo bench --bench e2e --no-run")
    res = subprocess.run(["cargo", "bench", "--bench", "e2e", "--no-run", "--message-format=json"],
                         cwd=REPO, check=True, capture_output=True, text=True)
    exe = None
    for line in res.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("target", {}).get("name") == "e2e" and msg.get("executable"):
            exe = msg["executable"]
    if exe is None:
        sys.exit("cargo bench --no-run gave no e2e executable")
    snap = lc / "qkv-e2e-bench"
    shutil.copy2(exe, snap)
    log(f"e2e bench: {exe}, copied to {snap}")
    return snap


def qkv_criterion(bench: Path, lc: Path, name: str, threads: int):
    """Runs one function of benches/e2e.rs; returns (median seconds, command)."""
    home = lc / "criterion"
    # Criterion keeps its results between runs: clear this bench's, so that a filter that
    # matched nothing fails below instead of reporting an earlier run's median.
    out = home / "e2e" / name.replace("/", "_")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [bench, "--bench", "--noplot", f"^e2e/{name}$"]
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                   env={**os.environ, "CRITERION_HOME": str(home),
                        "RAYON_NUM_THREADS": str(threads)})
    est_file = out / "new" / "estimates.json"
    if not est_file.is_file():
        sys.exit(f"criterion ran no bench matching e2e/{name}")
    est = json.loads(est_file.read_text())
    return est["median"]["point_estimate"] * 1e-9, \
        f"RAYON_NUM_THREADS={threads} CRITERION_HOME={home} " + " ".join(map(str, cmd))


def ensure_roofline(lc: Path):
    log("building the roofline probe: cargo build --release -p qkv-kernels --example roofline")
    run(["cargo", "build", "--release", "-p", "qkv-kernels", "--example", "roofline"], cwd=REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    snap = lc / "qkv-roofline"
    shutil.copy2(target / "release" / "examples" / "roofline", snap)
    return snap


def roofline(exe: Path, threads: int):
    """One sample of the machine's ceilings (see kernels/examples/roofline.rs)."""
    res = subprocess.run([str(exe), "5"], check=True, capture_output=True, text=True,
                         env={**os.environ, "RAYON_NUM_THREADS": str(threads)})
    return json.loads(res.stdout.strip().splitlines()[-1])


class Shape:
    """A decoder's per-token work, read from its GGUF header with gguf-py: the bytes a decode
    step streams (every 2-D tensor once; a tied embedding doubles as the output head and is
    read once), the KV cache's bytes per position in f16, and the FLOPs of a prompt token."""

    def __init__(self, model: Path):
        import gguf

        r = gguf.GGUFReader(str(model))
        arch = r.fields["general.architecture"].contents()

        def key(name):
            return int(r.fields[f"{arch}.{name}"].contents())

        self.layers, self.d = key("block_count"), key("embedding_length")
        self.heads, self.kv_heads = key("attention.head_count"), key("attention.head_count_kv")
        self.ff = key("feed_forward_length")
        self.head_dim = self.d // self.heads
        self.matrix_bytes = sum(int(t.n_bytes) for t in r.tensors if len(t.shape) == 2)
        self.kv_bytes_per_pos = 2 * self.layers * self.kv_heads * self.head_dim * 2
        kvd = self.kv_heads * self.head_dim
        per_layer = self.d * (self.heads * self.head_dim + 2 * kvd) \
            + self.heads * self.head_dim * self.d + 3 * self.d * self.ff
        # The LM head runs for the last position only, so a prompt token does not pay it.
        self.matmul_flops = 2 * self.layers * per_layer
        self.attn_flops_per_key = 4 * self.head_dim * self.heads * self.layers


def decode_ceiling(shape: Shape, mean_context: float):
    """tokens/s if a step did nothing but read its weights (the file's matrices, as stored)
    and its f16 KV cache at the mean context, at the probe's read_gbs."""
    def f(r):
        per_token = shape.matrix_bytes + shape.kv_bytes_per_pos * mean_context
        return r["read_gbs"] * 1e9 / per_token, f"read {r['read_gbs']:.1f} GB/s"
    return f


def prefill_ceiling(shape: Shape, mean_keys: float):
    """tokens/s if a prompt pass ran every FLOP at fma_gflops."""
    def f(r):
        per_token = shape.matmul_flops + shape.attn_flops_per_key * mean_keys
        return r["fma_gflops"] * 1e9 / per_token, f"FMA {r['fma_gflops']:.0f} GFLOP/s"
    return f


# ---------------------------------------------------------------- rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="alternations per row (default 3)")
    ap.add_argument("--bench-reps", type=int, default=3, help="llama-bench -r per invocation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="all",
                    help="comma list of rows or groups: 135m (SmolLM2: tg128_f16, tg128_f32, "
                         "tg64_d2048_f16, pp512_f16, pp512_d2048_f16, and tg128_K, pp512_K, "
                         "tg64_d2048_K for K in q4_1, q8_0, q4_k_m), 1b (tg128_1b_K, pp512_1b_K "
                         "for K in q4_0, q4_k_m, q3_k_m, iq4_xs, q8_0, f16, bf16; "
                         "tg64_d4096_1b_q4_k_m), 8b (tg32_8b_K, pp128_8b_K for K in q4_0, "
                         "q4_k_m, q3_k_m, iq4_xs); default all")
    ap.add_argument("--pp-depth", choices=["decode", "bench"], default="decode",
                    help="how qkv's pp512 @ d2048 is measured (see above)")
    ap.add_argument("--ik", action="store_true",
                    help="also run ik_llama.cpp's llama-bench (-rtr 0 and 1) on the rows without "
                         "depth; its source comes from $QKV_IK_LLAMA_SRC (see tools/peers.py)")
    ap.add_argument("--act-bits", choices=["8", "16"],
                    help="qkv's activation precision for quantized weights (default: qkv's own "
                         "default, 8; 16 is its exact mode)")
    ap.add_argument("--json-out", type=Path, help="write all samples here")
    args = ap.parse_args()

    cache = cache_dir()
    lc = cache / "llamacpp"
    log(f"cache: {lc}")
    bench, quant = ensure_llamacpp(lc)
    qkv, rev = ensure_qkv(lc)
    models = ensure_models(lc, cache, quant, qkv, ("F16", "F32", "Q8_0", "Q4_K_M"))
    e2e = ensure_e2e_bench(lc) if args.pp_depth == "bench" else None
    probe = ensure_roofline(lc)
    ik_bench = ensure_ik_llamacpp(cache) if args.ik else None
    qkv_flags = ("--act-bits", args.act_bits) if args.act_bits else ()
    t = args.threads
    br = args.bench_reps

    short = lc / "prompts" / "short.txt"
    short.parent.mkdir(parents=True, exist_ok=True)
    short.write_text("Once upon a time")
    prompts = {}

    def prompt(n_tokens):
        """A prompt of exactly n_tokens tokens, made on first use (the shapes' files share
        the default model's vocabulary, so one prompt serves every row)."""
        if n_tokens not in prompts:
            prompts[n_tokens] = make_prompt(lc, qkv, models["f16"], n_tokens)
        return prompts[n_tokens]

    def checked(s, prompt_tokens, generated):
        """The shape a run measured must be the row's: cached prompt files predate any
        tokenizer change, and --ignore-eos must have held."""
        got = (s["prompt_tokens"], s["generated_tokens"])
        if (prompt_tokens is not None and got[0] != prompt_tokens) or got[1] != generated:
            sys.exit(f"qkv ran {got[0]} prompt and {got[1]} generated tokens, "
                     f"the row needs {prompt_tokens} and {generated}")
        return s

    def qkv_gen(model, dtype, prompt_tokens, n, ctx):
        """Decode of n tokens after a prompt of prompt_tokens (None: the 4-token `short`)."""
        def f():
            p = short if prompt_tokens is None else prompt(prompt_tokens)
            s, cmd = qkv_decode(qkv, model(), dtype, t, p, n, ctx, extra=qkv_flags)
            return checked(s, prompt_tokens, n)["generated_tokens_per_s"], cmd
        return f

    def qkv_prompt(model, n_tokens, ctx, depth=0, dtype="f16"):
        def f():
            s, cmd = qkv_decode(qkv, model(), dtype, t, prompt(n_tokens), 0, ctx, depth,
                                extra=qkv_flags)
            return checked(s, n_tokens, 0)["prompt_tokens_per_s"], cmd
        return f

    def qkv_pp_at_depth_bench():
        secs, cmd = qkv_criterion(e2e, lc, "f16/pp512_d2048", t)
        return 512 / secs, cmd

    def lc_run(model, p, n, d=0, fa=None, exe=None, extra=()):
        def f():
            ts, _, cmd = llama_bench(exe or bench, model(), t, p, n, d, fa, br, extra)
            return ts, cmd
        return f

    def plain(model, p, n):
        """The peers of a row without depth: mainline llama.cpp, and with --ik ik_llama.cpp
        with run-time repacking off and on (its best setting differs by format and shape).
        ik's llama-bench has no `-d`, so the rows at depth compare with mainline only."""
        peers = [("llama.cpp", lc_run(model, p, n))]
        if ik_bench:
            peers += [(f"ik_llama.cpp -rtr {r}", lc_run(model, p, n, exe=ik_bench,
                                                        extra=("-rtr", r)))
                      for r in (0, 1)]
        return peers

    shapes = {}

    def shape_of(model):
        """The Shape of a model (read once, when its first ceiling is probed)."""
        def f():
            path = model()
            if path not in shapes:
                shapes[path] = Shape(path)
            return shapes[path]
        return f

    def decode_at(model, mean_context):
        return lambda r: decode_ceiling(shape_of(model)(), mean_context)(r)

    def prefill_at(model, mean_keys):
        return lambda r: prefill_ceiling(shape_of(model)(), mean_keys)(r)

    def small(kind):
        return lambda: models[kind]

    f16, f32 = small("f16"), small("f32")
    # name, label, target, [(peer label, peer fn)], qkv fn, ceiling fn
    rows = [
        ("tg128_f16", "decode tg128, f16", "≥ 1.25×",
         plain(f16, 0, 128),
         qkv_gen(f16, "f16", None, 128, 256), decode_at(f16, 64)),
        ("tg128_f32", "decode tg128, f32", "≥ 1.0×",
         plain(f32, 0, 128),
         qkv_gen(f32, "f32", None, 128, 256), decode_at(f32, 64)),
        ("tg64_d2048_f16", "decode tg64 @ d2048, f16", "≥ 1.6× better of fa off/on",
         [("llama.cpp fa off", lc_run(f16, 0, 64, 2048, "off")),
          ("llama.cpp fa on", lc_run(f16, 0, 64, 2048, "on"))],
         qkv_gen(f16, "f16", 2048, 64, 2048 + 64), decode_at(f16, 2048 + 32)),
        ("pp512_f16", "prefill pp512, f16", "≥ 1.2×",
         plain(f16, 512, 0),
         qkv_prompt(f16, 512, 512), prefill_at(f16, 256.5)),
        ("pp512_d2048_f16", "prefill pp512 @ d2048, f16", "≥ 1.3×",
         [("llama.cpp", lc_run(f16, 512, 0, 2048))],
         qkv_pp_at_depth_bench if args.pp_depth == "bench"
         else qkv_prompt(f16, 512, 2048 + 512, 2048), prefill_at(f16, 2048 + 256.5)),
    ]
    # The quantized files, each run on its own blocks by both engines.
    for kind, label, tg_target in (("q4_1", "Q4_1", "≥ 1.5×"), ("q8_0", "Q8_0", "≥ 1.5×"),
                                   ("q4_k_m", "Q4_K_M", "≥ 1.3×")):
        m = small(kind)
        rows += [
            (f"tg128_{kind}", f"decode tg128, {label}", tg_target,
             plain(m, 0, 128),
             qkv_gen(m, None, None, 128, 256), decode_at(m, 64)),
            (f"pp512_{kind}", f"prefill pp512, {label}", "≥ 1.3×",
             plain(m, 512, 0),
             qkv_prompt(m, 512, 512, dtype=None), prefill_at(m, 256.5)),
            (f"tg64_d2048_{kind}", f"decode tg64 @ d2048, {label}", "—",
             [("llama.cpp fa off", lc_run(m, 0, 64, 2048, "off")),
              ("llama.cpp fa on", lc_run(m, 0, 64, 2048, "on"))],
             qkv_gen(m, None, 2048, 64, 2048 + 64), decode_at(m, 2048 + 32)),
        ]
    # Random weights at the layer shapes of Llama 3.2 1B and Llama 3.1 8B
    # (tools/real_shapes.py, made on first use), on their own blocks (F16 as stored).

    def shaped(size, ty):
        return lambda: real_shapes.ensure(size, [ty])[ty]

    # Issue 48's bars for the formats people download most: mainline / ik_llama.cpp.
    downloaded = ("q4_0", "q4_k_m", "q3_k_m", "iq4_xs")
    for size, tg, pp, kinds in (("1b", 128, 512, (*downloaded, "q8_0", "f16", "bf16")),
                                ("8b", 32, 128, downloaded)):
        for kind in kinds:
            m = shaped(size, kind.upper())
            label = f"{size.upper()} {kind.upper()}"
            dtype = "f16" if kind == "f16" else None
            if kind in downloaded:
                tg_target, pp_target = "≥ 1.3× / ≥ 1.15× ik", "≥ 1.6× / ≥ 1.3× ik"
            else:
                pp_target = "≥ 1.15×" if kind in ("f16", "bf16") else "≥ 1.3×"
                tg_target = "≥ 1.0×" if kind == "bf16" else "≥ 1.15×"
            rows += [
                (f"tg{tg}_{size}_{kind}", f"decode tg{tg}, {label}", tg_target,
                 plain(m, 0, tg),
                 qkv_gen(m, dtype, None, tg, 256), decode_at(m, 4 + tg / 2)),
                (f"pp{pp}_{size}_{kind}", f"prefill pp{pp}, {label}", pp_target,
                 plain(m, pp, 0),
                 qkv_prompt(m, pp, pp, dtype=dtype), prefill_at(m, pp / 2 + 0.5)),
            ]
    m = shaped("1b", "Q4_K_M")
    rows.append(("tg64_d4096_1b_q4_k_m", "decode tg64 @ d4096, 1B Q4_K_M", "≥ 1.2×",
                 [("llama.cpp fa off", lc_run(m, 0, 64, 4096, "off")),
                  ("llama.cpp fa on", lc_run(m, 0, 64, 4096, "on"))],
                 qkv_gen(m, None, 4096, 64, 4096 + 64), decode_at(m, 4096 + 32)))

    def group(name):
        return "8b" if "_8b_" in name else "1b" if "_1b_" in name else "135m"

    if args.rows == "all":
        wanted = {r[0] for r in rows}
    else:
        asked = set(args.rows.split(","))
        wanted = {r[0] for r in rows if r[0] in asked or group(r[0]) in asked}
        unknown = asked - {r[0] for r in rows} - {"135m", "1b", "8b"}
        if unknown:
            sys.exit(f"unknown rows: {', '.join(sorted(unknown))}; the rows are "
                     f"{', '.join(r[0] for r in rows)}, or the groups 135m, 1b, 8b")
    results = []
    for name, label, target, peers, qkv_fn, ceiling_fn in rows:
        if name not in wanted:
            continue
        # Other work on the machine hurts llama.cpp far more (its threads spin at barriers):
        # a third busy process can cut its decode speed several-fold. Check the load.
        load = os.getloadavg()[0]
        log(f"row {name}: {args.reps} alternations (load average {load:.2f}"
            f"{'; the machine is busy, figures are unreliable' if load > 2.5 else ''})")
        peer_samples = {p: [] for p, _ in peers}
        peer_cmds, qkv_samples, qkv_cmd = {}, [], None
        # Every engine run is paired with a ceiling probed just before it: the host's
        # bandwidth moves by tens of percent within a minute, so only paired ratios mean much.
        ceilings, qkv_share, peer_share = [], [], {p: [] for p, _ in peers}

        def probe_now(i):
            ceiling, bound = ceiling_fn(roofline(probe, t))
            ceilings.append(ceiling)
            log(f"  {name} #{i + 1} ceiling: {ceiling:.1f} tok/s ({bound})")
            return ceiling

        for i in range(args.reps):
            # Alternate which engine goes first, to spread slow drifts evenly.
            order = ["peer", "qkv"] if i % 2 == 0 else ["qkv", "peer"]
            for who in order:
                if who == "peer":
                    for p, fn in peers:
                        c = probe_now(i)
                        ts, peer_cmds[p] = fn()
                        peer_samples[p].append(ts)
                        peer_share[p].append(ts / c)
                        log(f"  {name} #{i + 1} {p}: {ts:.1f} tok/s")
                else:
                    c = probe_now(i)
                    ts, qkv_cmd = qkv_fn()
                    qkv_samples.append(ts)
                    qkv_share.append(ts / c)
                    log(f"  {name} #{i + 1} qkv: {ts:.1f} tok/s")
        q = statistics.median(qkv_samples)

        def best_of(family):
            """The peer of a family (mainline's labels start "llama.cpp", ik's "ik_") with the
            highest median: flash attention off or on, run-time repacking off or on."""
            mine = [p for p in peer_samples if p.startswith(family)]
            return max(mine, key=lambda p: statistics.median(peer_samples[p]), default=None)

        best_peer, best_ik = best_of("llama.cpp"), best_of("ik_")
        for p, xs in peer_samples.items():
            m = statistics.median(xs)
            log(f"  {name}: {p} median {m:.1f} ({spread(xs)}); qkv median {q:.1f} "
                f"({spread(qkv_samples)}); ratio qkv/{p} {q / m:.2f}")
        c = statistics.median(ceilings)
        log(f"  {name}: ceiling median {c:.1f} ({spread(ceilings)}); qkv at "
            f"{statistics.median(qkv_share):.0%} of its paired ceiling, {best_peer} at "
            f"{statistics.median(peer_share[best_peer]):.0%}")
        results.append(dict(name=name, label=label, target=target, peers=peer_samples,
                            peer_cmds=peer_cmds, qkv=qkv_samples, qkv_cmd=qkv_cmd,
                            best_peer=best_peer, best_ik=best_ik, ceiling=ceilings,
                            qkv_share=qkv_share, peer_share=peer_share))

    print()
    print(f"qkv git {rev}; {t} threads; {args.reps} alternations per row; llama-bench -r {br} "
          f"per invocation (its avg_ts is one sample); medians, spread = min–max over alternations")
    print()
    print("The ceiling is what no engine could beat in the minute it was probed (see the "
          "docstring), probed just before every engine run; the shares are medians of each run "
          "against its own probe, and the last column (1 / llama.cpp's share) is the most any "
          "engine could have reached against llama.cpp. Each peer's column shows its best "
          "setting (flash attention off/on, ik's run-time repacking -rtr 0/1), named after it.")
    print()
    print("| test | llama.cpp tok/s | ik_llama.cpp tok/s | qkv tok/s | qkv / llama.cpp | "
          "qkv / ik_llama.cpp | target | ceiling tok/s | qkv / ceiling | llama.cpp / ceiling | "
          "ceiling / llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def cell(r, peer):
        """A peer's median with its spread and the setting that gave it ('—' when not run)."""
        if peer is None:
            return "—"
        xs = r["peers"][peer]
        tag = peer.replace("llama.cpp", "").replace("ik_", "").strip()
        return f"{statistics.median(xs):.1f} ({spread(xs)}){' ' + tag if tag else ''}"

    for r in results:
        q = r["qkv"]
        qm = statistics.median(q)
        bm = statistics.median(r["peers"][r["best_peer"]])
        ik = f"{qm / statistics.median(r['peers'][r['best_ik']]):.2f}×" if r["best_ik"] else "—"
        cm = statistics.median(r["ceiling"])
        qs = statistics.median(r["qkv_share"])
        ps = statistics.median(r["peer_share"][r["best_peer"]])
        print(f"| {r['label']} | {cell(r, r['best_peer'])} | {cell(r, r['best_ik'])} | "
              f"{qm:.1f} ({spread(q)}) | {qm / bm:.2f}× | {ik} | {r['target']} | "
              f"{cm:.0f} ({spread(r['ceiling'])}) | {qs:.0%} | {ps:.0%} | {1 / ps:.2f}× |")
    print()
    print("Commands:")
    print(f"- ceilings: `RAYON_NUM_THREADS={t} {probe} 5` before every engine run")
    for r in results:
        for p, c in r["peer_cmds"].items():
            print(f"- {r['name']} {p}: `{c}`")
        print(f"- {r['name']} qkv: `{r['qkv_cmd']}`")
    if args.json_out:
        args.json_out.write_text(json.dumps(dict(rev=rev, threads=t, rows=results), indent=1))


if __name__ == "__main__":
    main()
