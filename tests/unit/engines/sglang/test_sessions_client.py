"""The scripted SGLang workloads (engines/sglang/sessions.py) against a small HTTP server
that answers like SGLang's `/open_session`, `/generate`, `/close_session`, `/flush_cache`."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from hicache_diag.engines.builtin.runtime.server_args import WorkloadConfig
from hicache_diag.engines.sglang import sessions
from hicache_diag.engines.sglang.client import WorkloadClient


class _Sglang(BaseHTTPRequestHandler):
    calls: list[tuple[str, dict | None]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        type(self).calls.append((self.path, body))
        if self.path == "/generate":
            out = {
                "output_ids": [7] * body["sampling_params"]["max_new_tokens"],
                "meta_info": {"cached_tokens": 0, "finish_reason": {"type": "length"}},
            }
            data, code = json.dumps(out).encode(), 200
        elif self.path.startswith("/flush_cache"):
            data, code = b"Timed out waiting for idle state.", 400
        else:
            data, code = b'"ok"', 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(sessions, "SESSION_TIMEOUT_S", 0.05)
    monkeypatch.setattr(sessions, "SWEEP_S", (0.0, 0.05))
    _Sglang.calls = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _cfg(name: str, requests: int) -> SimpleNamespace:
    return SimpleNamespace(
        workload=WorkloadConfig(name, requests, 2, 0),
        vocab_size=64,
        spec=SimpleNamespace(pp_size=2),
    )


def _run(cfg, url):
    requests: list = []
    client = sessions.make_client(cfg, url, requests, 10.0)
    client.start()
    client.join(30)
    assert client.result.done
    return client, requests


def test_session_timeout_opens_streaming_sessions_with_a_timeout_and_sends_two_turns(server):
    client, requests = _run(_cfg("session-timeout", 2), server)
    opens = [b for p, b in _Sglang.calls if p == "/open_session"]
    assert len(opens) == 2 and all(b["streaming"] and b["timeout"] == 0.05 for b in opens)
    turns = [b for p, b in _Sglang.calls if p == "/generate"]
    assert sorted(b["rid"] for b in turns) == ["s000-t1", "s000-t2", "s001-t1", "s001-t2"]
    assert all(b["session_params"] == {"id": b["rid"][:4]} for b in turns)
    # The reference gets each second turn's whole context: first prompt, its output, the turn.
    ref = {r.rid: r for r in requests}
    t1 = next(b for b in turns if b["rid"] == "s000-t1")
    t2 = next(b for b in turns if b["rid"] == "s000-t2")
    assert list(ref["s000-t2"].input_ids) == t1["input_ids"] + [7, 7] + t2["input_ids"]
    assert [e["what"] for e in client.events].count("close_session") == 2


def test_session_close_closes_while_the_turn_is_in_flight_then_sends_the_burst(server):
    client, _ = _run(_cfg("session-close", 1), server)
    paths = [p for p, _ in _Sglang.calls]
    assert paths[0] == "/open_session" and "/close_session" in paths
    rids = [b["rid"] for p, b in _Sglang.calls if p == "/generate"]
    assert sorted(rids) == ["c000-b0", "c000-b1", "c000-t1"]
    assert client.result.errors == {}


def test_flush_timeout_sweeps_the_deadline_and_records_the_refusal(server):
    client, _ = _run(_cfg("flush-timeout", 2), server)
    flushes = [e for e in client.events if e["what"] == "flush_cache"]
    assert flushes[0]["timeout"] == 0.1 and len(flushes) == 2  # then: the last length + offset
    assert all(f["status"] == 400 and "Timed out" in f["answer"] for f in flushes)
    assert any(p.startswith("/flush_cache?timeout=0.100") for p, _ in _Sglang.calls)


def test_overload_arrives_at_least_twice_as_fast_as_one_request_is_served(server, monkeypatch):
    """The first request goes alone and sets the gap: half its service time, at most 0.25 s, so
    a fast server still gets a queue (a fixed 0.25 s gap at 0.28 s a request built none)."""
    import time as _time

    served = {"slow": True}
    real = _Sglang.do_POST

    def slow_first(self):
        if served["slow"] and self.path == "/generate":
            served["slow"] = False
            _time.sleep(0.2)  # one request alone takes ~0.2 s: the gap must be <= 0.1 s
        real(self)

    monkeypatch.setattr(_Sglang, "do_POST", slow_first)
    client, requests = _run(_cfg("overload", 4), server)
    gap = next(e for e in client.events if e["what"] == "overload_gap")["gap_s"]
    assert 0.09 <= gap <= 0.15, gap
    rids = [b["rid"] for p, b in _Sglang.calls if p == "/generate"]
    assert rids[0] == "o000" and sorted(rids) == ["o000", "o001", "o002", "o003"]
    assert len(requests) == 4


def test_plain_workloads_keep_the_wave_client():
    cfg = _cfg("shared-prefix", 2)
    assert type(sessions.make_client(cfg, "http://x", [], 1.0)) is WorkloadClient
