"""The package against the `decode` CLI on the default model (SmolLM2-135M-Instruct, Q4_1):
the same greedy tokens, streaming equal to non-streaming, the engine equal to one session;
and embeddings of all-MiniLM-L6-v2 equal to `decode embed`'s."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import qkv

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def decode_json(decode_bin: str, model: str, prompt: str, n: int, chat: bool = False) -> list[dict]:
    args = [decode_bin, "--model", model, "--prompt", prompt, "-n", str(n), "--temperature", "0", "--json"]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=300).stdout
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    return [l for l in lines if "stats" not in l]


def session_ids(llm: qkv.Llama, body: dict, chat: bool = False) -> list[int]:
    """The token ids a greedy run of ``body`` generates on ``llm``'s session."""
    plan = (llm._model.plan_chat if chat else llm._model.plan_completion)(json.dumps(body), 0)
    s = llm._session
    s.start(plan)
    ids = []
    while (t := s.next()) is not None:
        ids.append(t[0])
    return ids


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_decode(default_llm: qkv.Llama, default_model_path: str, decode_bin: str, prompt: str) -> None:
    want = decode_json(decode_bin, default_model_path, prompt, 48)
    got = session_ids(default_llm, {"prompt": prompt, "max_tokens": 48, "temperature": 0})
    assert got == [w["id"] for w in want]
    # The public API's text is decode's (special tokens, which decode prints, aside).
    text = default_llm(prompt, max_tokens=48, temperature=0)["choices"][0]["text"]
    assert text == "".join(w["text"] for w in want if not default_llm._model.is_special(w["id"]))


def test_chat_greedy_tokens_equal_decode(default_llm: qkv.Llama, default_model_path: str, decode_bin: str) -> None:
    prompt = "What is the capital of France?"
    want = decode_json(decode_bin, default_model_path, prompt, 40, chat=True)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40, "temperature": 0}
    assert session_ids(default_llm, body, chat=True) == [w["id"] for w in want]


def test_stream_equals_whole(default_llm: qkv.Llama) -> None:
    msgs = [{"role": "user", "content": "Name three colors."}]
    whole = default_llm.create_chat_completion(msgs, max_tokens=40, temperature=0)
    chunks = list(default_llm.create_chat_completion(msgs, max_tokens=40, temperature=0, stream=True))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    comp = default_llm("Once upon a time", max_tokens=40, temperature=0)
    parts = list(default_llm("Once upon a time", max_tokens=40, temperature=0, stream=True))
    assert "".join(p["choices"][0]["text"] for p in parts) == comp["choices"][0]["text"]


def test_engine_equals_session(default_llm: qkv.Llama, default_model_path: str) -> None:
    with qkv.Engine(default_model_path, n_ctx=512, max_sequences=4) as eng:
        for prompt in PROMPTS:
            a = default_llm(prompt, max_tokens=32, temperature=0)["choices"][0]["text"]
            b = eng(prompt, max_tokens=32, temperature=0)["choices"][0]["text"]
            assert a == b, prompt


def test_default_model_when_no_path(default_model_path: str) -> None:
    assert qkv.default_model_path() == default_model_path


TEXTS = ["A man is eating food.", "The new movie is awesome", "", "Ünïcödé and emoji 🙂 text", "word " * 300]


def test_embeddings_equal_decode_embed(embed_model_path: str, decode_bin: str) -> None:
    llm = qkv.Llama(embed_model_path)
    out = llm.create_embedding(TEXTS)
    got = np.stack([d["embedding"] for d in out["data"]])
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 384)
    run = subprocess.run(
        [decode_bin, "embed", "--model", embed_model_path],
        input="\n".join(TEXTS) + "\n",
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    want = np.array([json.loads(l) for l in run.stdout.splitlines()], dtype=np.float32)
    assert np.array_equal(got, want)
    one = llm.embed("A man is eating food.")
    assert one.shape == (384,) and np.array_equal(one, got[0])
    assert out["usage"]["prompt_tokens"] > 0
    with pytest.raises(qkv.InvalidRequestError, match="encoder"):
        llm.create_completion("hi")
