#!/usr/bin/env python3
"""qkv-server against the official `openai` Python client, as `.ci/run` runs it.

    python3 tools/openai_client_test.py [--server target/release/qkv-server] [--model GGUF]

Starts qkv-server on a free loopback port with the default model, then, with the `openai`
package: chat and completion, each whole and streamed (streamed text equal to the whole
text at temperature 0, usage in the last chunk), stop strings, logprobs, a refused request
surfacing as the client's BadRequestError, and the models list. Then a bounded load test from
a separate process (tools/server_load.py: 16 concurrent streams of 32 tokens). Stops the
server with SIGTERM and checks that it exits 0. Then a second server with `--api-key`: a
wrong key surfaces as the client's AuthenticationError, the right one passes. Prints `N passed, 0 failed` at the end; any failure exits non-zero.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSED = []


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    PASSED.append(name)
    print(f"ok - {name}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd):
    """Starts qkv-server with `cmd` (plus a free port); returns the process and its base URL
    once it listens."""
    port = free_port()
    server = subprocess.Popen(cmd + ["--port", str(port)], stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        print(line, end="", file=sys.stderr)
        if "listening on" in line:
            break
    else:
        sys.exit("qkv-server exited before listening")
    return server, f"http://127.0.0.1:{port}/v1"


def terminate(server):
    """SIGTERM, then the exit code (or "timeout")."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return "timeout"


def api_keys(args, openai):
    """A server with --api-key: a wrong key is refused with 401, the right one passes."""
    cmd = [args.server, "--ctx", "256", "--model-name", "smollm2", "--api-key", "sk-qkv-test"]
    if args.model:
        cmd += ["--model", args.model]
    server, base = start(cmd)
    try:
        wrong = openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0)
        try:
            wrong.models.list()
            check("wrong API key refused", False, "no error")
        except openai.AuthenticationError as e:
            check("wrong API key refused", e.status_code == 401 and e.code == "invalid_api_key"
                  and e.type == "authentication_error", e)
        right = openai.OpenAI(base_url=base, api_key="sk-qkv-test", max_retries=0)
        comp = right.completions.create(model="any-name", prompt="The capital of France is",
                                        max_tokens=4, temperature=0)
        check("right API key accepted", comp.usage.completion_tokens == 4
              and comp.model == "smollm2", comp)
    finally:
        code = terminate(server)
    check("SIGTERM exits 0 (keys)", code == 0, code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=str(ROOT / "target/release/qkv-server"))
    ap.add_argument("--model")
    args = ap.parse_args()

    import openai

    cmd = [args.server, "--ctx", "1024", "--model-name", "smollm2"]
    if args.model:
        cmd += ["--model", args.model]
    server, base = start(cmd)
    try:
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)

        models = client.models.list()
        check("models list", models.data[0].id == "smollm2", models)

        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=24,
                                               temperature=0)
        text = whole.choices[0].message.content
        check("chat, whole", "Paris" in text, text)
        check("chat usage", whole.usage.total_tokens
              == whole.usage.prompt_tokens + whole.usage.completion_tokens, whole.usage)
        parts, usage = [], None
        for chunk in client.chat.completions.create(
                model="smollm2", messages=msgs, max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        check("chat, streamed = whole", "".join(parts) == text, parts)
        check("chat, streamed usage", usage is not None
              and usage.completion_tokens == whole.usage.completion_tokens, usage)

        prompt = "The capital of France is"
        comp = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12,
                                         temperature=0)
        ctext = comp.choices[0].text
        check("completion, whole", "Paris" in ctext, ctext)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=12, temperature=0, stream=True)
            if c.choices)
        check("completion, streamed = whole", streamed == ctext, streamed)
        stop = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12,
                                         temperature=0, stop=["Paris"])
        check("stop string", stop.choices[0].text == ctext[:ctext.index("Paris")]
              and stop.choices[0].finish_reason == "stop", stop.choices[0])
        lp = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4,
                                            temperature=0, logprobs=True, top_logprobs=2)
        content = lp.choices[0].logprobs.content
        check("logprobs", len(content) == lp.usage.completion_tokens
              and all(len(t.top_logprobs) == 2 for t in content), content)
        try:
            client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=10**6)
            check("too many tokens refused", False, "no error")
        except openai.BadRequestError as e:
            check("too many tokens refused", "context" in str(e), e)

        load = subprocess.run(
            [sys.executable, str(ROOT / "tools/server_load.py"), "--base-url", base,
             "--streams", "16", "--max-tokens", "32", "--prompt-tokens", "64"],
            capture_output=True, text=True, timeout=600)
        print(load.stdout + load.stderr, end="")
        check("16 concurrent streams from another process", load.returncode == 0, load.stderr)
    finally:
        code = terminate(server)
    check("SIGTERM exits 0", code == 0, code)
    api_keys(args, openai)
    print(f"{len(PASSED)} passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"not ok - {e}")
        print(f"{len(PASSED)} passed, 1 failed")
        sys.exit(1)
