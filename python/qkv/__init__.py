"""qkv from Python: a SIMD-optimized CPU inference runtime, with llama-cpp-python's API.

- :class:`Llama`: one model, one sequence at a time (``create_completion``,
  ``create_chat_completion`` with tools and JSON output, ``create_embedding`` on encoder
  models, ``tokenize`` / ``detokenize``);
- :class:`Engine`: many concurrent requests on the batch engine, from threads or asyncio;
- :mod:`qkv.serve`: a Ray Serve deployment of the OpenAI routes over an :class:`Engine`.

Every call that computes releases the GIL; Ctrl-C stops a streamed generation at the next
token, and a whole answer after at most about 50 ms more of tokens; errors are
:class:`QkvError` subclasses carrying qkv's message.

>>> import qkv
>>> llm = qkv.Llama(qkv._native._synthetic_model(), n_ctx=128)
>>> llm.detokenize(llm.tokenize("the cat sat", add_bos=False))
b'the cat sat'
"""

from __future__ import annotations

from . import _native
from .engine import Engine
from .errors import (
    ContextLengthError,
    EngineClosedError,
    InvalidRequestError,
    ModelLoadError,
    OverloadedError,
    QkvError,
)
from .llama import Llama

__version__: str = _native.__version__


def set_threads(n: int) -> int:
    """Sets the number of compute threads for this process (once; the first model loaded
    with ``n_threads`` does the same). Returns ``n``."""
    return _native.set_threads(n)


def threads() -> int:
    """The number of compute threads in force."""
    return _native.threads()


def default_model_path() -> str:
    """The default model's file (SmolLM2-135M-Instruct, Q4_1), fetched on first use as
    ``decode`` fetches it."""
    return _native.default_model_path()


__all__ = [
    "Llama",
    "Engine",
    "QkvError",
    "InvalidRequestError",
    "ContextLengthError",
    "ModelLoadError",
    "OverloadedError",
    "EngineClosedError",
    "set_threads",
    "threads",
    "default_model_path",
    "__version__",
]
