#!/usr/bin/env python3
"""Stands in for `llama-server` when llama.cpp's server tests start it (LLAMA_SERVER_BIN_PATH).

tools/llamacpp_server_suite.py points the tests at this file. It execs one of two servers,
QKV_SHIM_SERVER (qkv-server, or llama-server itself as the control; QKV_SHIM_BACKEND says
which, for the log), with the command line the tests wrote, unchanged but for the model's
source: nothing can be downloaded here, so `--hf-repo`, `--hf-file`, `--model-url` and
`--model` (and their short forms) become one `--model QKV_SHIM_MODEL`, the local file both
servers run (the default SmolLM2-135M-Instruct Q4_1). qkv-server reads llama-server's flags
itself: there is no mapping here.
"""

import os
import sys

# llama-server's flags that say where the model comes from; each takes a value.
MODEL_FLAGS = {"--model", "-m", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff",
               "--model-url", "-mu"}


def log(msg):
    print(f"shim: {msg}", file=sys.stderr, flush=True)


def with_local_model(argv, model):
    """`argv` with its model flags replaced by one `--model model` (none when it had none)."""
    args, has_model, i = [], False, 0
    while i < len(argv):
        flag = argv[i]
        if flag in MODEL_FLAGS and i + 1 < len(argv):
            log(f"{flag} {argv[i + 1]} -> --model {model}")
            if not has_model:
                args += ["--model", model]
                has_model = True
            i += 2
            continue
        args.append(flag)
        i += 1
    return args


def main():
    backend = os.environ.get("QKV_SHIM_BACKEND")
    server = os.environ.get("QKV_SHIM_SERVER")
    model = os.environ.get("QKV_SHIM_MODEL")
    if backend not in ("qkv", "llama") or not server or not model:
        sys.exit("shim: set QKV_SHIM_BACKEND (qkv or llama), QKV_SHIM_SERVER and QKV_SHIM_MODEL")
    args = with_local_model(sys.argv[1:], model)
    log(f"exec {server} {' '.join(args)}")
    os.execv(server, [server, *args])


if __name__ == "__main__":
    main()
