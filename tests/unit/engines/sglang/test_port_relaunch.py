"""A start that lost its port: the port we picked was bound by someone else before SGLang bound
it (ports.py). The launcher exits saying so, and the server relaunches on a fresh port; any
other failed start is the environment's, never relaunched. Real processes: a stand-in
"interpreter" that binds `--port` as uvicorn does and answers /health_generate."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from hicache_diag.engines.sglang import server as server_mod
from hicache_diag.engines.sglang.release import SglangInstall
from hicache_diag.engines.sglang.server import LaunchSpec, ServerStartError, SglangServer

# Binds --port, then serves 200 on every GET; a taken port is uvicorn's ERROR line and exit 1.
# `fail` stands for a start that dies for another reason. Each launch appends its port to LAUNCHES.
STAND_IN = """
import http.server, socket, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
open({launches!r}, "a").write(f"{{port}}\\n")
if {fail!r}:
    print("ERROR:    the model is not there", flush=True)
    sys.exit(1)
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError:
    print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {{port}}):"
          " address already in use", flush=True)
    sys.exit(1)
s.close()

class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), Ok).serve_forever()
"""


def _server(tmp_path: Path, fail: bool = False) -> tuple[SglangServer, Path]:
    launches = tmp_path / "launches"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(launches=str(launches), fail=fail))
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    fake.chmod(0o755)
    install = SglangInstall(python=str(fake), version="0.5.23", package_dir=tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = LaunchSpec(model=tmp_path, env=(("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext")),))
    return SglangServer(install, spec, run_dir), launches


def _ports(launches: Path) -> list[int]:
    return [int(x) for x in launches.read_text().split()]


def _start_fails(srv: SglangServer, tmp_path: Path, why: str) -> None:
    try:
        srv.start(tmp_path / "plugin.json")
        with pytest.raises(ServerStartError, match=why):
            srv.wait_ready(timeout_s=60)
    finally:
        srv.close()


@pytest.fixture
def taken():
    """A port another process holds: bound (not listening, so no request hangs on it)."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    yield squatter.getsockname()[1]
    squatter.close()


@pytest.mark.process
def test_a_start_whose_port_was_taken_is_relaunched_on_a_fresh_port(tmp_path, taken) -> None:
    srv, launches = _server(tmp_path)
    srv.port = taken  # as if another process bound our pick between the pick and the bind
    try:
        srv.start(tmp_path / "plugin.json")
        srv.wait_ready(timeout_s=60)
        assert srv.port != taken and _ports(launches) == [taken, srv.port]
        assert srv._healthy()
        [why] = srv.relaunches
        assert f"port {taken} was taken" in why and "address already in use" in why
        assert f"relaunched on port {srv.port}" in why
    finally:
        srv.close()
    log = srv.log_path.read_text()
    assert "address already in use" in log  # the first launch's lines are kept


@pytest.mark.process
def test_a_port_taken_every_time_gives_up_after_the_relaunches(
    tmp_path, taken, monkeypatch
) -> None:
    srv, launches = _server(tmp_path)
    srv.port = taken
    monkeypatch.setattr(server_mod, "free_port", lambda: taken)  # every pick is the taken one
    _start_fails(srv, tmp_path, "address already in use")
    assert len(_ports(launches)) == 1 + server_mod.PORT_RELAUNCHES


@pytest.mark.process
def test_a_start_that_failed_for_another_reason_is_not_relaunched(tmp_path: Path) -> None:
    srv, launches = _server(tmp_path, fail=True)
    _start_fails(srv, tmp_path, "the model is not there")
    assert len(_ports(launches)) == 1 and srv.relaunches == []
