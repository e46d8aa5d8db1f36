"""A pytest plugin tools/llamacpp_server_suite.py loads into llama.cpp's server tests.

- It raises the time a server gets to start from the suite's 60 s to
  QKV_SUITE_START_TIMEOUT (default 300 s). On a busy 2-core machine, at nice 19,
  llama-server's model load and warm-up can take more than a minute.
- The tests' `download_file` (an adapter, a draft model) returns the local stand-in that
  QKV_SHIM_MAP names for the URL's file (tools/llamacpp_suite_models.py), since nothing can
  be downloaded here; a URL it does not name is left to the original, which then fails as
  it would offline.

Nothing else about the tests changes."""

import json
import os


def pytest_configure(config):
    import utils  # the suite's own module (tools/server/tests/utils.py)

    timeout = int(os.environ.get("QKV_SUITE_START_TIMEOUT", "300"))
    utils.DEFAULT_HTTP_TIMEOUT = timeout
    utils.ServerProcess.start.__defaults__ = (timeout,)

    path = os.environ.get("QKV_SHIM_MAP")
    if not path:
        return
    with open(path) as f:
        urls = json.load(f).get("urls", {})
    download = utils.download_file

    def download_file(url, output_file_path=None):
        local = urls.get(url.rsplit("/", 1)[-1])
        if local is not None:
            print(f"suite plugin: {url} -> {local}")
            return local
        return download(url, output_file_path)

    # The test modules import it with `from utils import *`, after this runs.
    utils.download_file = download_file
