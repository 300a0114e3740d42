"""The sglang engine under the one trial loop, with a stand-in server and client (no SGLang):
idle scheduler turns are not progress, an answered request is, a scheduler that ends is the
first failure and the loop stops after the grace."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from hicache_diag.engines.sglang import trial as sglang_trial
from hicache_diag.engines.sglang.server import SchedulerProc
from hicache_diag.trials.engine import TrialWatch
from hicache_diag.trials.trial import _watch_loop


class FakeServer:
    remote = False  # its schedulers are on this machine (SglangServer's)

    def __init__(self, states):
        self.schedulers = [
            SchedulerProc(
                pid=10**7 + r, pp=r, tp=0, title=f"sglang::scheduler_PP{r}", rank=r, state=st
            )
            for r, st in enumerate(states)
        ]
        self.ended: list[SchedulerProc] = []
        self.popen = SimpleNamespace(pid=1)

    def poll(self):
        ended, self.ended = self.ended, []
        return ended

    def alive(self):
        return True


def _engine(tmp_path, states, outstanding=True, completed_at=0.0):
    cfg = SimpleNamespace(world_size=len(states), hang_timeout=0.5)
    engine = sglang_trial.SglangEngine(cfg)
    engine.server = FakeServer(states)
    engine.client = SimpleNamespace(
        outstanding=outstanding, result=SimpleNamespace(completed_at=completed_at)
    )
    engine.started_at = time.time()
    return cfg, engine


def test_idle_turns_only_is_a_hang_with_the_stalled_schedulers(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.jsonl").write_text(json.dumps({"step": 1, "idle": True}) + "\n")
    cfg, engine = _engine(tmp_path, ["stopped", "stopped"])  # stopped: nothing to py-spy
    watch = TrialWatch()
    t0 = time.time()
    _watch_loop(engine, cfg, tmp_path, watch, None)
    assert 0.5 <= time.time() - t0 < 3
    assert watch.hang.during_startup and watch.hang.stalled_ranks == [0, 1]
    assert watch.first_failure is None and not engine.running()


def test_answered_requests_keep_it_alive_and_a_dead_scheduler_is_the_first_failure(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sglang_trial, "CASCADE_GRACE_S", 0.3)
    cfg, engine = _engine(tmp_path, ["running", "running"])
    watch = TrialWatch()
    t0 = time.time()

    def progress(_snapshot):
        now = time.time()
        engine.client.result.completed_at = now  # a request answered every poll
        if now - t0 > 1.0 and engine.server.schedulers[1].state == "running":
            s = engine.server.schedulers[1]
            s.state, s.exitcode, s.ended_at = "crashed", 1, now
            engine.server.ended.append(s)

    _watch_loop(engine, cfg, tmp_path, watch, progress)
    assert watch.hang is None
    assert watch.first_failure.rank == 1 and watch.first_failure.exitcode == 1
    assert 1.0 < time.time() - t0 < 4
