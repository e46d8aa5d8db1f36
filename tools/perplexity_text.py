#!/usr/bin/env python3
"""Writes the English text that the perplexity and KL tables are measured on.

    python3 tools/perplexity_text.py OUT [--chars N]

The text is the documentation topics that ship with every CPython (`pydoc_data.topics`,
the pages `help('topic')` shows), joined in sorted key order with a blank line between them,
cut at the last paragraph break before N characters (default 260,000: about 56k tokens with
SmolLM2's tokenizer). Every machine with Python has it, no download needed; the same CPython
version gives the same bytes.
"""

import argparse
import sys

from pydoc_data import topics


def text(limit: int) -> str:
    whole = "\n\n".join(topics.topics[k].strip() for k in sorted(topics.topics)) + "\n"
    if len(whole) <= limit:
        return whole
    cut = whole.rfind("\n\n", 0, limit)
    return whole[: cut if cut > 0 else limit] + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--chars", type=int, default=260_000)
    args = ap.parse_args()
    t = text(args.chars)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(t)
    print(f"{args.out}: {len(t)} characters, Python {sys.version.split()[0]}", file=sys.stderr)


if __name__ == "__main__":
    main()
