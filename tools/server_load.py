#!/usr/bin/env python3
"""A bounded load generator for OpenAI-compatible servers (qkv-server, llama-server).

    python3 tools/server_load.py --base-url http://127.0.0.1:8080/v1 --streams 16 \
        [--requests 2] [--prompt-tokens 128] [--max-tokens 128] [--model NAME] [--json]
        [--prompt-style open|copy]

`--streams` clients run at once, each sending `--requests` streamed completions one after the
other (a closed loop), with prompts of about `--prompt-tokens` tokens cut from CPython's
documentation topics (each request its own slice, so no two share a prefix; `--first-prompt`
skips the slices an earlier run against the same server used, so that no run finds its
prompts in a server's prefix cache) and
`max_tokens` = `--max-tokens` with `ignore_eos`, so every request generates the same number of
tokens. Measured with the official `openai` client: time to first token (first content
chunk), inter-token latency (between content chunks), and the aggregate generated tokens per
second over the whole run (usage from `stream_options.include_usage`). Everything is bounded:
the number of requests, each request's tokens, and a per-request timeout. Prints a summary, or
one JSON object with `--json`.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time


def words():
    from pydoc_data import topics

    text = " ".join(topics.topics[k] for k in sorted(topics.topics))
    return text.split()


def prompts(n, prompt_tokens, first=0, style="open"):
    """`n` distinct prompts of about `prompt_tokens` tokens (~0.75 words per token), slices
    `first..first + n` of the text; past its end, the slices wrap round. With `style`
    "copy", each slice is followed by a blank line and its own first quarter, so that the
    text goes on by repeating itself (what speculative decoding's drafts can follow)."""
    w = words()
    per = max(1, int(prompt_tokens * 0.75))
    slices = len(w) // per
    if slices == 0:
        sys.exit("the prompt text is shorter than one prompt")
    out = []
    for i in range(first, first + n):
        piece = w[(i % slices) * per:(i % slices + 1) * per]
        text = " ".join(piece)
        if style == "copy":
            text += "\n\n" + " ".join(piece[:max(1, per // 4)])
        out.append(text)
    return out


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


async def one(client, model, prompt, max_tokens, timeout):
    start = time.perf_counter()
    first, last, gaps, tokens, text = None, None, [], 0, []
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        timeout=timeout)
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            text.append(chunk.choices[0].text)
            if first is None:
                first = now
            else:
                gaps.append(now - last)
            last = now
        if getattr(chunk, "usage", None):
            tokens = chunk.usage.completion_tokens
    return {"ttft": (first or time.perf_counter()) - start, "gaps": gaps, "tokens": tokens,
            "text": "".join(text)}


async def run(args):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=args.base_url, api_key="none", max_retries=0)
    model = args.model
    if model is None:
        model = (await client.models.list()).data[0].id
    ps = prompts(args.streams * args.requests, args.prompt_tokens, args.first_prompt,
                 args.prompt_style)

    async def worker(i):
        out = []
        for k in range(args.requests):
            out.append(await one(client, model, ps[i * args.requests + k], args.max_tokens,
                                 args.timeout))
        return out

    t0 = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(worker(i) for i in range(args.streams)))
               for r in rs]
    wall = time.perf_counter() - t0
    await client.close()
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)
    return {
        "streams": args.streams, "requests": len(results), "tokens": tokens,
        "wall_s": wall, "tok_s": tokens / wall,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(gaps, 50), "itl_p99_ms": 1e3 * percentile(gaps, 99),
        "short": sum(r["tokens"] != args.max_tokens for r in results),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--first-prompt", type=int, default=0,
                    help="the first slice of the text to use (a run's prompts are the next "
                         "streams × requests slices)")
    ap.add_argument("--prompt-style", choices=["open", "copy"], default="open",
                    help="plain slices of the text, or slices followed by their own start "
                         "(the continuation repeats them)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = asyncio.run(run(args))
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['streams']} streams, {r['requests']} requests, {r['tokens']} tokens in "
              f"{r['wall_s']:.1f} s: {r['tok_s']:.1f} tok/s; TTFT p50 {r['ttft_p50_ms']:.0f} ms "
              f"p99 {r['ttft_p99_ms']:.0f} ms; ITL p50 {r['itl_p50_ms']:.1f} ms p99 "
              f"{r['itl_p99_ms']:.1f} ms")
    if r["short"]:
        sys.exit(f"{r['short']} requests generated fewer than {args.max_tokens} tokens")


if __name__ == "__main__":
    main()
