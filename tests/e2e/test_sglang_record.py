"""`hicache-diag record` on real SGLang 0.5.23 PP2 (CPU), with the user's own command line
(issue 37): each rank's session files fill while the server serves plain HTTP requests, and a
dump request is answered by every rank from inside its process; the same with the
environment-only form (`record --print-env` applied to a plain launch); and a record dir that
fills up leaves the server serving while each rank says, once, in the server's log, that it is
off. Slow: one real launch each, about a minute on an idle 2-core box."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.ports import free_port
from hicache_diag.evidence import recording as rec
from tests.conftest import assert_no_children, tiny_tmpfs
from tests.e2e.record_launch import (
    cpu_env,
    generate,
    hicache_diag,
    launched,
    schedulers,
    server_argv,
    tail,
    until,
    wait_ready,
)
from tests.e2e.record_launch import held_0523 as _held

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _held(), reason="sglang 0.5.23 is not the interpreter's release"),
]
PROMPTS = ("the ranks agree on", "a pipeline of two stages", "the ranks agree on more")


def _session(record_dir: Path) -> Path:
    return until(lambda: rec.sessions_in(record_dir), 120, "a session folder")[0]


def _serves_and_records(port: int, record_dir: Path, proc) -> Path:
    for text in PROMPTS:
        assert generate(port, text)["meta_info"]["completion_tokens"] > 0
    session = _session(record_dir)
    assert session.name.endswith(f"-{proc.pid}")  # named by the launch's first process
    views = until(lambda: _busy(session), 60, "both ranks' busy step lines")
    for rank, view in views.items():
        assert view.meta is not None and view.meta.on and view.meta.dump_signal == "SIGUSR2"
        assert view.meta.pp_rank == rank and view.meta.release == "0.5.23"
        assert view.digests and view.lines[-1]["rank"] == rank
        assert oct(os.stat(rec.meta_path(session, rank)).st_mode & 0o777) == "0o600"
    return session


def _busy(session: Path):
    views = rec.read_session(session)
    busy = {r: v for r, v in views.items() if any(ln.get("rids") for ln in v.lines)}
    return views if sorted(busy) == [0, 1] else None


def _every_rank_answers(session: Path, request_id: str) -> None:
    rec.write_dump_request(session, request_id)

    def answered():
        views = rec.read_session(session)
        found = {r: [d for d in v.snapshots if d.request == request_id] for r, v in views.items()}
        return found if all(found.get(r) for r in (0, 1)) else None

    found = until(answered, 30, f"dumps answering {request_id}")
    for rank, (snap,) in found.items():
        assert snap.reason == "asked" and snap.rank == rank and snap.steps
        assert snap.main_thread is not None and snap.main_thread.frames
        assert "waiting" in snap.scheduler and snap.device_free is not None, snap.errors


def test_record_wraps_the_users_own_command(tmp_path):
    port, record_dir, log = free_port(), tmp_path / "rec", tmp_path / "server.log"
    argv = hicache_diag("record", "--cpu-shims", "--dir", str(record_dir), "--", *server_argv(port))
    with launched(argv, cpu_env(), log) as proc:
        wait_ready(proc, port, log)
        session = _serves_and_records(port, record_dir, proc)
        _every_rank_answers(session, "e2e-cli")
        pids = schedulers(proc)
        os.kill(pids[1], __import__("signal").SIGUSR2)  # the operator's signal
        until(
            lambda: [d for d in rec.read_rank(session, 1).dumps if d["reason"] == "signal"],
            30,
            "rank 1's dump on SIGUSR2",
        )
        assert generate(port, "still serving")["meta_info"]["completion_tokens"] > 0
    assert "recorder off" not in tail(log, 10**7), tail(log)
    assert_no_children()


def test_the_environment_alone_records_a_plain_launch(tmp_path):
    port, record_dir, log = free_port(), tmp_path / "rec", tmp_path / "server.log"
    printed = subprocess.run(
        hicache_diag("record", "--print-env", "--json", "--cpu-shims", "--dir", str(record_dir)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    env = cpu_env()
    for name, value in json.loads(printed.stdout)["env"].items():
        env[name] = (
            value
            if name != "PYTHONPATH"
            else os.pathsep.join(p for p in (value, env.get("PYTHONPATH")) if p)
        )
    with launched(server_argv(port), env, log) as proc:  # no `record` in the command line
        wait_ready(proc, port, log)
        session = _serves_and_records(port, record_dir, proc)
        _every_rank_answers(session, "e2e-env")
    assert_no_children()


def test_a_full_record_dir_leaves_the_server_serving(tmp_path):
    """A 64 KiB tmpfs as the record dir: the ranks fill it within seconds, each turns its
    recording off and says so once in the server's log, and the server answers on."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs needs root")
    with tiny_tmpfs(tmp_path / "tiny", "64k") as record_dir:
        port, log = free_port(), tmp_path / "server.log"
        argv = hicache_diag(
            "record", "--cpu-shims", "--dir", str(record_dir), "--", *server_argv(port)
        )
        with launched(argv, cpu_env(), log) as proc:
            wait_ready(proc, port, log)
            text = "fill the record dir " * 8
            until(lambda: generate(port, text, 24) and _both_off(log), 240, "both ranks off")
            assert generate(port, "still serving")["meta_info"]["completion_tokens"] > 0
        said = [ln for ln in tail(log, 10**7).splitlines() if "hicache-diag recorder off" in ln]
        assert len(said) == 2, said  # once a rank
        # Whichever rank meets the full disk first: the write's ENOSPC, or the free-space
        # reserve checked before a new file (the other rank's writes took the last bytes).
        full = ("No space left on device", "disk nearly full")
        assert all(any(why in ln for why in full) for ln in said), said
    assert_no_children()


def _both_off(log: Path) -> bool:
    text = tail(log, 10**7)
    return all(f"hicache-diag recorder off on rank {r}:" in text for r in (0, 1))
