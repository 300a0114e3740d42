"""How the sglang trial turns SGLang's own exit behaviour into process facts (launcher.json):
a scheduler that logged its fatal exception crashed whatever its exit code; the SIGKILLs of the
launcher's teardown after a child's SIGQUIT are not a root cause."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from hicache_diag.sglang.server import Scheduler
from hicache_diag.sglang.trial import _mark_logged_crashes, _Watch

# Lines as SGLang 0.5.12.post1 printed them in a form-A run here (paths shortened, the echoed
# source lines left out).
PP1_LOG = """\
[2026-12-01 05:38:08 PP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/sglang/srt/managers/scheduler.py", line 3049, in run_scheduler_process
  File "/v/sglang/srt/layers/rotary_embedding/base.py", line 232, in forward_native
RuntimeError: shape '[58, -1, 16]' is invalid for input of size 7744
"""
LOGGED = datetime.fromisoformat("2026-12-01 05:38:08").timestamp()  # as the log parser reads it
TEARDOWN = (
    "[2026-12-01 05:38:08] SIGQUIT received. signum=None, frame=None. It usually means one "
    "child failed.\n"
)


def _server(*states) -> SimpleNamespace:
    schedulers = [
        Scheduler(pid=100 + r, pp=r, tp=0, title=f"sglang::scheduler_PP{r}", rank=r, state=st,
                  exitcode=code, signal=sig, ended_at=LOGGED + 0.5 + r * 4e-5)
        for r, (st, code, sig) in enumerate(states)
    ]  # fmt: skip
    return SimpleNamespace(schedulers=schedulers)


def _logs(tmp_path: Path, **texts: str) -> dict[int, Path]:
    paths = {}
    for name, text in texts.items():
        paths[int(name[-1])] = tmp_path / f"{name}.log"
        paths[int(name[-1])].write_text(text)
    return paths


def test_teardown_sigkills_are_not_the_first_failure(tmp_path):
    killed = ("crashed", None, signal.SIGKILL)
    server = _server(killed, killed)
    watch = _Watch(first_failure={"rank": 0, "t": 1000.0, "signal": 9})  # PP0 polled first
    _mark_logged_crashes(
        PP1_LOG + TEARDOWN, _logs(tmp_path, rank0="", rank1=PP1_LOG), server, watch
    )
    assert [s.state for s in server.schedulers] == ["killed", "crashed"]
    assert watch.first_failure["rank"] == 1


def test_a_fatal_exception_with_exit_0_is_a_crash(tmp_path):
    server = _server(("exited", 0, None), ("exited", 0, None))
    watch = _Watch(first_failure={"rank": 1, "t": 1000.0})
    _mark_logged_crashes(PP1_LOG, _logs(tmp_path, rank0="", rank1=PP1_LOG), server, watch)
    assert [s.state for s in server.schedulers] == ["exited", "crashed"]


def test_without_a_logged_exception_a_sigkill_stays_a_death(tmp_path):
    # A scheduler someone SIGKILLed: no traceback anywhere, the teardown follows that death.
    server = _server(("exited", 0, None), ("crashed", None, signal.SIGKILL))
    watch = _Watch(first_failure={"rank": 1, "t": 1000.0})
    _mark_logged_crashes(TEARDOWN, _logs(tmp_path, rank0="", rank1=""), server, watch)
    assert [s.state for s in server.schedulers] == ["exited", "crashed"]
    assert watch.first_failure["rank"] == 1


def test_a_sigkill_before_only_cascades_stays_the_root(tmp_path):
    # A user SIGKILLs PP1; PP0 then logs `Connection closed by peer` as its fatal exception and
    # the launcher tears down. The cascade is no root cause: PP1's death stays a death.
    cascade = TEARDOWN + (
        "[2026-12-01 05:38:09 PP0] Scheduler hit an exception: Traceback (most recent call "
        'last):\n  File "/t/distributed_c10d.py", line 3, in recv\n'
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:17092\n"
    )
    pp0 = cascade.split("\n", 1)[1]
    server = _server(("crashed", 0, None), ("crashed", None, signal.SIGKILL))
    watch = _Watch(first_failure={"rank": 1, "t": 1000.0, "signal": 9})
    _mark_logged_crashes(cascade, _logs(tmp_path, rank0=pp0, rank1=""), server, watch)
    assert [s.state for s in server.schedulers] == ["crashed", "crashed"]
    assert watch.first_failure["rank"] == 1
