#!/usr/bin/env python3
"""Renders every chat template in llama.cpp's `models/templates/` with transformers, as the
references tests/chat_templates.rs compares qkv's renderer against.

    python3 tools/template_fixtures.py [TEMPLATES_DIR] [-o OUT.json]

TEMPLATES_DIR defaults to the llama.cpp source that `python3 tools/quantized_models.py` unpacks
into $QKV_CACHE/llamacpp; OUT defaults to $QKV_CACHE/chat_templates/references.json (the path
the test reads). Prints OUT on stdout.

Each template is rendered through a real `PreTrainedTokenizerFast.apply_chat_template(...,
tokenize=False)`, the call users make, whose special tokens map gives the template `bos_token`
and `eos_token`. The conversation is system, user, assistant, user; a template that refuses it
(some reject a system role) is tried on the same turns without the system message. Both are
rendered with add_generation_prompt true and false. transformers' `strftime_now` reads a
fixed clock (FIXED_NOW), which the test hands qkv too, so that the references do not go stale
at midnight. A template transformers cannot render at all is recorded with its error.

The output holds rendered text only (no template source): it is written to the cache, not
committed, since rendered templates contain pieces of them.
"""

import argparse
import datetime as dt
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as b  # noqa: E402

# What `strftime_now` reports: a single-digit day and month, so that zero padding shows.
FIXED_NOW = dt.datetime(2025, 2, 7, 9, 5, 3)
BOS, EOS = "<s>", "</s>"

# The fixed multi-turn conversation. The last user turn has surrounding whitespace (templates
# that .strip() or |trim it must agree), quotes, markup and non-ASCII text.
SYSTEM = {"role": "system", "content": "You are a careful assistant. Keep answers short."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": '  And of Japan? Say "Tokyo" & <b>why</b>, in Français ✓.\n'},
]
# One tool, for templates that need a tool list (the `tool_use` ones) and to exercise `tojson`
# on nested data everywhere; keys in the order a caller would write them.
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "days": {"type": "integer", "description": "Forecast days, 1 to 3"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]
# A conversation with a tool call and its result: richer message values (tool_calls with
# arguments as a mapping, a `tool` role).
TOOL_CALL = [
    SYSTEM,
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
    }]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": '{"temperature": 18.5, "sky": "clear"}'},
]
CONVERSATIONS = {"with_system": [SYSTEM] + TURNS, "without_system": TURNS, "tool_call": TOOL_CALL}


def templates_dir():
    return (b.cache_dir() / "llamacpp" / f"llama_cpp_python-{b.LLAMA_CPP_PY_VERSION}" / "vendor"
            / "llama.cpp" / "models" / "templates")


def tokenizer():
    """A two-token tokenizer whose special tokens map is {bos_token, eos_token}: rendering
    with tokenize=False never reads its vocabulary."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({BOS: 0, EOS: 1}, unk_token=None))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS)


def fix_clock():
    """Makes transformers' `strftime_now` read FIXED_NOW."""
    import transformers.utils.chat_template_utils as ctu

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return FIXED_NOW

    ctu.datetime = Clock


def reason(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".strip()


def render(tok, conversation: str, tools: bool, gen: bool) -> dict:
    text = tok.apply_chat_template(CONVERSATIONS[conversation], tools=TOOLS if tools else None,
                                   tokenize=False, add_generation_prompt=gen)
    return {"conversation": conversation, "tools": tools, "add_generation_prompt": gen,
            "text": text}


def render_all(tok, source: str) -> dict:
    """The fixed conversation with a system message, else without it, else either with the
    tool list: the first that transformers renders is the template's conversation, rendered
    with add_generation_prompt true and false. Then, as extra cases where transformers renders
    them: the same with tools (when not already), and the tool-call conversation."""
    tok.chat_template = source
    rejected = {}
    renders = None
    for tools in (False, True):
        for name in ("with_system", "without_system"):
            try:
                renders = [render(tok, name, tools, gen) for gen in (True, False)]
                break
            except Exception as e:  # noqa: BLE001 - any failure is recorded, whatever it is
                rejected[name + (" with tools" if tools else "")] = reason(e)
        if renders:
            break
    if not renders:
        return {"transformers_fails": "; ".join(f"{k}: {v}" for k, v in rejected.items())}
    base = renders[0]["conversation"]
    extra = [(base, True, True)] if not renders[0]["tools"] else []
    extra.append(("tool_call", True, True))
    for conversation, tools, gen in extra:
        try:
            renders.append(render(tok, conversation, tools, gen))
        except Exception as e:  # noqa: BLE001
            what = conversation + (" with tools" if tools else "")
            rejected[what] = reason(e)
    return {"conversation": base, "rejected": rejected, "renders": renders}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("templates", nargs="?", type=Path, default=None)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args()
    src = args.templates or templates_dir()
    files = sorted(src.glob("*.jinja"))
    if not files:
        sys.exit(f"no *.jinja in {src}: run `python3 tools/quantized_models.py` first")
    out = args.out or b.cache_dir() / "chat_templates" / "references.json"

    import jinja2
    import transformers

    fix_clock()
    tok = tokenizer()
    entries = []
    for f in files:
        source = f.read_text(encoding="utf-8")
        entry = {"name": f.name, "sha256": hashlib.sha256(source.encode()).hexdigest()}
        entry.update(render_all(tok, source))
        entries.append(entry)
        status = entry.get("conversation") or "transformers fails"
        print(f"[templates] {f.name}: {status}", file=sys.stderr)
    doc = {
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "templates_dir": str(src.resolve()),
        "now": FIXED_NOW.isoformat(),
        "now_unix": int(FIXED_NOW.replace(tzinfo=dt.timezone.utc).timestamp()),
        "bos_token": BOS,
        "eos_token": EOS,
        "conversations": CONVERSATIONS,
        "tools": TOOLS,
        "templates": entries,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(out)
    ok = sum("renders" in e for e in entries)
    print(f"[templates] transformers renders {ok} of {len(entries)}", file=sys.stderr)
    print(out)


if __name__ == "__main__":
    main()
