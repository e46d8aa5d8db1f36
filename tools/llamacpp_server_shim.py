#!/usr/bin/env python3
"""Stands in for `llama-server` when llama.cpp's server tests start it (LLAMA_SERVER_BIN_PATH).

tools/llamacpp_server_suite.py points the tests at this file. It execs one of two servers,
QKV_SHIM_SERVER (qkv-server, or llama-server itself as the control; QKV_SHIM_BACKEND says
which, for the log), with the command line the tests wrote, unchanged but for the model's
source: nothing can be downloaded here, so `--hf-repo`, `--hf-file`, `--model-url` and
`--model` (and their short forms) become one `--model QKV_SHIM_MODEL`, the local file both
servers run. That file is the stand-in QKV_SHIM_MAP names for the repository asked for (a JSON
map that tools/llamacpp_suite_models.py writes: a LoRA base, an infill-capable model), else
QKV_SHIM_MODEL (the default SmolLM2-135M-Instruct Q4_1). qkv-server reads llama-server's flags
itself: there is no mapping here.

A router started with no model and no `--models-dir`/`--models-preset` serves llama-server's
download cache; here the cache is stood in for by a preset file that names the models the
router tests ask for (ROUTER_CACHE), each its stand-in, for both servers alike.
"""

import json
import os
import sys
import tempfile

# llama-server's flags that say where the model comes from; each takes a value.
MODEL_FLAGS = {"--model", "-m", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff",
               "--model-url", "-mu"}


def log(msg):
    print(f"shim: {msg}", file=sys.stderr, flush=True)


REPO_FLAGS = {"--hf-repo", "-hf", "-hfr"}


def stand_ins():
    """{repository: local file} from QKV_SHIM_MAP (empty without it)."""
    path = os.environ.get("QKV_SHIM_MAP")
    if not path:
        return {}
    with open(path) as f:
        return json.load(f).get("repos", {})


def stand_in(repo, model):
    """The local file for a repository (its `:QUANT` tag aside), else `model`."""
    if repo is None:
        return model
    return stand_ins().get(repo.split(":")[0], model)


def with_local_model(argv, model):
    """`argv` with its model flags replaced by one `--model FILE` (none when it had none):
    the stand-in of the `--hf-repo` it names, else `model`."""
    repo = next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] in REPO_FLAGS), None)
    local = stand_in(repo, model)
    args, has_model, i = [], False, 0
    while i < len(argv):
        flag = argv[i]
        if flag in MODEL_FLAGS and i + 1 < len(argv):
            log(f"{flag} {argv[i + 1]} -> --model {local}")
            if not has_model:
                args += ["--model", local]
                has_model = True
            i += 2
            continue
        args.append(flag)
        i += 1
    return args


# The cached models llama.cpp's router tests name (tests/unit/test_router.py).
ROUTER_CACHE = ["ggml-org/tinygemma3-GGUF:Q8_0", "ggml-org/test-model-stories260K:F32",
                "ggml-org/test-model-stories260K-infill:F32"]


def with_stand_in_cache(args, model):
    """`args` of a router over the download cache with a preset standing in for that cache."""
    if "--model" in args or "--models-dir" in args or "--models-preset" in args:
        return args
    fd, path = tempfile.mkstemp(prefix="qkv-shim-cache-", suffix=".ini")
    with os.fdopen(fd, "w") as f:
        for name in ROUTER_CACHE:
            f.write(f"[{name}]\nmodel = {stand_in(name, model)}\n\n")
    log(f"router over the download cache -> --models-preset {path}")
    return args + ["--models-preset", path]


def main():
    backend = os.environ.get("QKV_SHIM_BACKEND")
    server = os.environ.get("QKV_SHIM_SERVER")
    model = os.environ.get("QKV_SHIM_MODEL")
    if backend not in ("qkv", "llama") or not server or not model:
        sys.exit("shim: set QKV_SHIM_BACKEND (qkv or llama), QKV_SHIM_SERVER and QKV_SHIM_MODEL")
    args = with_stand_in_cache(with_local_model(sys.argv[1:], model), model)
    log(f"exec {server} {' '.join(args)}")
    os.execv(server, [server, *args])


if __name__ == "__main__":
    main()
