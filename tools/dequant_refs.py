#!/usr/bin/env python3
"""Records gguf-py's dequantization of every quantized tensor of the real quantized files.

    pip install gguf numpy
    python3 tools/dequant_refs.py

For the default model in every quantized format the tests run (the files
tools/quantized_models.py makes into $QKV_QUANT_MODELS, else $QKV_CACHE/llamacpp/models, and
the published Q4_1 file), each tensor stored in a block format is dequantized with
`gguf.quants.dequantize` and the SHA-256 of its values as little-endian f32 is kept, with its
type and its shape (outermost dimension first, as qkv orders it). All of it goes into one JSON
file, $QKV_CACHE/dequant/refs.json, whose path is printed on stdout (everything else goes to
stderr). tests/dequant_files.rs dequantizes the same tensors with qkv and compares the hashes.

The file is made once: it is kept while it lists every file with the size it has now and the
same gguf-py version, and made again otherwise.
"""

import hashlib
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402

# The kinds tests/quantized_files.rs runs, besides the published Q4_1 file.
KINDS = ("Q8_0", "Q4_0", "Q5_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q2_K", "Q2_K_PURE", "Q3_K_S",
         "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S",
         "IQ2_M", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")

# Types stored as plain numbers rather than blocks: not what this checks.
Q = gguf.GGMLQuantizationType
PLAIN = {Q.F32, Q.F16, Q.BF16, Q.F64, Q.I8, Q.I16, Q.I32, Q.I64}


def log(msg):
    print(f"[dequant-refs] {msg}", file=sys.stderr, flush=True)


def files(cache: Path) -> dict:
    """{kind: path} of every file; exits naming the first one missing."""
    models = Path(os.environ.get("QKV_QUANT_MODELS") or cache / "llamacpp" / "models")
    out = {"Q4_1": cache / b.SOURCE_GGUF}
    for kind in KINDS:
        out[kind] = models / f"{b.MODEL_STEM}.{kind}.gguf"
    for kind, path in out.items():
        if not path.is_file():
            sys.exit(f"{kind}: {path} is missing (make it with `python3 tools/quantized_models.py`)")
    return out


def tensors(path: Path) -> dict:
    """{name: {type, shape, sha256}} of every block-quantized tensor of the file."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.tensor_type in PLAIN:
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        # gguf-py lists GGUF's dimensions innermost first; qkv's shapes are outermost first.
        shape = [int(d) for d in reversed(t.shape.tolist())]
        if values.size != int(np.prod(shape)):
            sys.exit(f"{path.name}: {t.name} dequantized to {values.size} values, shape {shape}")
        raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
        out[t.name] = {
            "type": t.tensor_type.name,
            "shape": shape,
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
    return out


def main():
    cache = b.cache_dir()
    target = cache / "dequant" / "refs.json"
    paths = files(cache)
    sizes = {kind: path.stat().st_size for kind, path in paths.items()}
    gguf_version = version("gguf")
    if target.is_file():
        try:
            old = json.loads(target.read_text())
            if old.get("gguf") == gguf_version and {
                k: v.get("bytes") for k, v in old.get("files", {}).items()
            } == sizes:
                log(f"{target} is up to date")
                print(target)
                return
        except (json.JSONDecodeError, AttributeError):
            pass
        log(f"{target} is stale: making it again")
    refs = {"gguf": gguf_version, "files": {}}
    for kind, path in paths.items():
        log(f"{kind}: dequantizing {path}")
        found = tensors(path)
        kinds = sorted({t["type"] for t in found.values()})
        log(f"{kind}: {len(found)} quantized tensors ({', '.join(kinds)})")
        refs["files"][kind] = {"bytes": sizes[kind], "tensors": found}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(refs, indent=1, sort_keys=True) + "\n")
    tmp.rename(target)
    print(target)


if __name__ == "__main__":
    main()
