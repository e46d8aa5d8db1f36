#!/usr/bin/env python3
"""Writes kernels/src/quant/blocks/grids/{iq1,iq2,iq3}.rs: the IQ formats' lattice tables, as data.

    python3 tools/iq_grids.py

The tables come from gguf-py (its `init_grid` unpacks each format's grid from its packed
hexadecimal form): every entry of IQ2_XXS's, IQ2_XS's and IQ2_S's grids is 8 bytes (values
8, 25, 43), of IQ3_XXS's and IQ3_S's 4 bytes (values up to 62 and odd values up to 15), of
IQ1_S's (shared by IQ1_M) 8 signed bytes −1, 0, 1; each entry is written as one
little-endian integer whose byte `e` is element `e`. KSIGNS is the 7-bit-to-8-bit sign
table (the eighth sign makes the count of minus signs even).
"""

from pathlib import Path

import numpy as np
from gguf import quants as Q

OUT = Path(__file__).resolve().parent.parent / "kernels" / "src" / "quant" / "blocks" / "grids"


def grid(cls) -> np.ndarray:
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape).astype(np.int64)


def table(name: str, doc: str, rows: np.ndarray, width: int) -> str:
    ty = {4: "u32", 8: "u64"}[width]
    words = []
    for row in rows:
        v = 0
        for e, x in enumerate(row):
            v |= (int(x) & 0xFF) << (8 * e)
        words.append(f"0x{v:0{2 * width}x}")
    per_line = 4 if width == 8 else 6
    lines = [", ".join(words[i:i + per_line]) + "," for i in range(0, len(words), per_line)]
    body = "\n".join("    " + line for line in lines)
    return f"/// {doc}\npub const {name}: [{ty}; {len(rows)}] = [\n{body}\n];\n"


def main():
    head = ("//! {what} (data, written by `tools/iq_grids.py` from gguf-py's grids): entry `i`'s\n"
            "//! byte `e` is element `e` of grid point `i`.\n")
    ks = np.frombuffer(Q.IQ2_XXS.ksigns, dtype=np.uint8)
    body = "\n".join("    " + ", ".join(f"0x{x:02x}" for x in ks[i:i + 12]) + ","
                     for i in range(0, len(ks), 12))
    files = {
        "iq2.rs": [
            head.format(what="The IQ2 formats' lattices and their sign table"),
            "/// 7 sign bits to 8: bit 7 set where the 7 have an odd count of ones.\n"
            f"pub const KSIGNS: [u8; 128] = [\n{body}\n];\n",
            table("IQ2XXS_GRID", "IQ2_XXS: 256 points of 8 values in {8, 25, 43}.",
                  grid(Q.IQ2_XXS), 8),
            table("IQ2XS_GRID", "IQ2_XS: 512 points of 8 values in {8, 25, 43}.",
                  grid(Q.IQ2_XS), 8),
            table("IQ2S_GRID", "IQ2_S: 1024 points of 8 values in {8, 25, 43}.",
                  grid(Q.IQ2_S), 8),
        ],
        "iq3.rs": [
            head.format(what="The IQ3 formats' lattices"),
            table("IQ3XXS_GRID", "IQ3_XXS: 256 points of 4 values in {4, 12, …, 52, 62}.",
                  grid(Q.IQ3_XXS), 4),
            table("IQ3S_GRID", "IQ3_S: 512 points of 4 odd values 1..15.", grid(Q.IQ3_S), 4),
        ],
        "iq1.rs": [
            head.format(what="The IQ1 formats' lattice"),
            table("IQ1S_GRID", "IQ1_S and IQ1_M: 2048 points of 8 values in {−1, 0, 1}, "
                  "as signed bytes.", grid(Q.IQ1_S), 8),
        ],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for name, parts in files.items():
        (OUT / name).write_text("\n".join(parts))
        print(OUT / name)


if __name__ == "__main__":
    main()
