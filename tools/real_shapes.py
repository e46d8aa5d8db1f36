#!/usr/bin/env python3
"""Random-weight GGUF files at the layer shapes of the Llama models people run, for speed.

    python3 tools/real_shapes.py [--models 1b,3b,8b] [--types F16,Q4_0,Q4_K_M,...]

Prints one line per file made or found: `<model> <type> <path>`.

Speed does not depend on the weights' values, only on the shapes and the storage format, so
these files stand in for Llama 3.2 1B, Llama 3.2 3B and Llama 3.1 8B in the benchmarks. They
carry the default model's vocabulary (SmolLM2's 49,152 tokens, its tokenizer and chat template
copied from its GGUF), so both engines tokenize prompts the same way; the embedding and output
matrices are therefore smaller than the real models' (128,256 rows), and the benchmarks count
the bytes of the file they ran.

What it does, idempotently, under $QKV_CACHE/shapes (QKV_CACHE defaults as in fetch/src/lib.rs):

1. Writes `<model>.F16.gguf` tensor by tensor with gguf-py: the header and tensor table first,
   then each tensor's values, generated and written one at a time, so that even the 8B file
   (16 GB) needs no more memory than its largest tensor. Weights are normal with standard
   deviation 0.02 (as the models were initialised), norms are 1, so activations stay finite.
2. Quantizes it with llama.cpp's `llama-quantize` (built once by tools/peers.py's
   `ensure_llamacpp`) into each asked type. The F16 source of the 3B and 8B files is removed
   afterwards unless F16 was asked for, since nothing else reads it.

Shapes (hidden, layers, heads, KV heads, FFN, RoPE base; head size 128 everywhere):
  1b: 2048, 16, 32, 8, 8192, 500000 (tied output head, as Llama 3.2 1B)
  3b: 3072, 28, 24, 8, 8192, 500000 (tied output head, as Llama 3.2 3B)
  8b: 4096, 32, 32, 8, 14336, 500000 (its own output head, as Llama 3.1 8B)
  30b-a3b: Qwen3-30B-A3B's layers (architecture qwen3moe: hidden 2048, 32 heads, 4 KV heads,
           QK-norm, 128 experts of FFN 768 with 8 used per token, RoPE base 1e6), cut to 4
           layers so that the file stays a few GB; its own output head.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402

SHAPES = {
    # name: (hidden, layers, heads, kv_heads, ffn, rope_base, tied)
    "1b": (2048, 16, 32, 8, 8192, 500000.0, True),
    "3b": (3072, 28, 24, 8, 8192, 500000.0, True),
    "8b": (4096, 32, 32, 8, 14336, 500000.0, False),
}
# A mixture of experts: (hidden, layers, heads, kv_heads, experts, used, expert_ffn, rope_base).
MOE_SHAPES = {"30b-a3b": (2048, 4, 32, 4, 128, 8, 768, 1000000.0)}
DEFAULT_TYPES = {"1b": "F16,Q4_0,Q4_K_M,Q5_K_M,Q6_K,Q8_0", "3b": "Q4_0,Q4_K_M,Q8_0",
                 "8b": "Q4_0,Q4_K_M", "30b-a3b": "Q4_K_M,Q8_0"}


def log(msg):
    print(f"[shapes] {msg}", file=sys.stderr, flush=True)


def tensors(shape):
    """(name, GGUF shape [cols, rows] as ggml lists it, kind) in the order llama.cpp's
    converter writes them."""
    hidden, layers, heads, kv_heads, ffn, _, tied = shape
    head = hidden // heads
    out = [("token_embd.weight", (hidden, VOCAB), "w")]
    for i in range(layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (hidden,), "norm"),
            (p + "attn_q.weight", (hidden, heads * head), "w"),
            (p + "attn_k.weight", (hidden, kv_heads * head), "w"),
            (p + "attn_v.weight", (hidden, kv_heads * head), "w"),
            (p + "attn_output.weight", (heads * head, hidden), "w"),
            (p + "ffn_norm.weight", (hidden,), "norm"),
            (p + "ffn_gate.weight", (hidden, ffn), "w"),
            (p + "ffn_up.weight", (hidden, ffn), "w"),
            (p + "ffn_down.weight", (ffn, hidden), "w"),
        ]
    out.append(("output_norm.weight", (hidden,), "norm"))
    if not tied:
        out.append(("output.weight", (hidden, VOCAB), "w"))
    return out


VOCAB = 49152  # the default model's


def moe_tensors(shape):
    """As `tensors`, for a qwen3moe shape: per layer the QK-norms, the router and the experts'
    3-D tensors."""
    hidden, layers, heads, kv_heads, experts, _, eff, _ = shape
    head = 128
    out = [("token_embd.weight", (hidden, VOCAB), "w")]
    for i in range(layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (hidden,), "norm"),
            (p + "attn_q.weight", (hidden, heads * head), "w"),
            (p + "attn_q_norm.weight", (head,), "norm"),
            (p + "attn_k.weight", (hidden, kv_heads * head), "w"),
            (p + "attn_k_norm.weight", (head,), "norm"),
            (p + "attn_v.weight", (hidden, kv_heads * head), "w"),
            (p + "attn_output.weight", (heads * head, hidden), "w"),
            (p + "ffn_norm.weight", (hidden,), "norm"),
            (p + "ffn_gate_inp.weight", (hidden, experts), "router"),
            (p + "ffn_gate_exps.weight", (hidden, eff, experts), "w"),
            (p + "ffn_up_exps.weight", (hidden, eff, experts), "w"),
            (p + "ffn_down_exps.weight", (eff, hidden, experts), "w"),
        ]
    out.append(("output_norm.weight", (hidden,), "norm"))
    out.append(("output.weight", (hidden, VOCAB), "w"))
    return out


def write_f16(name: str, path: Path, source: Path):
    import gguf

    moe = name in MOE_SHAPES
    src = gguf.GGUFReader(str(source))
    tmp = path.with_suffix(".tmp")
    if moe:
        shape = MOE_SHAPES[name]
        hidden, layers, heads, kv_heads, experts, used, eff, rope_base = shape
        w = gguf.GGUFWriter(str(tmp), "qwen3moe")
        w.add_name(f"qkv random weights at Qwen3 {name.upper()} shapes, {layers} layers")
        w.add_context_length(40960)
        w.add_embedding_length(hidden)
        w.add_block_count(layers)
        w.add_feed_forward_length(6144)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(128)
        w.add_value_length(128)
        w.add_rope_freq_base(rope_base)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        w.add_expert_feed_forward_length(eff)
        plan = moe_tensors(shape)
    else:
        shape = SHAPES[name]
        hidden, layers, heads, kv_heads, ffn, rope_base, _ = shape
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name(f"qkv random weights at Llama {name.upper()} shapes")
        w.add_context_length(131072)
        w.add_embedding_length(hidden)
        w.add_block_count(layers)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(hidden // heads)
        w.add_rope_freq_base(rope_base)
        w.add_layer_norm_rms_eps(1e-5)
        plan = tensors(shape)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # The default model's tokenizer and chat template, field by field.
    for key, field in src.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub)
    for tname, dims, kind in plan:
        rows_first = tuple(reversed(dims))  # numpy's order
        dtype = np.float32 if kind in ("norm", "router") else np.float16
        nbytes = int(np.prod(dims)) * np.dtype(dtype).itemsize
        w.add_tensor_info(tname, rows_first, np.dtype(dtype), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(20261127)
    for i, (tname, dims, kind) in enumerate(plan):
        rows_first = tuple(reversed(dims))
        if kind == "norm":
            data = np.ones(rows_first, dtype=np.float32)
        elif kind == "router":
            data = rng.standard_normal(rows_first, dtype=np.float32) * 0.02
        else:
            # Row blocks of ~64 MB keep the float32 intermediate small (3-D expert tensors
            # are filled as their rows).
            data = np.empty(rows_first, dtype=np.float16)
            flat = data.reshape(-1, rows_first[-1])
            step = max(1, (1 << 24) // rows_first[-1])
            for r in range(0, flat.shape[0], step):
                block = rng.standard_normal((min(step, flat.shape[0] - r), rows_first[-1]),
                                            dtype=np.float32)
                flat[r:r + step] = block * 0.02
        w.write_tensor_data(data)
        if i % 16 == 0:
            log(f"  {path.name}: {i + 1}/{len(plan)} tensors")
    w.close()
    tmp.rename(path)


def ensure(name: str, types) -> dict:
    """Makes (once) the files of model `name` in each of `types` (F16 or llama-quantize
    types) and returns {type: path}."""
    if name not in SHAPES and name not in MOE_SHAPES:
        sys.exit(f"unknown model {name!r}: the shapes are {', '.join([*SHAPES, *MOE_SHAPES])}")
    cache = peers.cache_dir()
    out_dir = cache / "shapes"
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = "qwen3moe" if name in MOE_SHAPES else "llama"
    paths = {ty: out_dir / f"{arch}-{name}.{ty}.gguf" for ty in types}
    wanted = [ty for ty, path in paths.items() if not path.is_file()]
    if not wanted:
        return paths
    source = cache / peers.SOURCE_GGUF
    if not source.is_file():
        sys.exit(f"{source} missing: run `cargo run --release --bin decode -- --prompt Hi -n 1` "
                 "once to fetch the default model")
    _, quant = peers.ensure_llamacpp(cache / "llamacpp")
    f16 = out_dir / f"{arch}-{name}.F16.gguf"
    if not f16.is_file():
        log(f"writing {f16} (random weights, tensor by tensor)")
        write_f16(name, f16, source)
    for ty in wanted:
        if ty == "F16":
            continue
        target = paths[ty]
        log(f"quantizing {f16.name} -> {target.name}")
        tmp = target.with_suffix(".tmp")
        with open(out_dir / f"quantize-{name}-{ty}.log", "w") as qlog:
            subprocess.run([str(quant), str(f16), str(tmp), ty], check=True, stdout=qlog,
                           stderr=subprocess.STDOUT)
        tmp.rename(target)
    if "F16" not in types and name != "1b" and f16.is_file():
        log(f"removing the F16 source {f16.name}")
        f16.unlink()
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="1b,8b", help="comma list of 1b, 3b, 8b, 30b-a3b (default 1b,8b)")
    ap.add_argument("--types", help="comma list of F16 and llama-quantize types "
                    "(default per model: " + "; ".join(f"{k}: {v}" for k, v in DEFAULT_TYPES.items())
                    + ")")
    args = ap.parse_args()
    for name in args.models.split(","):
        types = (args.types or DEFAULT_TYPES.get(name, "")).split(",")
        for ty, path in ensure(name, types).items():
            print(f"{name} {ty} {path}", flush=True)


if __name__ == "__main__":
    main()
