#!/usr/bin/env python3
"""Stands in for `llama-server` when llama.cpp's server tests start it (LLAMA_SERVER_BIN_PATH).

tools/llamacpp_server_suite.py points the tests at this file. It reads llama-server's command
line as the tests write it and execs one of two servers on the local default model (no model
can be downloaded here):

- QKV_SHIM_BACKEND=qkv: qkv-server (QKV_SHIM_SERVER), with each llama-server flag mapped to
  qkv-server's equivalent. A flag with no equivalent is written to stderr (the test's log) as
  `shim: ignored ...` with the reason; none is dropped silently, and an unknown flag stops the
  shim with an error so that the table below is kept complete.
- QKV_SHIM_BACKEND=llama: llama-server itself (QKV_SHIM_SERVER), the control: its flags pass
  through unchanged except the model's (`--hf-repo`, `--hf-file`, `--model-url`, `--model`),
  which become `--model QKV_SHIM_MODEL`.

QKV_SHIM_MODEL is the GGUF file both run (the default SmolLM2-135M-Instruct Q4_1).
"""

import os
import re
import subprocess
import sys

# llama-server flags that take a value, with what qkv-server does with them. An entry is
# ("map", qkv flag), ("model", None) for the model's source, or ("ignore", reason).
VALUED = {
    "--port": ("map", "--port"),
    "--host": ("map", "--host"),
    "--threads": ("map", "--threads"),
    "-t": ("map", "--threads"),
    "--temp": ("map", "--temp"),
    "--seed": ("map", "--seed"),
    "--n-predict": ("map", "--n-predict"),
    "-n": ("map", "--n-predict"),
    "--api-key": ("map", "--api-key"),
    "--batch-size": ("map", "--step-tokens"),
    "-b": ("map", "--step-tokens"),
    "--ctx-size": ("ctx", None),
    "-c": ("ctx", None),
    "--parallel": ("parallel", None),
    "-np": ("parallel", None),
    "--alias": ("alias", None),
    "-a": ("alias", None),
    "--model": ("model", None),
    "-m": ("model", None),
    "--hf-repo": ("model", None),
    "-hf": ("model", None),
    "--hf-file": ("model", None),
    "-hff": ("model", None),
    "--model-url": ("model", None),
    "-mu": ("model", None),
    "--ubatch-size": ("ignore", "qkv's engine has no separate physical batch size"),
    "-ub": ("ignore", "qkv's engine has no separate physical batch size"),
    "--n-gpu-layers": ("ignore", "qkv runs on the CPU only"),
    "-ngl": ("ignore", "qkv runs on the CPU only"),
    "-ctk": ("ignore", "qkv keeps its KV cache in the model's activation dtype"),
    "-ctv": ("ignore", "qkv keeps its KV cache in the model's activation dtype"),
    "-fa": ("ignore", "qkv's attention is always fused; there is no switch"),
    "--pooling": ("map", "--pooling"),
    "--tags": ("map", "--tags"),
    "--model-draft": ("ignore", "no speculative decoding in qkv-server"),
    "--models-dir": ("ignore", "no router mode in qkv-server"),
    "--models-max": ("ignore", "no router mode in qkv-server"),
    "--models-preset": ("ignore", "no router mode in qkv-server"),
    "--cors-origins": ("map", "--cors-origins"),
    "--slot-save-path": ("ignore", "no slot save/restore in qkv-server"),
    "--grp-attn-n": ("ignore", "no group attention (self-extend) in qkv"),
    "--grp-attn-w": ("ignore", "no group attention (self-extend) in qkv"),
    "--lora": ("ignore", "no LoRA adapters in qkv"),
    "--spec-type": ("ignore", "no speculative decoding in qkv-server"),
    "--spec-draft-n-max": ("ignore", "no speculative decoding in qkv-server"),
    "--spec-draft-n-min": ("ignore", "no speculative decoding in qkv-server"),
    "--spec-synth-len": ("ignore", "no speculative decoding in qkv-server"),
    "--spec-synth-rates": ("ignore", "no speculative decoding in qkv-server"),
    "--reasoning-format": ("ignore", "qkv always splits <think> blocks for templates that use them"),
    "--reasoning": ("map", "--reasoning"),
    "--chat-template": ("map", "--chat-template"),
    "--chat-template-file": ("map", "--chat-template-file"),
    "--mmproj-url": ("ignore", "no vision in qkv"),
    "--media-path": ("ignore", "no vision in qkv"),
    "--sleep-idle-seconds": ("ignore", "qkv-server does not unload an idle model"),
    "--cache-ram": ("ignore", "qkv's prefix cache lives in the KV budget (--kv-budget)"),
    "--tools": ("ignore", "no built-in server tools in qkv-server"),
    "--tools-runtime": ("ignore", "no built-in server tools in qkv-server"),
    "--mcp-servers-config": ("ignore", "no MCP proxy in qkv-server"),
    "--mcp-servers-json": ("ignore", "no MCP proxy in qkv-server"),
}

# llama-server switches, with the same kinds of entry.
SWITCHES = {
    "--metrics": ("metrics", None),
    "--slots": ("map", "--slots"),
    "--no-slots": ("map", "--no-slots"),
    "--offline": ("ignore", "qkv-server never downloads when given a model file"),
    "--cont-batching": ("ignore", "qkv's engine always batches continuously"),
    "--embedding": ("map", "--embeddings"),
    "--embeddings": ("map", "--embeddings"),
    "--reranking": ("ignore", "no reranking route in qkv-server"),
    "--kv-unified": ("unified", None),
    "--swa-full": ("ignore", "qkv keeps full-size caches for sliding-window layers"),
    "--verbose": ("map", "--verbose"),
    "--context-shift": ("ignore", "no context shift in qkv: a full context ends the sequence"),
    "--no-ui": ("ignore", "qkv-server has no web UI"),
    "--no-models-autoload": ("ignore", "no router mode in qkv-server"),
    "--jinja": ("ignore", "qkv always renders the model's Jinja template"),
    "--no-jinja": ("ignore", "qkv always renders the model's Jinja template"),
    "--no-mmproj": ("ignore", "no vision in qkv"),
    "--no-cache-idle-slots": ("ignore", "qkv's prefix cache has no idle-slot switch"),
    "--ui-mcp-proxy": ("ignore", "no MCP proxy in qkv-server"),
    "--backend_sampling": ("ignore", "qkv samples on the CPU"),
}


def log(msg):
    print(f"shim: {msg}", file=sys.stderr, flush=True)


def parse(argv):
    """llama-server's argv as [(flag, value or None)], in order; exits on an unknown flag."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i]
        if flag in VALUED:
            if i + 1 >= len(argv):
                sys.exit(f"shim: {flag} needs a value")
            out.append((flag, argv[i + 1]))
            i += 2
        elif flag in SWITCHES:
            out.append((flag, None))
            i += 1
        else:
            sys.exit(f"shim: llama-server flag {flag!r} is not in the shim's table; add it")
    return out


def qkv_args(flags, model, known):
    """qkv-server's argv for llama-server's `flags`; `known`: the flags this qkv-server has
    (an older build lacks some, which are then logged as ignored)."""
    args = ["--model", model]
    ctx, parallel, metrics, unified = None, 1, False, False
    for flag, value in flags:
        kind, target = VALUED.get(flag) or SWITCHES[flag]
        if kind == "map" and target not in known:
            log(f"ignored {flag}: this qkv-server has no {target}")
        elif kind == "map":
            args += [target] if value is None else [target, value]
        elif kind == "model":
            log(f"{flag} {value} -> --model {model} (no downloads: every preset runs the local model)")
        elif kind == "ctx":
            ctx = int(value)
        elif kind == "parallel":
            parallel = int(value)
        elif kind == "alias" and "--alias" in known:
            args += ["--alias", value]
        elif kind == "alias":
            for name in value.split(","):
                args += ["--model-name", name.strip()]
        elif kind == "metrics":
            metrics = True
        elif kind == "unified":
            unified = True
        else:
            log(f"ignored {flag}{'' if value is None else ' ' + value}: {target}")
    if not any(f == "--cors-origins" for f, _ in flags) and "--cors-origins" in known:
        # llama-server allows every origin unless told otherwise, or only localhost ones
        # when its built-in tools or MCP servers are on; qkv-server none.
        if any(f in ("--tools", "--mcp-servers-config", "--mcp-servers-json") for f, _ in flags):
            log("no --cors-origins with --tools or MCP servers: --cors-origins localhost "
                "(llama-server's default then)")
            args += ["--cors-origins", "localhost"]
        else:
            log("no --cors-origins: --cors-origins * (llama-server's default: every origin)")
            args += ["--cors-origins", "*"]
    args += ["--max-sequences", str(parallel)]
    if ctx is not None:
        # llama-server splits --ctx-size over its slots, unless the cache is unified (then
        # any slot may fill the whole context); qkv's --ctx is per sequence.
        per_seq = ctx if unified else max(ctx // parallel, 1)
        if unified:
            log(f"--kv-unified: each sequence may use the whole --ctx-size {ctx}")
        log(f"--ctx-size {ctx} --parallel {parallel} -> --ctx {per_seq} --max-sequences {parallel}")
        args += ["--ctx", str(per_seq)]
    if metrics and "--metrics-llamacpp-names" in known:
        args.append("--metrics-llamacpp-names")
    if not metrics and "--no-metrics" in known:
        # llama-server serves /metrics only with --metrics.
        args.append("--no-metrics")
    elif not metrics:
        log("/metrics stays on: this qkv-server has no --no-metrics")
    return args


def llama_args(flags, model):
    """llama-server's own argv with the model's source replaced by the local file."""
    args, has_model = [], False
    for flag, value in flags:
        kind = (VALUED.get(flag) or SWITCHES[flag])[0]
        if kind == "model":
            if not has_model:
                args += ["--model", model]
                has_model = True
            log(f"{flag} {value} -> --model {model}")
            continue
        args += [flag] if value is None else [flag, value]
    return args


def main():
    backend = os.environ.get("QKV_SHIM_BACKEND")
    server = os.environ.get("QKV_SHIM_SERVER")
    model = os.environ.get("QKV_SHIM_MODEL")
    if backend not in ("qkv", "llama") or not server or not model:
        sys.exit("shim: set QKV_SHIM_BACKEND (qkv or llama), QKV_SHIM_SERVER and QKV_SHIM_MODEL")
    flags = parse(sys.argv[1:])
    if backend == "qkv":
        help_text = subprocess.run([server, "--help"], capture_output=True, text=True).stdout
        known = set(re.findall(r"--[a-z][a-z-]*", help_text))
        args = qkv_args(flags, model, known)
    else:
        args = llama_args(flags, model)
    log(f"exec {server} {' '.join(args)}")
    os.execv(server, [server, *args])


if __name__ == "__main__":
    main()
