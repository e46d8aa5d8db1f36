#!/usr/bin/env python3
"""What a Q8_0 KV cache costs in quality, qkv beside llama.cpp: KL divergence from each
engine's own f16-cache run, top-token agreement and perplexity, at windows of 4096 tokens.

    python3 tools/kv_quality.py [--ctx 4096] [--chars 100000] [--threads 2] [--model FILE]
                                [--qkv DECODE_BINARY] [--json-out FILE]

1. The text: `tools/perplexity_text.py` cut at --chars (100k characters: about 22k tokens,
   five windows of 4096), written to $QKV_CACHE/llamacpp/kv-ppl.txt.
2. The file: the default model (the published SmolLM2-135M-Instruct Q4_1 GGUF), or --model.
3. qkv: `decode perplexity --kv-type f16 --kl-base BASE` writes its base, then
   `--kv-type q8_0` compares with it. llama.cpp: `llama-perplexity -fa on
   --kl-divergence-base BASE` (its default f16 cache) writes its own, then
   `-ctk q8_0 -ctv q8_0 --kl-divergence` compares (llama.cpp quantizes V only with flash
   attention, so both of its runs use it). Both score the second half of each window, so
   every scored token has 2048–4095 tokens of context before it.
4. A markdown table: PPL of both caches, mean KLD and same-top-token share, both engines.

Base files (two of ~0.8 GB at the defaults) go to $QKV_CACHE/llamacpp/kl/ and are deleted
at the end. qkv's binary is built (`cargo build --release --bin decode`) and copied to
$QKV_CACHE/llamacpp/qkv-decode-kv unless --qkv names one.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_vs_llamacpp as b  # noqa: E402
import perplexity_text  # noqa: E402
from quality_vs_llamacpp import lc_ppl  # noqa: E402


def qkv_ppl(qkv, model, text, ctx, threads, base, kv_type):
    cmd = [qkv, "perplexity", "--model", model, "--file", text, "--ctx", ctx,
           "--threads", threads, "--kv-type", kv_type, "--kl-base", base]
    b.log("$ " + " ".join(map(str, cmd)))
    res = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1]), " ".join(map(str, cmd))


def own_qkv(lc: Path) -> Path:
    """qkv's decode, built and copied apart from bench_vs_llamacpp.py's snapshot."""
    b.log("building qkv: cargo build --release --bin decode")
    b.run(["cargo", "build", "--release", "--bin", "decode"], cwd=b.REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or b.REPO / "target")
    snap = lc / "qkv-decode-kv"
    shutil.copy2(target / "release" / "decode", snap)
    return snap


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=100_000, help="length of the text")
    ap.add_argument("--model", type=Path, help="GGUF file (default: the default model)")
    ap.add_argument("--qkv", type=Path, help="a built `decode` binary to use as is")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    cache = b.cache_dir()
    lc = cache / "llamacpp"
    _, quant = b.ensure_llamacpp(lc)
    tool = quant.parent / "llama-perplexity"
    qkv = args.qkv or own_qkv(lc)
    model = args.model or cache / b.SOURCE_GGUF
    if not model.is_file():
        sys.exit(f"{model} missing: run `cargo run --release --bin decode -- --prompt Hi -n 1`")
    text = lc / "kv-ppl.txt"
    text.write_text(perplexity_text.text(args.chars), encoding="utf-8")
    kl = lc / "kl"
    kl.mkdir(exist_ok=True)
    qbase = kl / f"qkv-kv-f16-c{args.ctx}.bin"
    lbase = kl / f"llamacpp-kv-f16-c{args.ctx}.bin"
    for stale in (qbase, lbase):
        stale.unlink(missing_ok=True)
    ctx, t = args.ctx, args.threads
    fa = ["-fa", "on"]
    try:
        q16, q16cmd = qkv_ppl(qkv, model, text, ctx, t, qbase, "f16")
        q8, q8cmd = qkv_ppl(qkv, model, text, ctx, t, qbase, "q8_0")
        l16, l16cmd = lc_ppl(tool, model, text, ctx, t, lbase, False, fa)
        l8, l8cmd = lc_ppl(tool, model, text, ctx, t, lbase, True,
                           fa + ["-ctk", "q8_0", "-ctv", "q8_0"])
    finally:
        for f in (qbase, lbase):
            f.unlink(missing_ok=True)

    print()
    print(f"model {model.name}; text {text.name} ({len(text.read_text())} characters, "
          f"tools/perplexity_text.py); windows of {ctx}, second half scored "
          f"({q8['scored']} tokens); {t} threads")
    print()
    print("| engine | PPL, f16 cache | PPL, q8_0 cache | mean KLD q8_0 vs f16 | "
          "same top token |")
    print("|---|---|---|---|---|")
    for name, a, c in (("qkv", q16, q8), ("llama.cpp", l16, l8)):
        print(f"| {name} | {a['ppl']:.4f} ± {a['ppl_err']:.4f} | "
              f"{c['ppl']:.4f} ± {c['ppl_err']:.4f} | "
              f"{c['kld']:.6f} ± {c['kld_err']:.6f} | "
              f"{c['same_top']:.3%} ± {c['same_top_err']:.3%} |")
    print()
    print("Commands:")
    for c in (q16cmd, q8cmd, l16cmd, l8cmd):
        print(f"- `{c}`")
    if args.json_out:
        rows = dict(qkv=dict(f16=q16, q8_0=q8), llamacpp=dict(f16=l16, q8_0=l8))
        args.json_out.write_text(json.dumps(dict(ctx=ctx, model=str(model), rows=rows), indent=1))


if __name__ == "__main__":
    main()
