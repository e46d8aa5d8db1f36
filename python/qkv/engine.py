""":class:`Engine`: many requests at once on qkv's batch engine, from threads or asyncio."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Union

from . import _native
from .errors import EngineClosedError, QkvError
from . import errors as _errors
from .llama import _Generator, _setup_threads

_DONE = object()


def _raise(kind: str, message: str) -> None:
    cls = getattr(_errors, kind, QkvError)
    raise cls(message)


class Engine(_Generator):
    """A model served to many concurrent requests: each step of the batch engine runs one
    forward pass for every running sequence. Methods mirror :class:`qkv.Llama`'s, and each
    has an ``a``-prefixed coroutine for asyncio (``acreate_chat_completion``, …), which
    returns the answer, or an async iterator of chunks with ``stream=True``.

    ``max_sequences`` run at once, each with a KV cache of ``n_ctx`` positions; up to
    ``queue`` more wait, and past that a request fails with :class:`qkv.OverloadedError`
    (retryable).

    >>> import asyncio, qkv
    >>> eng = qkv.Engine(qkv._native._synthetic_model(), n_ctx=128, max_sequences=4)
    >>> async def main():
    ...     outs = await asyncio.gather(*[
    ...         eng.acreate_completion("the cat", max_tokens=4, temperature=0) for _ in range(3)])
    ...     return {o["choices"][0]["text"] for o in outs}
    >>> len(asyncio.run(main()))  # the same greedy text three times
    1
    >>> eng.close()
    """

    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        n_ctx: int = 2048,
        max_sequences: int = 16,
        queue: int = 256,
        n_threads: Optional[int] = None,
        act_bits: Optional[int] = None,
        kv_type: Optional[str] = None,
    ):
        _setup_threads(n_threads)
        self._model = _native.Model(model_path, act_bits)
        self.model_path = self._model.path
        n_train = self._model.n_ctx_train
        n_ctx = n_train if not n_ctx or n_ctx <= 0 else min(int(n_ctx), n_train)
        self._engine = _native.Engine(self._model, n_ctx, max_sequences, queue, kv_type)
        self._handlers: dict[int, Callable[[tuple[Any, ...]], None]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._closed_why = ""
        self._dispatcher = threading.Thread(target=self._dispatch, name="qkv-engine-events", daemon=True)
        self._dispatcher.start()

    # -- plumbing -------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hands each event from the engine thread to its request's handler."""
        while True:
            try:
                events = self._engine.poll(0.25)
            except EngineClosedError as e:
                why = str(e)
                break
            except Exception as e:  # noqa: BLE001 - the engine is gone either way
                why = f"the engine's event loop failed: {e}"
                break
            for rid, kind, payload in events:
                with self._lock:
                    h = self._handlers.get(rid)
                    if h is not None and kind != "token":
                        del self._handlers[rid]
                if h is not None:
                    h((kind,) + tuple(payload))
        with self._lock:
            self._closed = True
            self._closed_why = why
            handlers, self._handlers = self._handlers, {}
        for h in handlers.values():
            h(("error", "EngineClosedError", why))

    def _submit(self, plan: Any, handler: Callable[[tuple[Any, ...]], None]) -> int:
        with self._lock:
            if self._closed:
                raise EngineClosedError(self._closed_why or "the engine is closed")
            rid = self._engine.submit(plan)
            self._handlers[rid] = handler
        return rid

    def _cancel(self, rid: int) -> None:
        with self._lock:
            self._handlers.pop(rid, None)
        try:
            self._engine.cancel(rid)
        except QkvError:
            pass

    def n_ctx(self) -> int:
        """Positions of each sequence's KV cache."""
        return self._engine.n_ctx

    def close(self) -> None:
        """Stops the engine; requests still running end with :class:`qkv.EngineClosedError`."""
        self._engine.close()
        self._dispatcher.join(timeout=5)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- threads --------------------------------------------------------------------------

    def _events(self, plan: Any) -> Iterator[tuple[Any, ...]]:
        q: "queue.SimpleQueue[tuple[Any, ...]]" = queue.SimpleQueue()
        rid = self._submit(plan, q.put)
        finished = False
        try:
            while True:
                try:
                    ev = q.get(timeout=0.1)
                except queue.Empty:
                    continue  # wake up to let Ctrl-C in
                if ev[0] == "error":
                    finished = True
                    _raise(ev[1], ev[2])
                yield ev
                if ev[0] == "done":
                    finished = True
                    return
        finally:
            if not finished:
                self._cancel(rid)

    def _run(self, route: str, body: Union[str, dict[str, Any]]) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        plan = self._plan(route, body)
        shaper = self._shaper(route, plan)
        if plan.stream:
            return self._stream(plan, shaper)
        for _ in self._stream(plan, shaper):
            pass
        return shaper.result()

    def _stream(self, plan: Any, shaper: Any) -> Iterator[dict[str, Any]]:
        stopped = False
        events = self._events(plan)
        try:
            for ev in events:
                if ev[0] == "token":
                    chunks, hit = shaper.on_token(*ev[1:])
                    yield from chunks
                    if hit:
                        stopped = True
                        events.close()
                        yield from shaper.on_done("stop", "", plan_prompt(plan), len(shaper.tokens), True)
                        return
                else:
                    yield from shaper.on_done(ev[1], ev[2], ev[3], ev[5], stopped)
        finally:
            events.close()

    def create_completion(self, prompt: Union[str, list[int]], **kwargs: Any) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        """As :meth:`qkv.Llama.create_completion`, on the batch engine (thread-safe)."""
        return self._run("completion", self._completion_body(prompt, **kwargs))

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict[str, Any]], **kwargs: Any) -> Union[dict[str, Any], Iterator[dict[str, Any]]]:
        """As :meth:`qkv.Llama.create_chat_completion`, on the batch engine (thread-safe)."""
        return self._run("chat", self._chat_body(messages, **kwargs))

    # -- asyncio --------------------------------------------------------------------------

    async def _aevents(self, plan: Any) -> AsyncIterator[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        q: "asyncio.Queue[tuple[Any, ...]]" = asyncio.Queue()

        def handler(ev: tuple[Any, ...]) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, ev)
            except RuntimeError:
                pass  # the loop is closed: nobody is waiting

        rid = self._submit(plan, handler)
        finished = False
        try:
            while True:
                ev = await q.get()
                if ev[0] == "error":
                    finished = True
                    _raise(ev[1], ev[2])
                yield ev
                if ev[0] == "done":
                    finished = True
                    return
        finally:
            if not finished:
                self._cancel(rid)

    async def _astream(self, plan: Any, shaper: Any) -> AsyncIterator[dict[str, Any]]:
        stopped = False
        events = self._aevents(plan)
        try:
            async for ev in events:
                if ev[0] == "token":
                    chunks, hit = shaper.on_token(*ev[1:])
                    for c in chunks:
                        yield c
                    if hit:
                        stopped = True
                        await events.aclose()
                        for c in shaper.on_done("stop", "", plan_prompt(plan), len(shaper.tokens), True):
                            yield c
                        return
                else:
                    for c in shaper.on_done(ev[1], ev[2], ev[3], ev[5], stopped):
                        yield c
        finally:
            await events.aclose()

    async def arun(self, route: str, body: Union[str, dict[str, Any]]) -> Union[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """Runs a request body as the OpenAI route ``route`` (``"chat"`` or
        ``"completion"``) reads it: the answer, or an async iterator of its chunks when the
        body says ``"stream": true``. What :mod:`qkv.serve` calls."""
        plan = self._plan(route, body)
        shaper = self._shaper(route, plan)
        if plan.stream:
            return self._astream(plan, shaper)
        async for _ in self._astream(plan, shaper):
            pass
        return shaper.result()

    async def acreate_completion(self, prompt: Union[str, list[int]], **kwargs: Any) -> Union[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """:meth:`create_completion` as a coroutine."""
        return await self.arun("completion", self._completion_body(prompt, **kwargs))

    async def acreate_chat_completion(self, messages: list[dict[str, Any]], **kwargs: Any) -> Union[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """:meth:`create_chat_completion` as a coroutine.

        >>> import asyncio, qkv
        >>> eng = qkv.Engine(qkv._native._synthetic_model(), n_ctx=128)
        >>> async def main():
        ...     chunks = await eng.acreate_chat_completion(
        ...         [{"role": "user", "content": "hi"}], max_tokens=3, stream=True)
        ...     return [c async for c in chunks]
        >>> asyncio.run(main())[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        True
        >>> eng.close()
        """
        return await self.arun("chat", self._chat_body(messages, **kwargs))


def plan_prompt(plan: Any) -> int:
    return len(plan.prompt)


