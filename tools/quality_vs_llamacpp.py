#!/usr/bin/env python3
"""Quality of the quantized paths, side by side with llama.cpp: perplexity, KL divergence
from each engine's own F32 run, and top-token agreement, on the same text, files and context.

    python3 tools/quality_vs_llamacpp.py [--ctx 512] [--threads 2] [--kinds q4_1,q8_0,...]

1. The text: `tools/perplexity_text.py` (the documentation topics that ship with CPython,
   ~260k characters, about 56k tokens), written to $QKV_CACHE/llamacpp/ppl.txt.
2. The files: the F32 GGUF (the published Q4_1 file dequantized) and the quantized ones
   (`tools/quantized_models.py`; the published Q4_1 file itself for q4_1).
3. Each engine's base: its own F32 run (`decode perplexity --kl-base` writes qkv's,
   `llama-perplexity --kl-divergence-base` llama.cpp's), then every quantized file against
   it. Both score the second half of each non-overlapping window of --ctx tokens.
4. A markdown table: PPL, mean KLD and same-top-token share for both engines.

Base files (one per engine, ~2.5 GB each at ctx 512) are kept in $QKV_CACHE/llamacpp/kl/.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402
import perplexity_text  # noqa: E402
import quantized_models as qm  # noqa: E402

# One row per file tools/quantized_models.py makes: the published Q4_1, the K and legacy
# mixes, the low-bit mixes, Q2_K made pure (so its own blocks are scored), the imatrix ones.
KINDS = ("q4_1", *(t.lower() for t in b.QUANT_TYPES + qm.LOW_BIT_TYPES),
         *(f"{t.lower()}_pure" for t in qm.PURE_TYPES), *(t.lower() for t in qm.IMATRIX_TYPES),
         "bf16")


def qkv_ppl(qkv, model, text, ctx, threads, base, extra=()):
    cmd = [qkv, "perplexity", "--model", model, "--file", text, "--ctx", ctx,
           "--threads", threads, "--kl-base", base, *extra]
    b.log("$ " + " ".join(map(str, cmd)))
    res = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1]), " ".join(map(str, cmd))


def lc_ppl(tool, model, text, ctx, threads, base, compare, extra=()):
    """One llama-perplexity run; `extra` adds flags (e.g. the KV cache types)."""
    cmd = [tool, "-m", model, "-f", text, "-c", ctx, "-b", ctx, "-t", threads,
           "--kl-divergence-base", base, *extra]
    if compare:
        cmd.append("--kl-divergence")
    b.log("$ " + " ".join(map(str, cmd)))
    res = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)
    out = res.stdout + res.stderr
    got = {}
    if m := re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out):
        got["ppl"], got["ppl_err"] = float(m[1]), float(m[2])
    if m := re.search(r"Mean PPL\(Q\)\s*:\s*([\d.]+)\s*±\s*([\d.]+)", out):
        got["ppl"], got["ppl_err"] = float(m[1]), float(m[2])
    if m := re.search(r"Mean PPL\(base\)\s*:\s*([\d.]+)", out):
        got["base_ppl"] = float(m[1])
    if m := re.search(r"Mean\s+KLD:\s*([-\d.]+)\s*±\s*([\d.]+)", out):
        got["kld"], got["kld_err"] = float(m[1]), float(m[2])
    if m := re.search(r"Same top p:\s*([\d.]+)\s*±\s*([\d.]+)\s*%", out):
        got["same_top"], got["same_top_err"] = float(m[1]) / 100, float(m[2]) / 100
    if compare and "kld" not in got:
        sys.exit(f"no KLD in llama-perplexity's output:\n{out[-2000:]}")
    return got, " ".join(map(str, cmd))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--chars", type=int, default=260_000, help="length of the text")
    ap.add_argument("--act-bits", choices=["8", "16"],
                    help="qkv's activation precision for quantized weights (default: qkv's own, 8)")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    kinds = args.kinds.split(",")

    cache = b.cache_dir()
    lc = cache / "llamacpp"
    _, quant = b.ensure_llamacpp(lc)
    tool = quant.parent / "llama-perplexity"
    qkv, rev = b.ensure_qkv(lc)
    models = b.ensure_models(lc, cache, quant, qkv, ("F32",))
    for k in kinds:
        if k != "q4_1":
            models[k] = lc / "models" / f"{b.MODEL_STEM}.{k.upper()}.gguf"
    if not all(p.is_file() for p in models.values()):
        b.run([sys.executable, Path(__file__).resolve().parent / "quantized_models.py"],
              stdout=subprocess.DEVNULL)
    extra = ("--act-bits", args.act_bits) if args.act_bits else ()
    text = lc / "ppl.txt"
    text.write_text(perplexity_text.text(args.chars), encoding="utf-8")
    kl = lc / "kl"
    kl.mkdir(exist_ok=True)
    qbase, lbase = kl / f"qkv-f32-c{args.ctx}.bin", kl / f"llamacpp-f32-c{args.ctx}.bin"
    for stale in (qbase, lbase):  # the text or the binaries may have changed: start over
        stale.unlink(missing_ok=True)
    ctx, t = args.ctx, args.threads
    rows = {}
    q, qcmd = qkv_ppl(qkv, models["f32"], text, ctx, t, qbase)
    l, lcmd = lc_ppl(tool, models["f32"], text, ctx, t, lbase, False)
    rows["f32"] = dict(qkv=q, llamacpp=l, cmds=[qcmd, lcmd])
    for k in kinds:
        q, qcmd = qkv_ppl(qkv, models[k], text, ctx, t, qbase, extra)
        l, lcmd = lc_ppl(tool, models[k], text, ctx, t, lbase, True)
        rows[k] = dict(qkv=q, llamacpp=l, cmds=[qcmd, lcmd])
        b.log(f"{k}: qkv KLD {q['kld']:.6f}, same top {q['same_top']:.2%}; "
              f"llama.cpp KLD {l['kld']:.6f}, same top {l['same_top']:.2%}")

    print()
    print(f"qkv git {rev}; text: {text.name} ({len(text.read_text())} characters, "
          f"tools/perplexity_text.py); windows of {ctx}, second half scored; {t} threads; "
          f"qkv at {args.act_bits or 'its default 8'}-bit activations")
    print()
    print("| file | qkv PPL | llama.cpp PPL | qkv KLD vs its F32 | llama.cpp KLD vs its F32 | "
          "qkv same top | llama.cpp same top | KLD ≤ llama.cpp | top ≥ llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, r in rows.items():
        q, l = r["qkv"], r["llamacpp"]
        if k == "f32":
            print(f"| F32 (base) | {q['ppl']:.4f} ± {q['ppl_err']:.4f} | "
                  f"{l['ppl']:.4f} ± {l['ppl_err']:.4f} | — | — | — | — | — | — |")
            continue
        ok_k = "yes" if q["kld"] <= l["kld"] else "NO"
        ok_t = "yes" if q["same_top"] >= l["same_top"] else "NO"
        print(f"| {k.upper()} | {q['ppl']:.4f} ± {q['ppl_err']:.4f} | "
              f"{l['ppl']:.4f} ± {l['ppl_err']:.4f} | "
              f"{q['kld']:.6f} ± {q['kld_err']:.6f} | {l['kld']:.6f} ± {l['kld_err']:.6f} | "
              f"{q['same_top']:.3%} | {l['same_top']:.3%} | {ok_k} | {ok_t} |")
    print()
    print("Commands:")
    for k, r in rows.items():
        for c in r["cmds"]:
            print(f"- {k}: `{c}`")
    if args.json_out:
        args.json_out.write_text(json.dumps(dict(rev=rev, ctx=ctx, rows=rows), indent=1))


if __name__ == "__main__":
    main()
