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

Everything is cached under $QKV_CACHE/llamacpp/kl/ so that a run stopped part way (a
session ending, a niced process paused by someone's benchmark) resumes where it was:
- the base files (~1 GB each at the defaults) stay, named by engine, file, window and text
  length, with a `.done` stamp written only once their run finished; a base without its
  stamp is half written and is made again. qkv's base is also named by a hash of the
  `decode` binary, since another build may round differently.
- each run's figures go to a `.json` beside them, and a run with its `.json` is not repeated.
The f16 PPL of each engine comes from the base run; with the base already made it is read
back from the compare run (`base_ppl`, llama.cpp's `Mean PPL(base)`). `--fresh` deletes
this model's cached files first; `--clean` deletes the base files at the end.
qkv's binary is built (`cargo build --release --bin decode`) and copied to
$QKV_CACHE/llamacpp/qkv-decode-kv unless --qkv names one.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402
import perplexity_text  # noqa: E402
from quality_vs_llamacpp import lc_ppl  # noqa: E402


def qkv_ppl(qkv, model, text, ctx, threads, base, kv_type):
    cmd = [qkv, "perplexity", "--model", model, "--file", text, "--ctx", ctx,
           "--threads", threads, "--kv-type", kv_type, "--kl-base", base]
    b.log("$ " + " ".join(map(str, cmd)))
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"qkv's perplexity run failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1]), " ".join(map(str, cmd))


def own_qkv(lc: Path) -> Path:
    """qkv's decode, built and copied apart from bench_vs_llamacpp.py's snapshot."""
    b.log("building qkv: cargo build --release --bin decode")
    b.run(["cargo", "build", "--release", "--bin", "decode"], cwd=b.REPO)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or b.REPO / "target")
    snap = lc / "qkv-decode-kv"
    shutil.copy2(target / "release" / "decode", snap)
    return snap


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:12]


class Step:
    """One cached run: its figures in `<stem>.json`, its command beside them."""

    def __init__(self, kl: Path, stem: str):
        self.path = kl / f"{stem}.json"

    def get(self):
        if self.path.is_file():
            try:
                got = json.loads(self.path.read_text())
                b.log(f"cached: {self.path.name}")
                return got["figures"], got["command"]
            except (ValueError, KeyError):
                self.path.unlink()
        return None

    def put(self, figures, command):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(figures=figures, command=command)))
        tmp.replace(self.path)
        return figures, command


def pair(kl, stem, base, run_base, run_compare):
    """(f16 figures, q8_0 figures, commands) of one engine, each run at most once."""
    done = base.with_name(base.name + ".done")
    if not done.is_file():  # missing or half written: make it again, and forget what used it
        base.unlink(missing_ok=True)
        for k in ("f16", "q8_0"):
            (kl / f"{stem}-{k}.json").unlink(missing_ok=True)
    f16, q8 = Step(kl, f"{stem}-f16"), Step(kl, f"{stem}-q8_0")
    a = f16.get()
    if a is None and not done.is_file():
        a = f16.put(*run_base())
        done.write_text("")
    c = q8.get() or q8.put(*run_compare())
    if a is None:  # the base was made by an earlier run whose figures were lost
        fig = dict(ppl=c[0]["base_ppl"], ppl_err=float("nan"))
        a = f16.put(fig, c[1].replace("q8_0", "f16") + "  (PPL read back from the base)")
    return a, c


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chars", type=int, default=100_000, help="length of the text")
    ap.add_argument("--model", type=Path, help="GGUF file (default: the default model)")
    ap.add_argument("--qkv", type=Path, help="a built `decode` binary to use as is")
    ap.add_argument("--engines", default="qkv,llamacpp", help="which engines to run")
    ap.add_argument("--fresh", action="store_true", help="delete this model's cached runs first")
    ap.add_argument("--clean", action="store_true", help="delete the base files at the end")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    engines = args.engines.split(",")

    cache = b.cache_dir()
    lc = cache / "llamacpp"
    _, quant = b.ensure_llamacpp(lc)
    tool = quant.parent / "llama-perplexity"
    model = args.model or cache / b.SOURCE_GGUF
    if not model.is_file():
        sys.exit(f"{model} missing: run `cargo run --release --bin decode -- --prompt Hi -n 1`")
    text = lc / f"kv-ppl-{args.chars}.txt"
    body = perplexity_text.text(args.chars)
    if not text.is_file() or text.read_text(encoding="utf-8") != body:
        text.write_text(body, encoding="utf-8")
    kl = lc / "kl"
    kl.mkdir(exist_ok=True)
    ctx, t = args.ctx, args.threads
    tag = f"{model.stem}-c{ctx}-t{args.chars}"
    if args.fresh:
        for f in kl.glob(f"*-{tag}*"):
            f.unlink()
    rows, bases = {}, []
    if "qkv" in engines:
        qkv = args.qkv or own_qkv(lc)
        stem = f"qkv-{digest(qkv)}-{tag}"
        qbase = kl / f"{stem}.bin"
        bases.append(qbase)
        rows["qkv"] = pair(kl, stem, qbase,
                           lambda: qkv_ppl(qkv, model, text, ctx, t, qbase, "f16"),
                           lambda: qkv_ppl(qkv, model, text, ctx, t, qbase, "q8_0"))
    if "llamacpp" in engines:
        stem = f"llamacpp-{tag}"
        lbase = kl / f"{stem}.bin"
        bases.append(lbase)
        fa = ["-fa", "on"]
        rows["llama.cpp"] = pair(
            kl, stem, lbase,
            lambda: lc_ppl(tool, model, text, ctx, t, lbase, False, fa),
            lambda: lc_ppl(tool, model, text, ctx, t, lbase, True,
                           fa + ["-ctk", "q8_0", "-ctv", "q8_0"]))
    if args.clean:
        for f in bases:
            f.unlink(missing_ok=True)
            f.with_name(f.name + ".done").unlink(missing_ok=True)

    scored = next(iter(rows.values()))[1][0].get("scored", "?")
    print()
    print(f"model {model.name}; text {text.name} ({len(body)} characters, "
          f"tools/perplexity_text.py); windows of {ctx}, second half scored "
          f"({scored} tokens for qkv); {t} threads")
    print()
    print("| engine | PPL, f16 cache | PPL, q8_0 cache | mean KLD q8_0 vs f16 | "
          "same top token |")
    print("|---|---|---|---|---|")
    for name, ((a, _), (c, _)) in rows.items():
        print(f"| {name} | {a['ppl']:.4f} ± {a['ppl_err']:.4f} | "
              f"{c['ppl']:.4f} ± {c['ppl_err']:.4f} | "
              f"{c['kld']:.6f} ± {c['kld_err']:.6f} | "
              f"{c['same_top']:.3%} ± {c['same_top_err']:.3%} |")
    print()
    print("Commands:")
    for (_, c1), (_, c2) in rows.values():
        print(f"- `{c1}`")
        print(f"- `{c2}`")
    if args.json_out:
        out = {k: dict(f16=a, q8_0=c) for k, ((a, _), (c, _)) in rows.items()}
        args.json_out.write_text(json.dumps(dict(ctx=ctx, model=str(model), rows=out), indent=1))


if __name__ == "__main__":
    main()
