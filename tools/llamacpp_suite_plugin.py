"""A pytest plugin tools/llamacpp_server_suite.py loads into llama.cpp's server tests: it
raises the time a server gets to start from the suite's 60 s to QKV_SUITE_START_TIMEOUT
(default 300 s). On a busy 2-core machine, at nice 19, llama-server's model load and warm-up
can take more than a minute; nothing else about the tests changes."""

import os


def pytest_configure(config):
    import utils  # the suite's own module (tools/server/tests/utils.py)

    timeout = int(os.environ.get("QKV_SUITE_START_TIMEOUT", "300"))
    utils.DEFAULT_HTTP_TIMEOUT = timeout
    utils.ServerProcess.start.__defaults__ = (timeout,)
