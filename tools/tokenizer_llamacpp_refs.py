#!/usr/bin/env python3
"""llama.cpp's tokenizer on held-out strings, for every `models/ggml-vocab-*.gguf`: the
references tests/tokenizer_heldout.rs compares qkv's tokenizers with.

    python3 tools/tokenizer_llamacpp_refs.py [-o OUT.json]

The llama.cpp source is the one `tools/quantized_models.py` unpacks into $QKV_CACHE/llamacpp;
`llama-tokenize` is built there once (cmake --target llama-tokenize) when it is missing. OUT
defaults to $QKV_CACHE/tokenizer/llamacpp_heldout.json, the path the test reads. Prints OUT on
stdout, everything else on stderr.

Every string is tokenized in two modes: `parse` (no BOS/EOS added, special tokens in the text
parsed: `--no-bos`), and `bare` (neither: `--no-bos --no-parse-special`, what llama.cpp's
test-tokenizer-0 does). The first FULL_COUNT strings also get `full` (the tokens the vocabulary
adds around the text, special tokens parsed: llama-tokenize's default). The strings are the
fixed list below plus, per vocabulary, a few built from its own control and user-defined
tokens (so that each vocabulary's specials are exercised between and against text).

The ids come from `llama_tokenize` in the `libllama.so` that `llama-tokenize` links, called
through llama-cpp-python's ctypes bindings from the same sdist (its `llama_cpp/llama_cpp.py`,
loaded without the package's other modules): one `llama-tokenize` process per string reloads
the vocabulary every time (0.5-1.5 s each, over an hour for the ~2,000 cases). Each
vocabulary's SPOT_CHECKS strings are also run through `llama-tokenize` itself,
and the script stops if the two disagree. Results are cached in OUT by (vocabulary, mode,
string), so adding a string only tokenizes that one.
"""

import argparse
import ctypes
import hashlib
import importlib
import json
import os
import struct
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402

# Held-out strings: none of them is in the suite's `.inp` files. Scripts, marks, whitespace
# runs, numbers, contractions, code, and spellings of special tokens in text.
TEXTS = [
    "",
    " ",
    "\n",
    "Hello world",
    " Hello world",
    "  leading two spaces",
    "trailing spaces   ",
    " \tmixed leading whitespace",
    "a  b   c    d\t\te\n\nf\r\ng \r\n\r\n h",
    "\n\n\nthree newlines first",
    "line one\r\nline two\r\n\r\nline four\n",
    "            twelve spaces",
    "\t\t\ttabs\t \t",
    "我想在北京吃烤鸭。東京は日本の首都です。",
    "안녕하세요, 세계! 한국어 토큰화 테스트입니다.",
    "नमस्ते दुनिया, यह हिंदी में एक वाक्य है।",
    "مرحبا بالعالم، هذا اختبار للترميز.",
    "สวัสดีครับ ประเทศไทย ภาษาไทย",
    "Γειά σου Κόσμε, Здравствуй мир, שלום עולם",
    "I \u2764\ufe0f \U0001f999\U0001f40d! \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family \U0001f1eb\U0001f1f7 \U0001f44d\U0001f3fd",
    "e\u0301 vs \u00e9, n\u0303, A\u030a, a\u0325\u0327\u0316\u0318 Z\u0351\u036b\u0343",
    "\u00c0\u00c9\u00ce\u00d5\u00dc \u00c7\u00e0 \u00f1 Stra\u00dfe \u0130stanbul \u01c5 \ufb01 \u2460\u2461\u2462 \uff21\uff22\uff23\uff11\uff12\uff13",
    "3.14159265358979323846 and 1234567890123456789 and 1,000,000.00",
    "abc123def 4567 89.0e-10 0x1F \u0663\u0664\u0665 \u096a\u096b\u096c",
    "I'm, you're, he's, we've, they'll, she'd, can't, won't, IT'S, O'Neil's 'quoted'",
    "def f(x):\n    return x**2  # square\n\tif x != 0: pass\n",
    "https://example.com/path?q=1&r=2#frag -- ... !!! ??? \u00bf\u00a1 (a) [b] {c} <d>",
    "a\u00a0b\u3000c\u2009d\u200be\u2028f",
    "ctrl\u0001chars\u007fhere\u0000nul",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!!!!!!!!!!!!!!........",
    "# Title\n\n* item 1\n* item 2\n\n```rust\nfn main() {}\n```\n",
    "Mixed: Hello \u043c\u0438\u0440 \u4e16\u754c \U0001f30d \u0928\u092e\u0938\u094d\u0924\u0947 \ud55c\uae00",
    "<s>Hello</s> <|endoftext|>world<|im_start|>user\nHi<|im_end|>\n",
    "Hello </s> world",
    "</s>",
    "</s> ",
    " </s>",
    "text</s>\n</s>  more",
    "[CLS] x [SEP] <unk> <pad> <mask> [MASK] [UNK]",
    "<s", "</s", "<|im_end", "|>", "<<s>>", "<s><s></s>",
    "<|endoftext|><|endoftext|>",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! 1984: a novel.",
    "\u00a0leading no-break space, \r alone, \r\n\r\n",
    "\u01c5ungla \u1fbc \u2126mega \u2103 \u2122 \u00bd \u2166",
    "\u09e7\u09e8\u09e9 \u09ac\u09be\u0982\u09b2\u09be \u0ba4\u0bae\u0bbf\u0bb4\u0bcd",
    "\u30ab\u30bf\u30ab\u30ca \uff76\uff80\uff76\uff85 \u3072\u3089\u304c\u306a",
    "\U0001f600\U0001f600\U0001f600 x\u0301\u0301\u0301 \u200d\u200c",
    "   \n   \n\t\n",
    "don't DON'T l'amour it\u2019s we\u2019re",
    "0 00 000 0000 00000 123456789 -42 +3.5e+10 1_000_000",
    "\ud55c\uad6d\uc5b4\ub294 \uc5b4\ub835\uc9c0 \uc54a\uc544\uc694",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n\u4f60\u597d</s><s>",
]

# Strings tokenized in `full` mode too: the first ones, enough to see what each vocabulary
# puts around a text (and around empty text).
FULL_COUNT = 8

MODES = {
    "parse": ["--no-bos"],
    "bare": ["--no-bos", "--no-parse-special"],
    "full": [],
}


def read_tokens(path: Path) -> tuple[list[str], list[int]]:
    """The `tokenizer.ggml.tokens` and `tokenizer.ggml.token_type` arrays of a GGUF file, read
    directly (gguf-py's reader maps every field of a 250k-token vocabulary and takes minutes
    on a loaded machine)."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", errors="replace")
        pos += n
        return s

    def value(ty):
        nonlocal pos
        if ty == 8:
            return string()
        if ty == 9:
            inner, n = take("<I"), take("<Q")
            if inner == 8:
                return [string() for _ in range(n)]
            if inner == 5:
                out = list(struct.unpack_from(f"<{n}i", data, pos))
                pos += 4 * n
                return out
            if inner == 9:
                raise ValueError("nested arrays")
            pos += sizes[inner] * n
            return None
        pos += sizes[ty]
        return None

    assert data[:4] == b"GGUF", path
    pos = 8
    take("<Q")  # tensors
    n_kv = take("<Q")
    tokens, types = [], []
    for _ in range(n_kv):
        k = string()
        v = value(take("<I"))
        if k == "tokenizer.ggml.tokens":
            tokens = v
        elif k == "tokenizer.ggml.token_type":
            types = v
    return tokens, types


def vocab_specials(path: Path) -> list[str]:
    """The vocabulary's control (3) and user-defined (4) tokens, by id."""
    tokens, types = read_tokens(path)
    return [t for t, ty in zip(tokens, types) if ty in (3, 4)]


def vocab_texts(specials: list[str]) -> list[str]:
    """A few strings built from a vocabulary's own special tokens: the first, the last, and two
    from the middle (user-defined ones first when there are any)."""
    if not specials:
        return []
    picks = []
    for s in [specials[0], specials[-1], specials[len(specials) // 2], specials[len(specials) // 3]]:
        if s and s not in picks:
            picks.append(s)
    a, z = picks[0], picks[-1]
    m = picks[len(picks) // 2]
    return [
        f"{a}Hello{z}",
        f" {a} text {z} ",
        f"x{a}{m}\n{z}y",
        f"{m}\n\n{m}  end",
    ]


# Strings also run through the llama-tokenize binary (in every mode, for every vocabulary, with
# the first string built from the vocabulary's specials), as a check that the library calls
# here are what the tool does.
SPOT_CHECKS = [TEXTS[3], "Hello </s> world", TEXTS[13], TEXTS[8], TEXTS[33]]

# llama-tokenize's flags for each mode's (add_special, parse_special); `full` adds what the
# vocabulary asks for (llama-tokenize: add_special = the vocabulary's add_bos).
FLAGS = {"parse": (False, True), "bare": (False, False)}


def tokenize_tool(exe: Path, vocab: Path, text: str, mode: str) -> list[int]:
    cmd = [str(exe), "-m", str(vocab), "--stdin", "--ids", "--no-escape", "--log-disable"]
    cmd += MODES[mode]
    p = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{vocab.name} {mode} {text!r}: {p.stderr.decode(errors='replace')}")
    line = [ln for ln in p.stdout.decode().splitlines() if ln.startswith("[")][-1]
    return json.loads(line)


class Library:
    """llama.cpp's C API through llama-cpp-python's ctypes declarations."""

    def __init__(self, src: Path):
        os.environ["LLAMA_CPP_LIB_PATH"] = str(src / "build" / "bin")
        pkg_dir = src.parent.parent / "llama_cpp"
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [str(pkg_dir)]
        sys.modules["llama_cpp"] = pkg
        self.c = importlib.import_module("llama_cpp.llama_cpp")
        # Keep the callback alive: llama.cpp calls it for every log line.
        self._quiet = self.c.llama_log_callback(lambda level, text, user: None)
        self.c.llama_log_set(self._quiet, ctypes.c_void_p())
        self.c.llama_backend_init()

    def load(self, path: Path):
        params = self.c.llama_model_default_params()
        params.vocab_only = True
        model = self.c.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        return model, self.c.llama_model_get_vocab(model)

    def tokenize(self, vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n = len(data) + 8
        buf = (self.c.llama_token * n)()
        k = self.c.llama_tokenize(vocab, data, len(data), buf, n, add_special, parse_special)
        if k < 0:
            n = -k
            buf = (self.c.llama_token * n)()
            k = self.c.llama_tokenize(vocab, data, len(data), buf, n, add_special, parse_special)
        if k < 0:
            raise RuntimeError(f"llama_tokenize failed on {text!r}")
        return list(buf[:k])


def ensure_tokenize(lc: Path) -> tuple[Path, Path]:
    """Returns (llama-tokenize, llama.cpp source), building the tool once."""
    bin_dir = b.build_llamacpp(lc, ["llama-tokenize"])
    return bin_dir / "llama-tokenize", b.llamacpp_source(lc)


def key(vocab: str, mode: str, text: str) -> str:
    return f"{vocab}\x00{mode}\x00{hashlib.sha256(text.encode()).hexdigest()}"


def main():
    cache = b.cache_dir()
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", type=Path, default=cache / "tokenizer" / "llamacpp_heldout.json")
    args = ap.parse_args()

    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        exe, src = ensure_tokenize(cache / "llamacpp")
        models = src / "models"
        vocabs = sorted(p.name[len("ggml-vocab-"):-len(".gguf")]
                        for p in models.glob("ggml-vocab-*.gguf"))
        old = {}
        if args.out.is_file():
            for e in json.loads(args.out.read_text())["cases"]:
                old[key(e["vocab"], e["mode"], e["text"])] = e["ids"]
        jobs = []
        spot = {}
        for v in vocabs:
            path = models / f"ggml-vocab-{v}.gguf"
            own = vocab_texts(vocab_specials(path))
            spot[v] = set(SPOT_CHECKS + own[:1])
            texts = TEXTS + own
            for i, t in enumerate(texts):
                for mode in MODES:
                    if mode == "full" and i >= FULL_COUNT:
                        continue
                    jobs.append((v, path, mode, t))
        todo = [j for j in jobs if key(j[0], j[2], j[3]) not in old]
        b.log(f"{len(vocabs)} vocabularies, {len(jobs)} cases, {len(todo)} to run")
        if todo:
            lib = Library(src)
            by_vocab = {}
            for v, path, mode, t in todo:
                by_vocab.setdefault((v, path), []).append((mode, t))
            for (v, path), items in by_vocab.items():
                model, vocab = lib.load(path)
                add_bos = bool(lib.c.llama_vocab_get_add_bos(vocab))
                for mode, t in items:
                    add, parse = FLAGS.get(mode, (add_bos, True))
                    ids = lib.tokenize(vocab, t, add, parse)
                    old[key(v, mode, t)] = ids
                    if t in spot[v]:
                        tool = tokenize_tool(exe, path, t, mode)
                        if tool != ids:
                            sys.exit(f"{v} {mode} {t!r}: llama-tokenize gives {tool}, "
                                     f"the library {ids}")
                lib.c.llama_model_free(model)
                b.log(f"  {v}: {len(items)} cases")
        cases = [{"vocab": v, "mode": mode, "text": t, "ids": old[key(v, mode, t)]}
                 for v, _, mode, t in jobs]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "llama_cpp": f"llama-cpp-python {b.LLAMA_CPP_PY_VERSION} (vendor/llama.cpp)",
            "modes": {m: " ".join(f) for m, f in MODES.items()},
            "vocabs": vocabs,
            "cases": cases,
        }, ensure_ascii=False, indent=0))
        tmp.rename(args.out)
        sys.stdout.flush()
    finally:
        os.dup2(real_stdout, 1)
    print(args.out)


if __name__ == "__main__":
    main()
