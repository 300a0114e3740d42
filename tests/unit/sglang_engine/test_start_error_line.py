# ruff: noqa: E501 - machine-printed log lines are kept as printed
"""The line a failed start-up is reported by: the cause SGLang logged, not a traceback header.
The log lines are as SGLang 0.5.23 printed them on this project's machine (2026-12-04, a run
whose HTTP port another launch took between our pick and uvicorn's bind)."""

from __future__ import annotations

from hicache_diag.sglang.startup_log import last_error_line

PORT_TAKEN = """\
[2026-12-04 14:56:21] INFO:     Started server process [4403]
[2026-12-04 14:56:22] INFO:     Application startup complete.
[2026-12-04 14:56:22] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 32897): address already in use
[2026-12-04 14:56:22] INFO:     Waiting for application shutdown.
[2026-12-04 14:56:32] post-warmup freeze_gc failed
Traceback (most recent call last):
TimeoutError: timed out
Traceback (most recent call last):
requests.exceptions.ReadTimeout: HTTPConnectionPool(host='127.0.0.1', port=32897): Read timed out. (read timeout=10)
[2026-12-04 14:56:32] The server is fired up and ready to roll!
[2026-12-04 14:56:32] INFO:     Application shutdown complete.
"""


def test_a_failed_bind_is_named_over_a_warnings_traceback(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(PORT_TAKEN)
    assert last_error_line(log).endswith("address already in use")


def test_without_an_error_line_the_exception_is_named_not_the_header(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("starting\nTraceback (most recent call last):\n  File x\nValueError: bad\nbye\n")
    assert last_error_line(log) == "ValueError: bad"
