""":class:`Llama`: one model, one sequence at a time, with llama-cpp-python's method names."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence, Union

if TYPE_CHECKING:
    import numpy as np

from . import _native
from ._shape import ChatShaper, CompletionShaper
from .errors import InvalidRequestError

#: What a generation is asked for beyond its prompt or messages, in OpenAI's spelling.
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "stop", "stream")


def _body(**fields: Any) -> str:
    """The JSON body of a request: the fields that were given (``None`` means unset)."""
    return json.dumps({k: v for k, v in fields.items() if v is not None})


def _is_encoder_dir(path: Optional[str]) -> bool:
    return bool(path) and os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, "modules.json"))
        or os.path.isfile(os.path.join(path, "sentence_bert_config.json"))
    )


def _setup_threads(n_threads: Optional[int]) -> None:
    if n_threads is not None:
        _native.set_threads(int(n_threads))


class _Generator:
    """What :class:`Llama` and :class:`qkv.Engine` share: a decoder model, requests read by
    qkv-server's readers into plans, and answers shaped as OpenAI's."""

    _model: Any
    model_path: str

    # -- tokens -----------------------------------------------------------------------

    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = True) -> list[int]:
        """The token ids of ``text`` (bytes or str). ``add_bos`` adds the tokenizer's
        beginning-of-sequence token; ``special`` reads control-token texts as those tokens.

        >>> llm = Llama(qkv._native._synthetic_model())  # doctest: +SKIP
        >>> llm.detokenize(llm.tokenize(b"the cat", add_bos=False))  # doctest: +SKIP
        b'the cat'
        """
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        if not isinstance(text, str):
            raise InvalidRequestError(f"text: expected str or bytes, got {type(text).__name__}")
        return self._model.tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens`` as the model spells them."""
        return self._model.detokenize([int(t) for t in tokens])

    def token_eos(self) -> Optional[int]:
        """The end-of-sequence token."""
        return self._model.token_eos

    def token_bos(self) -> Optional[int]:
        """The beginning-of-sequence token."""
        return self._model.token_bos

    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        return self._model.n_vocab

    def _token_bytes(self, tid: int) -> bytes:
        return self._model.detokenize([tid])

    # -- requests ---------------------------------------------------------------------

    def _completion_body(
        self,
        prompt: Union[str, list[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        top_k: int = 40,
        repeat_penalty: float = 1.0,
        seed: Optional[int] = None,
        stop: Optional[Union[str, list[str]]] = None,
        stream: bool = False,
        logprobs: Optional[int] = None,
        response_format: Optional[dict[str, Any]] = None,
        grammar: Optional[str] = None,
        stream_options: Optional[dict[str, Any]] = None,
        ignore_eos: Optional[bool] = None,
    ) -> str:
        if max_tokens is not None and max_tokens <= 0:
            max_tokens = None
        return _body(
            prompt=prompt,
            suffix=suffix,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            min_p=min_p,
            top_k=top_k,
            repeat_penalty=repeat_penalty,
            seed=seed,
            stop=stop or None,
            stream=stream,
            logprobs=logprobs,
            response_format=response_format,
            grammar=grammar,
            stream_options=stream_options,
            ignore_eos=ignore_eos,
        )

    def _chat_body(
        self,
        messages: list[dict[str, Any]],
        tools: Optional[list[dict[str, Any]]] = None,
        tool_choice: Optional[Union[str, dict[str, Any]]] = None,
        response_format: Optional[dict[str, Any]] = None,
        max_tokens: Optional[int] = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        min_p: float = 0.05,
        top_k: int = 40,
        repeat_penalty: float = 1.0,
        seed: Optional[int] = None,
        stop: Optional[Union[str, list[str]]] = None,
        stream: bool = False,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
        parallel_tool_calls: Optional[bool] = None,
        stream_options: Optional[dict[str, Any]] = None,
        ignore_eos: Optional[bool] = None,
    ) -> str:
        if max_tokens is not None and max_tokens <= 0:
            max_tokens = None
        return _body(
            messages=messages,
            tools=tools,
            tool_choice=tool_choice,
            response_format=response_format,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            min_p=min_p,
            top_k=top_k,
            repeat_penalty=repeat_penalty,
            seed=seed,
            stop=stop or None,
            stream=stream,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            parallel_tool_calls=parallel_tool_calls,
            stream_options=stream_options,
            ignore_eos=ignore_eos,
        )

    def _plan(self, route: str, body: Union[str, dict[str, Any]]) -> Any:
        if isinstance(body, dict):
            body = json.dumps(body)
        seed = int.from_bytes(os.urandom(8), "little")
        if route == "chat":
            return self._model.plan_chat(body, seed)
        return self._model.plan_completion(body, seed)

    def _shaper(self, route: str, plan: Any) -> Any:
        cls = ChatShaper if route == "chat" else CompletionShaper
        return cls(self.model_path, plan, self._token_bytes)


class Llama(_Generator):
    """A model loaded once, generating one sequence at a time (llama-cpp-python's ``Llama``).

    ``model_path`` is a GGUF file or a Hugging Face directory; ``None`` loads the default
    model (SmolLM2-135M-Instruct, fetched into ``~/.cache/qkv`` on first use, as ``decode``
    fetches it). A sentence-transformers directory (all-MiniLM-L6-v2) loads as an encoder,
    for :meth:`create_embedding`.

    ``n_ctx`` is the KV cache's length (0: the model's context), ``n_threads`` the compute
    threads (set once per process), ``act_bits`` 8 (the default, as ``decode``'s) or 16 (exact, slower prompts),
    ``kv_type`` ``"f16"``, ``"f32"`` or ``"q8_0"``.

    >>> import qkv
    >>> llm = qkv.Llama(qkv._native._synthetic_model(), n_ctx=128)
    >>> out = llm("the cat", max_tokens=4, temperature=0)
    >>> out["object"], out["usage"]["completion_tokens"] <= 4
    ('text_completion', True)
    >>> chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=3)
    >>> chat["choices"][0]["message"]["role"]
    'assistant'
    """

    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        n_ctx: int = 2048,
        n_threads: Optional[int] = None,
        act_bits: Optional[int] = None,
        kv_type: Optional[str] = None,
        embedding: Optional[bool] = None,
        n_batch: int = 32,
        verbose: bool = False,
        **_ignored: Any,
    ):
        _setup_threads(n_threads)
        if model_path is not None:
            model_path = os.fspath(model_path)
        self._embedder: Any = None
        self._model = None
        self._session: Any = None
        if embedding is True or (embedding is None and _is_encoder_dir(model_path)):
            if model_path is None:
                raise InvalidRequestError("model_path: an encoder model needs its directory")
            self._embedder = _native.Embedder(model_path, n_batch)
            self.model_path = model_path
            return
        self._model = _native.Model(model_path, act_bits)
        self.model_path = self._model.path
        n_train = self._model.n_ctx_train
        n_ctx = n_train if not n_ctx or n_ctx <= 0 else min(int(n_ctx), n_train)
        self._session = _native.Session(self._model, n_ctx, kv_type)
        self.verbose = verbose

    def _need_decoder(self) -> None:
        if self._model is None:
            raise InvalidRequestError(f"{self.model_path}: an encoder model only embeds (create_embedding)")

    def n_ctx(self) -> int:
        """Positions of the KV cache."""
        self._need_decoder()
        return self._session.n_ctx

    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = True) -> list[int]:
        if self._embedder is not None:
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            return self._embedder.tokenize(text)
        return super().tokenize(text, add_bos, special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        if self._embedder is not None:
            return self._embedder.detokenize([int(t) for t in tokens])
        return super().detokenize(tokens)

    # -- generation ---------------------------------------------------------------------

    def _events(self, plan: Any) -> Iterator[tuple[Any, ...]]:
        s = self._session
        s.start(plan)
        try:
            if plan.stream:
                # A chunk per token, as soon as it is known.
                while True:
                    t = s.next()
                    if t is None:
                        break
                    yield ("token",) + tuple(t)
            else:
                # Tokens computed a run at a time, the model's steps back to back as in
                # `decode`; the session ends a run at a stop string itself, so no token is
                # computed past one.
                while True:
                    batch = s.next_batch()
                    if not batch:
                        break
                    for t in batch:
                        yield ("token",) + tuple(t)
            yield ("done", s.finish_reason, s.flush(), s.prompt_tokens, s.generated)
        finally:
            if s.finish_reason is None:
                s.stop("stop")

    def _run(self, route: str, body: str) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        self._need_decoder()
        plan = self._plan(route, body)
        shaper = self._shaper(route, plan)
        if plan.stream:
            return self._stream(plan, shaper)
        stopped = False
        for ev in self._events(plan):
            if ev[0] == "token":
                if stopped:
                    # Computed in the same run as the stop string's token: not part of the
                    # answer (the session ends its runs at stop strings, so none come).
                    continue
                _, hit = shaper.on_token(*ev[1:])
                if hit:
                    stopped = True
                    self._session.stop("stop")
            else:
                shaper.on_done(*ev[1:], stopped)
        return shaper.result()

    def _stream(self, plan: Any, shaper: Any) -> Iterator[dict[str, Any]]:
        stopped = False
        for ev in self._events(plan):
            if ev[0] == "token":
                chunks, hit = shaper.on_token(*ev[1:])
                yield from chunks
                if hit:
                    stopped = True
                    self._session.stop("stop")
            else:
                yield from shaper.on_done(*ev[1:], stopped)

    def create_completion(self, prompt: Union[str, list[int]], **kwargs: Any) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        """Continues ``prompt`` (text, or token ids); returns a ``text_completion`` dict, or
        an iterator of its chunks with ``stream=True``.

        Keywords: ``max_tokens`` (16; ``None`` or 0: until the context is full),
        ``temperature`` (0.8; 0 is greedy), ``top_p``, ``top_k``, ``min_p``,
        ``repeat_penalty``, ``seed``, ``stop`` (a string or up to 4), ``stream``,
        ``logprobs`` (alternatives per token), ``response_format`` / ``grammar``
        (constrained output), ``ignore_eos``, ``stream_options={"include_usage": True}``.
        Unknown keywords are a ``TypeError``.

        >>> import qkv
        >>> llm = qkv.Llama(qkv._native._synthetic_model(), n_ctx=128)
        >>> whole = llm.create_completion("the cat", max_tokens=5, temperature=0)["choices"][0]["text"]
        >>> chunks = llm.create_completion("the cat", max_tokens=5, temperature=0, stream=True)
        >>> "".join(c["choices"][0]["text"] for c in chunks) == whole
        True
        """
        return self._run("completion", self._completion_body(prompt, **kwargs))

    def __call__(self, prompt: Union[str, list[int]], **kwargs: Any) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        """The same as :meth:`create_completion`."""
        return self.create_completion(prompt, **kwargs)

    def create_chat_completion(self, messages: list[dict[str, Any]], **kwargs: Any) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        """Answers ``messages`` (OpenAI's chat messages) through the model's chat template;
        returns a ``chat.completion`` dict, or an iterator of ``chat.completion.chunk`` dicts
        with ``stream=True``.

        ``tools`` and ``tool_choice`` (OpenAI's) let the model call functions: calls are
        parsed out of its reply in its family's format into ``message["tool_calls"]``, and
        ``tool_choice="required"`` or a named function constrains the reply to calls.
        ``response_format`` (``{"type": "json_object"}`` or ``{"type": "json_schema",
        "json_schema": {"schema": ...}}``) constrains the reply to JSON. Other keywords as
        :meth:`create_completion` (``temperature`` defaults to 0.2, ``max_tokens`` to
        until the context is full), plus ``logprobs`` / ``top_logprobs``.

        >>> import qkv, json
        >>> llm = qkv.Llama(qkv._native._synthetic_model(), n_ctx=256)
        >>> out = llm.create_chat_completion(
        ...     [{"role": "user", "content": "a number"}], max_tokens=20,
        ...     response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}})
        >>> out["choices"][0]["message"]["content"].strip().lstrip("-").isdigit()
        True
        """
        return self._run("chat", self._chat_body(messages, **kwargs))

    # -- embeddings ---------------------------------------------------------------------

    def embed(self, input: Union[str, list[str]]) -> "np.ndarray":
        """The embeddings of ``input`` as a float32 array: shape ``(dim,)`` for one text,
        ``(len(input), dim)`` for a list."""
        if self._embedder is None:
            raise InvalidRequestError(
                f"{self.model_path}: embeddings need an encoder model (a sentence-transformers "
                "directory such as all-MiniLM-L6-v2)"
            )
        one = isinstance(input, str)
        texts = [input] if one else list(input)
        if not all(isinstance(t, str) for t in texts):
            raise InvalidRequestError("input: expected a string or a list of strings")
        # numpy is imported here, not with the package: its BLAS threads stay out of
        # processes that only generate.
        import numpy as np

        raw = self._embedder.embed(texts)
        arr = np.frombuffer(raw, dtype="<f4").reshape(len(texts), self._embedder.dim)
        return arr[0] if one else arr

    def create_embedding(self, input: Union[str, list[str]], model: Optional[str] = None) -> dict[str, Any]:
        """OpenAI's embedding answer for ``input`` (a text or a list), each ``embedding`` a
        numpy float32 array of the model's dimension.

        >>> import qkv, os
        >>> path = os.environ.get("QKV_EMBED_MODEL")
        >>> if path:
        ...     out = qkv.Llama(path).create_embedding(["hello", "world"])
        ...     assert out["data"][0]["embedding"].shape == (384,)
        """
        arr = self.embed([input] if isinstance(input, str) else input)
        tokens = sum(len(self._embedder.tokenize(t)) for t in ([input] if isinstance(input, str) else input))
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": arr[i]} for i in range(arr.shape[0])],
            "model": model or self.model_path,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def __repr__(self) -> str:
        return f"qkv.Llama({self.model_path!r})"
