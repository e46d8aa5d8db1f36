#!/usr/bin/env python3
"""Speculative decoding, measured: qkv plain against qkv speculative (n-gram lookup, and a
draft model when one is given), and optionally llama-server with its own speculation, on the
same prompts, greedy, the same threads.

    python3 tools/bench_spec.py [--model FILE] [--model-draft FILE] [--threads 2] [-n 128]
                                [--reps 3] [--llama-server PATH] [--only copy,open]

What it does:

1. qkv: `cargo build --release --bin decode` (honours CARGO_TARGET_DIR), the binary copied to
   a temporary directory so that rebuilds during the run do not change what is measured.
2. Prompts: a fixed set that draws on its input (a code edit, a rewrite with one change, an
   extraction into JSON, a summary with quotes, a chat that repeats an earlier turn) and an
   open-ended set. Each runs through the chat template (`--chat`).
3. For each prompt, `--reps` times in alternation: `decode --json --temperature 0 -n N`
   plain, with `--spec ngram`, and with `--spec draft --model-draft FILE` when given. The
   median generated tokens/s, the acceptance (kept / drafted) and whether each speculative
   text equals the plain one are printed, then a markdown table with the commands.
4. With `--llama-server PATH`: the same prompts through llama-server's
   `/v1/chat/completions` (rendered with its own reading of the model's template), plain and with
   `--spec-type ngram-simple` (and `--model-draft` when given), its `timings` giving
   tokens/s, `draft_n` and `draft_n_accepted`.

The targets of issue 49: on the input-grounded prompts speculative ≥ 2× plain and ≥ 1.3×
llama-server's best speculative setting; on open-ended ones ≥ 0.97× plain; the text equal
everywhere.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax


def format_receipt(items, tax_rate):
    lines = []
    for item in items:
        lines.append(f"{item['name']}: {item['price'] * item['quantity']:.2f}")
    lines.append(f"Total: {total_price(items, tax_rate):.2f}")
    return "\\n".join(lines)
'''

LETTER = (
    "Dear Ms. Alvarez,\n\nThank you for your letter of March 3rd about the delayed shipment of "
    "the oak bookshelves. We have checked with our warehouse in Leeds, and the shelves left on "
    "March 10th by road freight. They should reach your shop in Bristol by March 14th. We are "
    "sorry for the delay and have refunded the delivery charge of 45 pounds to your account.\n\n"
    "Yours sincerely,\nTom Becker\nCustomer Service"
)

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, "
    "polished the great lens, and wrote the state of the sea in a leather logbook that had "
    "belonged to his grandfather. In winter the storms came from the north, and he counted "
    "the ships that passed by the light of the lamp."
)

GROUNDED = {
    "code_edit": "Rename the function total_price to compute_total everywhere in this code and "
    "return the whole code, unchanged otherwise:\n\n" + SOURCE,
    "rewrite": "Rewrite this letter exactly as it is, but change the city Bristol to Cardiff:"
    "\n\n" + LETTER,
    "extract_json": "Extract the sender, the recipient, the cities, the dates and the refund "
    "from this letter into a JSON object, quoting the letter's words:\n\n" + LETTER,
    "summary_quotes": "Summarise this passage in two sentences, quoting its words exactly:\n\n"
    + PASSAGE,
    "chat_repeat": "Earlier you wrote: \"" + PASSAGE + "\" Please repeat what you wrote, word "
    "for word.",
}

OPEN = {
    "story": "Write a short story about a fox who learns to play the violin.",
    "explain": "Explain why the sky is blue to a ten-year-old.",
    "ideas": "Give five ideas for a weekend trip in the mountains.",
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_decode(tmp: Path) -> Path:
    subprocess.run(["cargo", "build", "--release", "--bin", "decode"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    copy = tmp / "decode"
    shutil.copy2(target / "release" / "decode", copy)
    return copy


def decode(binary, model, threads, n, prompt, extra):
    cmd = [str(binary), "--json", "--chat", "--temperature", "0", "-n", str(n),
           "--threads", str(threads), "--prompt", prompt] + extra
    if model:
        cmd += ["--model", model]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    stats = lines[-1]["stats"]
    ids = [t["id"] for t in lines[:-1] if "id" in t]
    return ids, stats, cmd


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_runs(path, model, draft, threads, n, prompts, reps):
    """{setting: {prompt: [(tok/s, draft_n, accepted, content)]}} from llama-server."""
    settings = {"plain": [], "ngram-simple": ["--spec-type", "ngram-simple"]}
    if draft:
        settings["draft"] = ["--model-draft", draft]
    results = {}
    for name, flags in settings.items():
        port = free_port()
        cmd = [path, "-m", model, "--port", str(port), "-t", str(threads), "-np", "1"] + flags
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            results[name] = {}
            for key, text in prompts.items():
                runs = []
                for _ in range(reps):
                    body = {"messages": [{"role": "user", "content": text}],
                            "max_tokens": n, "temperature": 0}
                    req = urllib.request.Request(
                        url + "/v1/chat/completions", json.dumps(body).encode(),
                        {"Content-Type": "application/json"})
                    r = json.load(urllib.request.urlopen(req, timeout=600))
                    t = r.get("timings", {})
                    runs.append((t.get("predicted_per_second", 0.0), t.get("draft_n", 0),
                                 t.get("draft_n_accepted", 0),
                                 r["choices"][0]["message"]["content"]))
                results[name][key] = runs
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    return results, settings


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: decode's default model)")
    ap.add_argument("--model-draft", help="a draft model of the same vocabulary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-server", help="path to llama-server, to compare with")
    ap.add_argument("--only", help="comma-separated prompt names")
    args = ap.parse_args()
    if args.llama_server and not args.model:
        ap.error("--llama-server needs --model FILE (the same file for both)")
    prompts = {**GROUNDED, **OPEN}
    if args.only:
        keep = set(args.only.split(","))
        prompts = {k: v for k, v in prompts.items() if k in keep}
    if not prompts:
        ap.error(f"--only {args.only}: no such prompt (of {', '.join({**GROUNDED, **OPEN})})")
    settings = {"plain": [], "ngram": ["--spec", "ngram"]}
    if args.model_draft:
        settings["draft"] = ["--spec", "draft", "--model-draft", args.model_draft]
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_decode(Path(tmp))
        rows = []
        for key, text in prompts.items():
            runs = {s: [] for s in settings}
            for _ in range(args.reps):
                for s, extra in settings.items():
                    runs[s].append(decode(binary, args.model, args.threads, args.n, text, extra))
            plain_ids = runs["plain"][0][0]
            row = {"prompt": key, "kind": "grounded" if key in GROUNDED else "open"}
            for s in settings:
                tps = statistics.median(r[1]["generated_tokens_per_s"] for r in runs[s])
                drafted = sum(r[1]["draft_tokens"] for r in runs[s])
                kept = sum(r[1]["accepted_tokens"] for r in runs[s])
                equal = all(r[0] == plain_ids for r in runs[s])
                row[s] = (tps, kept / drafted if drafted else None, equal, runs[s][0][2])
            rows.append(row)
            log(f"{key}: " + ", ".join(f"{s} {row[s][0]:.1f} tok/s" for s in settings))
    peer = None
    if args.llama_server:
        peer, _ = llama_server_runs(args.llama_server, args.model, args.model_draft,
                                    args.threads, args.n, prompts, args.reps)
    print("| prompt | kind | " + " | ".join(
        f"{s} tok/s | {s} accepted | {s} equal" if s != "plain" else "plain tok/s"
        for s in settings) + (" | llama-server best spec tok/s |" if peer else " |"))
    print("|" + "---|" * (2 + 1 + 3 * (len(settings) - 1) + (1 if peer else 0)))
    for row in rows:
        cells = [row["prompt"], row["kind"]]
        for s in settings:
            tps, acc, equal, _ = row[s]
            if s == "plain":
                cells.append(f"{tps:.1f}")
            else:
                ratio = tps / row["plain"][0] if row["plain"][0] else 0.0
                cells += [f"{tps:.1f} ({ratio:.2f}x)",
                          "-" if acc is None else f"{acc:.0%}", "yes" if equal else "NO"]
        if peer:
            best = max(statistics.median(r[0] for r in peer[s][row["prompt"]])
                       for s in peer if s != "plain")
            cells.append(f"{best:.1f}")
        print("| " + " | ".join(cells) + " |")
    print("\nCommands (first repetition of each setting):\n")
    for s in settings:
        print("    " + shlex.join(rows[0][s][3]))


if __name__ == "__main__":
    main()
