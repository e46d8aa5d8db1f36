#!/usr/bin/env python3
"""Writes gguf-py's dequantization of random blocks of every GGUF format qkv decodes.

    pip install gguf numpy
    python3 tools/quant_fixtures.py

tests/fixtures/quant/blocks.bin
    For each format, in the order of index.json: the raw blocks, then the values
    `gguf.quants.dequantize` gives them, as little-endian f32.
tests/fixtures/quant/index.json
    One entry per format (one per line): its name, the block count, and where in blocks.bin
    its blocks (`src_offset`, `src_bytes`) and values (`dst_offset`, `dst_values`) lie.

The blocks are seeded random bytes with every f16 field (scale, minimum) replaced by a finite
f16: most drawn like real weights' scales (magnitudes 1e-5..1, either sign), some random
finite bit patterns (up to ±65504), some extreme (±0, the smallest and largest subnormals,
the smallest normal, ±65504). The K-formats' packed 6-bit scales and minimums (Q4_K, Q5_K,
Q3_K, IQ4_XS), the 4-bit ones (Q2_K) and i8 scales (Q6_K) are random bytes too: the packed bytes map one to one onto
the 6-bit fields, so every field is uniformly random over 0..63. New formats go at the end of
FORMATS, so that the random stream of the earlier ones (and their bytes) stays the same.

`kernels/tests/dequant_gguf_py.rs` checks `QuantFormat::dequantize` against these values
bit for bit. The older tests/fixtures/gguf/dequant.json (written by
tools/tokenizer_fixtures.py) holds slices of a real model file instead; this one needs no
model and covers every format.
"""

import json
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/quant"
SEED = 20250607

Q = gguf.GGMLQuantizationType
IQ1_M_D = "IQ1_M d"
# name -> (type, blocks to write, byte offsets of the f16 fields in a block)
FORMATS = {
    "Q8_0": (Q.Q8_0, 24, [0]),
    "Q4_0": (Q.Q4_0, 24, [0]),
    "Q4_1": (Q.Q4_1, 24, [0, 2]),
    "Q5_0": (Q.Q5_0, 24, [0]),
    "Q5_1": (Q.Q5_1, 24, [0, 2]),
    "Q4_K": (Q.Q4_K, 8, [0, 2]),
    "Q5_K": (Q.Q5_K, 8, [0, 2]),
    "Q6_K": (Q.Q6_K, 8, [208]),
    "Q3_K": (Q.Q3_K, 8, [108]),
    "IQ4_NL": (Q.IQ4_NL, 24, [0]),
    "IQ4_XS": (Q.IQ4_XS, 8, [0]),
    "Q2_K": (Q.Q2_K, 8, [80, 82]),
    "IQ2_XXS": (Q.IQ2_XXS, 8, [0]),
    "IQ2_XS": (Q.IQ2_XS, 8, [0]),
    "IQ2_S": (Q.IQ2_S, 8, [0]),
    "IQ3_XXS": (Q.IQ3_XXS, 8, [0]),
    "IQ3_S": (Q.IQ3_S, 8, [0]),
    "IQ1_S": (Q.IQ1_S, 8, [0]),
    # IQ1_M's f16 is the top nibbles of the 4 u16 scale words at 48–55 (word 0's lowest).
    "IQ1_M": (Q.IQ1_M, 8, IQ1_M_D),
    "TQ1_0": (Q.TQ1_0, 8, [52]),
    "TQ2_0": (Q.TQ2_0, 8, [64]),
}

EXTREME = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF],
                   dtype=np.uint16)


def scale_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` finite f16 bit patterns: 3/4 weight-like, 1/8 any finite, 1/8 extreme; the first
    is always extreme and the second any finite, so every format gets both."""
    kind = rng.integers(0, 8, n)
    kind[:2] = [7, 6]
    mag = 10.0 ** rng.uniform(-5, 0, n)
    sign = np.where(rng.integers(0, 2, n) == 1, -1.0, 1.0)
    bits = (mag * sign).astype(np.float16).view(np.uint16)
    anything = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    # Exponent all ones is inf/NaN: clear its lowest exponent bit to stay finite.
    anything = np.where(anything & 0x7C00 == 0x7C00, anything & ~np.uint16(0x0400), anything)
    bits = np.where(kind == 6, anything, bits)
    bits = np.where(kind == 7, EXTREME[rng.integers(0, len(EXTREME), n)], bits)
    assert np.isfinite(bits.astype(np.uint16).view(np.float16)).all()
    return bits.astype(np.uint16)


def main():
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    data = bytearray()
    entries = []
    for name, (qtype, nblocks, f16_at) in FORMATS.items():
        elems, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
        if f16_at == IQ1_M_D:
            d = scale_bits(rng, nblocks)
            for w in range(4):
                nib = ((d >> (4 * w)) & 0x0F).astype(np.uint8)
                blocks[:, 49 + 2 * w] = (blocks[:, 49 + 2 * w] & 0x0F) | (nib << 4)
            f16_at = []
        for at in f16_at:
            blocks[:, at:at + 2] = scale_bits(rng, nblocks).astype("<u2").view(np.uint8).reshape(nblocks, 2)
        values = gguf.quants.dequantize(blocks.reshape(-1), qtype).reshape(-1)
        assert values.dtype == np.float32 and values.size == nblocks * elems, name
        assert np.isfinite(values).all(), name
        src_offset = len(data)
        data += blocks.tobytes()
        dst_offset = len(data)
        data += values.astype("<f4").tobytes()
        entries.append({
            "format": name,
            "blocks": nblocks,
            "src_offset": src_offset,
            "src_bytes": nblocks * size,
            "dst_offset": dst_offset,
            "dst_values": nblocks * elems,
        })
    (OUT / "blocks.bin").write_bytes(bytes(data))
    lines = [
        "{",
        f'"generator": "tools/quant_fixtures.py", "seed": {SEED},',
        f'"reference": "gguf {version("gguf")}, numpy {np.__version__}: gguf.quants.dequantize",',
        '"data": "blocks.bin",',
        '"entries": [',
        ",\n".join(json.dumps(e) for e in entries),
        "]",
        "}",
    ]
    index = "\n".join(lines) + "\n"
    json.loads(index)  # well-formed
    (OUT / "index.json").write_text(index)
    print(f"{OUT}: {len(entries)} formats, {len(data)} bytes")


if __name__ == "__main__":
    main()
