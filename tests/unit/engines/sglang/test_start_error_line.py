# ruff: noqa: E501 - machine-printed log lines are kept as printed
"""The line a failed start-up is reported by: the cause SGLang logged, not a traceback header.
The log lines are as SGLang 0.5.23 printed them on this project's machine (2026-12-04, a run
whose HTTP port another launch took between our pick and uvicorn's bind)."""

from __future__ import annotations

from hicache_diag.engines.sglang.startup_log import last_error_line, port_taken_line

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


# The form of SGLang's own port check giving up (0.5.23 srt/server_args.py `PortArgs.init_new`,
# logged with logger.exception, then raised), written out here, not captured from a run.
DERIVED_PORT_TAKEN = """\
[2026-12-04 18:00:00] Port 30000 is already in use, trying port 30001
[2026-12-04 18:00:31] Port is already in use. dist_init_port=30010 port_base=30011 detokenizer_port=30012 nccl_port=30013 scheduler_input_port=30015
Traceback (most recent call last):
ValueError: port_base at 30011 is not available in 30 seconds. port_base at 30011 is not available
"""


def test_a_port_lost_is_found_in_this_launchs_lines_only(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(PORT_TAKEN)
    assert port_taken_line(log, 0).endswith("address already in use")
    assert port_taken_line(log, len(PORT_TAKEN)) is None  # a later launch's lines: none yet
    log.write_text(DERIVED_PORT_TAKEN)
    assert "Port is already in use. dist_init_port=30010" in port_taken_line(log, 0)
    moved_on = DERIVED_PORT_TAKEN.splitlines()[0]  # SGLang moved to the next port by itself
    log.write_text(moved_on + "\nValueError: bad model\n")
    assert port_taken_line(log, 0) is None
