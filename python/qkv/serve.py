"""qkv on Ray Serve: the OpenAI routes (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``) served by replicas of a deployment, each holding one
:class:`qkv.Engine` (and, when asked, an encoder for embeddings). Ray Serve spreads the
replicas over the cluster's nodes and adds or removes them with the number of ongoing
requests.

Run it with Ray's CLI::

    serve run qkv.serve:build_app model_path=/path/to/model.gguf num_replicas=2

or from Python::

    from ray import serve
    import qkv.serve
    serve.run(qkv.serve.build_app({"num_replicas": 2, "n_threads": 1}))

A request that a replica cannot take now (its engine's queue is full) is answered with 503
and ``Retry-After``; a client retries it, as it retries a connection that a replica lost
when it died (see ``python/tests/test_ray_serve.py``).

Needs ``pip install "ray[serve]"``.
"""


import json
import os
import time
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from .engine import Engine
from .errors import InvalidRequestError, QkvError
from .llama import Llama

app = FastAPI(title="qkv")

#: Replicas are added while more than ``target_ongoing_requests`` requests are in flight per
#: replica (each replica's engine batches up to ``max_sequences`` of them).
AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target_ongoing_requests": 16,
    "upscale_delay_s": 5,
    "downscale_delay_s": 60,
}


def _error(e: Exception) -> JSONResponse:
    """An exception as OpenAI's error object, with the status that says whether to retry."""
    if isinstance(e, InvalidRequestError):
        status, kind = 400, "invalid_request_error"
    elif isinstance(e, QkvError) and e.retryable:
        status, kind = 503, "overloaded"
    elif isinstance(e, QkvError):
        status, kind = 500, "server_error"
    else:
        status, kind = 500, "server_error"
    headers = {"Retry-After": "1"} if status == 503 else None
    body = {"error": {"message": str(e), "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for c in chunks:
            yield b"data: " + json.dumps(c).encode() + b"\n\n"
    except QkvError as e:
        err = {"error": {"message": str(e), "type": "overloaded" if e.retryable else "server_error"}}
        yield b"data: " + json.dumps(err).encode() + b"\n\n"
        return
    yield b"data: [DONE]\n\n"


@serve.deployment(
    # Each replica takes up to this many requests at once (its engine batches them); Ray
    # Serve scales the replicas on the requests in flight per replica.
    max_ongoing_requests=64,
    autoscaling_config=AUTOSCALING,
    health_check_period_s=5,
    health_check_timeout_s=10,
    graceful_shutdown_timeout_s=5,
)
@serve.ingress(app)
class QkvDeployment:
    """One replica: a :class:`qkv.Engine` over the model (the default one when
    ``model_path`` is None), and an encoder for ``/v1/embeddings`` when ``embed_model_path``
    names one."""

    def __init__(
        self,
        model_path: Optional[str] = None,
        embed_model_path: Optional[str] = None,
        n_ctx: int = 2048,
        max_sequences: int = 16,
        queue: int = 256,
        n_threads: Optional[int] = None,
        model_name: Optional[str] = None,
    ):
        self.engine = Engine(model_path, n_ctx=n_ctx, max_sequences=max_sequences, queue=queue, n_threads=n_threads)
        self.embedder = Llama(embed_model_path, embedding=True) if embed_model_path else None
        self.name = model_name or os.path.basename(self.engine.model_path)
        self.created = int(time.time())

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine thread ended is restarted."""
        if self.engine._closed:
            raise RuntimeError("the engine has stopped")

    async def _route(self, route: str, request: Request) -> Any:
        try:
            body = await request.json()
        except Exception as e:  # noqa: BLE001 - any unreadable body is the client's fault
            return _error(InvalidRequestError(f"the body is not valid JSON: {e}"))
        if not isinstance(body, dict):
            return _error(InvalidRequestError("the body must be a JSON object"))
        try:
            answer = await self.engine.arun(route, body)
        except Exception as e:  # noqa: BLE001 - every error is answered
            return _error(e)
        if isinstance(answer, dict):
            answer["model"] = body.get("model") or self.name
            return JSONResponse(answer)
        return StreamingResponse(_sse(answer), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Any:
        return await self._route("chat", request)

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Any:
        return await self._route("completion", request)

    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Any:
        if self.embedder is None:
            return _error(InvalidRequestError("this deployment serves no embedding model (embed_model_path)"))
        try:
            body = await request.json()
            inp = body.get("input") if isinstance(body, dict) else None
            if inp is None:
                raise InvalidRequestError("input: required")
            import asyncio

            out = await asyncio.get_running_loop().run_in_executor(None, self.embedder.create_embedding, inp)
        except Exception as e:  # noqa: BLE001 - every error is answered
            return _error(e)
        for d in out["data"]:
            d["embedding"] = d["embedding"].tolist()
        out["model"] = body.get("model") or os.path.basename(self.embedder.model_path)
        return JSONResponse(out)

    @app.get("/v1/models")
    async def models(self) -> Any:
        data = [{"id": self.name, "object": "model", "created": self.created, "owned_by": "qkv"}]
        if self.embedder is not None:
            data.append(
                {"id": os.path.basename(self.embedder.model_path), "object": "model", "created": self.created, "owned_by": "qkv"}
            )
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health(self) -> Any:
        return {"status": "ok"}


def build_app(args: Optional[dict[str, Any]] = None) -> Any:
    """The application for ``serve run qkv.serve:build_app key=value ...``.

    Keys: ``model_path``, ``embed_model_path``, ``n_ctx``, ``max_sequences``, ``queue``,
    ``n_threads`` (per replica), ``model_name``; and the deployment's own
    ``num_replicas`` (fixed; otherwise autoscaled between ``min_replicas`` and
    ``max_replicas`` on ``target_ongoing_requests`` per replica) and ``num_cpus`` per
    replica.
    """
    args = dict(args or {})
    options: dict[str, Any] = {}
    if "num_replicas" in args:
        options["num_replicas"] = int(args.pop("num_replicas"))
        options["autoscaling_config"] = None
    else:
        auto = {}
        for k in ("min_replicas", "max_replicas", "target_ongoing_requests"):
            if k in args:
                auto[k] = int(args.pop(k))
        if auto:
            options["autoscaling_config"] = {**AUTOSCALING, **auto}
    if "num_cpus" in args:
        options["ray_actor_options"] = {"num_cpus": float(args.pop("num_cpus"))}
    for k in ("n_ctx", "max_sequences", "queue", "n_threads"):
        if k in args and args[k] is not None:
            args[k] = int(args[k])
    return QkvDeployment.options(**options).bind(**args)


__all__ = ["QkvDeployment", "build_app", "app"]
