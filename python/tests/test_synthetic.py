"""Every API of the qkv package on the synthetic model (written by qkv, offline)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest

import qkv


def text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["text"] for c in chunks)


def chat_text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


# -- tokens ---------------------------------------------------------------------------------


def test_tokenize_roundtrip(synthetic: qkv.Llama) -> None:
    ids = synthetic.tokenize(b"the cat sat", add_bos=False)
    assert ids and all(isinstance(i, int) for i in ids)
    assert synthetic.detokenize(ids) == b"the cat sat"
    assert synthetic.tokenize("the cat sat", add_bos=False) == ids
    # Control-token text reads as the token with special=True, as bytes without.
    eos = synthetic.token_eos()
    assert synthetic.tokenize("<|im_end|>", add_bos=False, special=True) == [eos]
    assert len(synthetic.tokenize("<|im_end|>", add_bos=False, special=False)) > 1
    assert synthetic.n_vocab() == 267


def test_bad_token_ids_are_value_errors(synthetic: qkv.Llama) -> None:
    with pytest.raises(ValueError) as e:
        synthetic.detokenize([100000])
    assert isinstance(e.value, qkv.QkvError)
    assert "100000" in str(e.value)
    with pytest.raises(qkv.InvalidRequestError):
        synthetic.tokenize(12)  # type: ignore[arg-type]


# -- completions ----------------------------------------------------------------------------


def test_completion_shape_and_greedy_determinism(synthetic: qkv.Llama) -> None:
    a = synthetic("the cat", max_tokens=8, temperature=0)
    b = synthetic.create_completion("the cat", max_tokens=8, temperature=0)
    assert a["object"] == "text_completion"
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["choices"][0]["finish_reason"] in ("stop", "length")
    u = a["usage"]
    assert u["prompt_tokens"] == len(synthetic.tokenize("the cat"))
    assert 1 <= u["completion_tokens"] <= 8
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_completion_stream_equals_whole(synthetic: qkv.Llama) -> None:
    whole = synthetic("the cat", max_tokens=24, temperature=0)
    chunks = list(synthetic("the cat", max_tokens=24, temperature=0, stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert text_of(chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_seeded_sampling_repeats(synthetic: qkv.Llama) -> None:
    a = synthetic("the cat", max_tokens=12, temperature=1.0, seed=7)
    b = synthetic("the cat", max_tokens=12, temperature=1.0, seed=7)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]


def test_token_id_prompt(synthetic: qkv.Llama) -> None:
    ids = synthetic.tokenize("the cat")
    assert synthetic(ids, max_tokens=6, temperature=0)["choices"][0]["text"] == synthetic(
        "the cat", max_tokens=6, temperature=0
    )["choices"][0]["text"]


def test_stop_strings(synthetic: qkv.Llama) -> None:
    full = synthetic("the cat", max_tokens=24, temperature=0)["choices"][0]["text"]
    # A stop string from the middle of the greedy text cuts it there.
    cut = len(full) // 2
    stop = full[cut : cut + 2]
    if not stop or len(stop) < 2:
        pytest.skip("greedy text too short")
    expect = full[: full.find(stop)]
    out = synthetic("the cat", max_tokens=24, temperature=0, stop=[stop])
    assert out["choices"][0]["text"] == expect
    assert out["choices"][0]["finish_reason"] == "stop"
    chunks = list(synthetic("the cat", max_tokens=24, temperature=0, stop=stop, stream=True, stream_options={"include_usage": True}))
    choices = [c for c in chunks if c["choices"]]
    assert text_of(choices) == expect
    assert choices[-1]["choices"][0]["finish_reason"] == "stop"
    # The whole answer's run of tokens ends at the stop string, as the stream does.
    assert chunks[-1]["usage"] == out["usage"]


def test_logprobs(synthetic: qkv.Llama) -> None:
    out = synthetic("the cat", max_tokens=4, temperature=0, logprobs=2)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == out["usage"]["completion_tokens"]
    assert all(x <= 0 for x in lp["token_logprobs"])
    assert all(len(t) <= 2 for t in lp["top_logprobs"])


def test_grammar_constrained_completion(synthetic: qkv.Llama) -> None:
    out = synthetic(
        "the cat",
        max_tokens=30,
        temperature=0.8,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}},
    )
    v = json.loads(out["choices"][0]["text"])
    assert isinstance(v["a"], int)


# -- chat -----------------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat"}]


def test_chat_shape_and_stream(synthetic: qkv.Llama) -> None:
    whole = synthetic.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)
    assert whole["object"] == "chat.completion"
    msg = whole["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    chunks = list(synthetic.create_chat_completion(MESSAGES, max_tokens=16, temperature=0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chat_text_of(chunks) == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


def test_chat_json_output(synthetic: qkv.Llama) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 5}}, "required": ["n", "s"], "additionalProperties": False}
    out = synthetic.create_chat_completion(
        MESSAGES, max_tokens=60, temperature=0.7, seed=1, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    v = json.loads(out["choices"][0]["message"]["content"])
    assert set(v) == {"n", "s"} and isinstance(v["n"], int)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": False},
        },
    }
]


def test_forced_tool_call(synthetic: qkv.Llama) -> None:
    out = synthetic.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0.5, seed=2)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert calls and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["function"]["arguments"])
    # Streamed, the same call arrives in pieces that add up to it.
    chunks = list(
        synthetic.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0.5, seed=2, stream=True)
    )
    args = "".join(
        tc["function"].get("arguments", "")
        for c in chunks
        if c["choices"]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert json.loads(args) == json.loads(calls[0]["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_errors_name_the_field(synthetic: qkv.Llama) -> None:
    with pytest.raises(qkv.InvalidRequestError) as e:
        synthetic.create_chat_completion([{"role": "user", "content": 5}])
    assert "messages[0]" in str(e.value)
    with pytest.raises(ValueError, match="temperature"):
        synthetic.create_chat_completion(MESSAGES, temperature=3)
    with pytest.raises(qkv.InvalidRequestError, match="tool_choice"):
        synthetic.create_chat_completion(MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(qkv.InvalidRequestError, match="response_format"):
        synthetic.create_chat_completion(MESSAGES, response_format={"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}})


def test_context_length_error(synthetic_path: str) -> None:
    llm = qkv.Llama(synthetic_path, n_ctx=32)
    with pytest.raises(qkv.ContextLengthError):
        llm("the cat sat on the mat " * 10, max_tokens=4)
    # The session is still usable afterwards.
    assert llm("the cat", max_tokens=2, temperature=0)["usage"]["completion_tokens"] >= 1
    # A generation stops at the end of the context with finish_reason "length".
    out = llm("the cat", max_tokens=None, temperature=0, stop=None)
    assert out["usage"]["total_tokens"] <= 32


def test_model_load_errors() -> None:
    with pytest.raises(qkv.ModelLoadError) as e:
        qkv.Llama("/nonexistent/model.gguf")
    assert "/nonexistent/model.gguf" in str(e.value)
    with pytest.raises(qkv.InvalidRequestError, match="act_bits"):
        qkv.Llama(qkv._native._synthetic_model(), act_bits=3)


def test_threads_are_per_process() -> None:
    n = qkv.threads()
    assert qkv.set_threads(n) == n
    with pytest.raises(qkv.InvalidRequestError, match="threads"):
        qkv.set_threads(n + 1)


def test_embedding_on_a_decoder_is_refused(synthetic: qkv.Llama) -> None:
    with pytest.raises(qkv.InvalidRequestError, match="encoder"):
        synthetic.create_embedding("hello")


def test_ctrl_c_stops_a_generation(synthetic_path: str) -> None:
    llm = qkv.Llama(synthetic_path, n_ctx=512)
    got = 0
    with pytest.raises(KeyboardInterrupt):
        for _ in llm("the cat", max_tokens=None, temperature=0, stream=True):
            got += 1
            if got == 3:
                os.kill(os.getpid(), signal.SIGINT)
    assert got < 50
    # The model answers again afterwards.
    assert llm("the cat", max_tokens=3, temperature=0)["usage"]["completion_tokens"] >= 1


def test_ctrl_c_stops_a_whole_answer(synthetic_path: str) -> None:
    llm = qkv.Llama(synthetic_path, n_ctx=4096)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            # Without Ctrl-C this runs to the end of the context (thousands of tokens).
            while time.monotonic() - t0 < 60:
                llm("the cat", max_tokens=None, temperature=0, ignore_eos=True)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 30
    assert llm("the cat", max_tokens=3, temperature=0)["usage"]["completion_tokens"] >= 1


def test_gil_is_released_while_computing(synthetic_path: str) -> None:
    llm = qkv.Llama(synthetic_path, n_ctx=512)
    done = threading.Event()
    ticks = 0

    def run() -> None:
        for _ in range(5):
            llm("the cat", max_tokens=200, temperature=0)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks > 5


# -- engine ---------------------------------------------------------------------------------


def test_engine_matches_llama(synthetic: qkv.Llama, synthetic_engine: qkv.Engine) -> None:
    a = synthetic("the cat", max_tokens=16, temperature=0)["choices"][0]["text"]
    b = synthetic_engine("the cat", max_tokens=16, temperature=0)["choices"][0]["text"]
    assert a == b
    ca = synthetic.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)["choices"][0]["message"]
    cb = synthetic_engine.create_chat_completion(MESSAGES, max_tokens=16, temperature=0)["choices"][0]["message"]
    assert ca == cb


def test_engine_threads(synthetic_engine: qkv.Engine) -> None:
    want = synthetic_engine("the cat", max_tokens=12, temperature=0)["choices"][0]["text"]
    outs: list[str] = []

    def one() -> None:
        outs.append(synthetic_engine("the cat", max_tokens=12, temperature=0)["choices"][0]["text"])

    ts = [threading.Thread(target=one) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert outs == [want] * 6


def test_engine_asyncio(synthetic_engine: qkv.Engine) -> None:
    want = synthetic_engine("the cat", max_tokens=12, temperature=0)["choices"][0]["text"]
    want_chat = synthetic_engine.create_chat_completion(MESSAGES, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]

    async def main() -> tuple[list[str], list[str]]:
        whole = await asyncio.gather(*[synthetic_engine.acreate_completion("the cat", max_tokens=12, temperature=0) for _ in range(5)])

        async def streamed() -> str:
            chunks = await synthetic_engine.acreate_chat_completion(MESSAGES, max_tokens=12, temperature=0, stream=True)
            return chat_text_of([c async for c in chunks])

        streams = await asyncio.gather(*[streamed() for _ in range(5)])
        return [w["choices"][0]["text"] for w in whole], list(streams)

    whole, streams = asyncio.run(main())
    assert whole == [want] * 5
    assert streams == [want_chat] * 5


def test_engine_stream_abandoned_is_cancelled(synthetic_engine: qkv.Engine) -> None:
    it = synthetic_engine("the cat", max_tokens=200, temperature=0, stream=True)
    next(it)
    it.close()
    # The engine goes on serving.
    assert synthetic_engine("the cat", max_tokens=3, temperature=0)["usage"]["completion_tokens"] >= 1


def test_engine_queue_full_is_retryable(synthetic_path: str) -> None:
    with qkv.Engine(synthetic_path, n_ctx=128, max_sequences=1, queue=1) as eng:

        async def main() -> list:
            return await asyncio.gather(
                *[eng.acreate_completion("the cat", max_tokens=40, temperature=0) for _ in range(8)], return_exceptions=True
            )

        results = asyncio.run(main())
        errors = [r for r in results if isinstance(r, Exception)]
        assert errors, "a queue of 1 took 8 requests"
        assert all(isinstance(e, qkv.OverloadedError) and e.retryable for e in errors)
        assert any(isinstance(r, dict) for r in results)


def test_engine_closed(synthetic_path: str) -> None:
    eng = qkv.Engine(synthetic_path, n_ctx=64, max_sequences=1)
    eng.close()
    with pytest.raises(qkv.EngineClosedError):
        eng("the cat", max_tokens=2)


def test_package_ships_types() -> None:
    root = os.path.dirname(qkv.__file__)
    assert os.path.isfile(os.path.join(root, "py.typed"))
    assert os.path.isfile(os.path.join(root, "_native.pyi"))


def test_docstring_examples() -> None:
    import doctest

    import qkv.engine
    import qkv.errors
    import qkv.llama

    for mod in (qkv, qkv.errors, qkv.llama, qkv.engine):
        r = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert r.failed == 0, mod.__name__
