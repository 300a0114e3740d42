"""The `waiting-clock` probe on a scheduler shaped like 0.5.1x's: what the rank read (its oldest
waiting request past the timeout) and the rids its own `_abort_on_waiting_timeout` dropped,
with SGLang's call and its queue left as they would be without the probe."""

from __future__ import annotations

import time
from types import SimpleNamespace

from hicache_diag.engines.sglang.plugin import hook_points, source_probes
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.faults.hooks import Hooks


class _Env:
    def __init__(self, value: float) -> None:
        self.value = value

    def get(self) -> float:
        return self.value


envs = SimpleNamespace(SGLANG_REQ_WAITING_TIMEOUT=_Env(1.5))  # the wrapper reads its globals


def _req(rid: str, age: float) -> SimpleNamespace:
    stamp = time.perf_counter() - age if age else 0.0  # 0: SGLang never stamped it
    return SimpleNamespace(rid=rid, time_stats=SimpleNamespace(wait_queue_entry_time=stamp))


class _Scheduler:
    def __init__(self, *reqs) -> None:
        self.waiting_queue = list(reqs)

    def _abort_on_waiting_timeout(self):  # 0.5.19's decision, on this rank's own clock
        if (timeout_s := envs.SGLANG_REQ_WAITING_TIMEOUT.get()) <= 0:
            return
        deadline = time.perf_counter() - timeout_s
        deleted = {
            id(r) for r in self.waiting_queue if 0 < r.time_stats.wait_queue_entry_time < deadline
        }
        if deleted:
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in deleted]


WRAPPED = source_probes._wrap_waiting_timeout(_Scheduler._abort_on_waiting_timeout)


def _recorder(tmp_path):
    rec = StepRecorder(str(tmp_path / "rank0.jsonl"), 0, 0, 0, Hooks(rank=0, pp_rank=0, tp_rank=0))
    hook_points.STATE.recorder = rec
    return rec


def test_records_the_read_and_the_rids_it_dropped(tmp_path):
    rec = _recorder(tmp_path)
    try:
        s = _Scheduler(_req("o036", 1.7), _req("o037", 1.0), _req("o038", 0.0))
        assert WRAPPED(s) is None
        assert [r.rid for r in s.waiting_queue] == ["o037", "o038"]  # SGLang's own drop
        probe = rec._reads["waiting-clock"]
        assert probe["n"] == 1 and 0.15 <= probe["v"][0] < 0.5  # 1.7 s waited, 1.5 s allowed
        assert probe["d"] == [["o036"]] and rec._counts["waiting_timeouts"] == 1
        rec._reads.clear()
        WRAPPED(s)  # nothing due: read, nothing decided
        assert (
            "d" not in rec._reads["waiting-clock"]
            and -0.6 < rec._reads["waiting-clock"]["v"][0] < -0.4
        )
        assert rec._counts["waiting_timeouts"] == 1
    finally:
        hook_points.reset()


def test_reads_nothing_without_a_timeout_a_queue_or_a_recorder(tmp_path, monkeypatch):
    s = _Scheduler(_req("a", 2.0))
    hook_points.reset()
    WRAPPED(s)  # no recorder: SGLang's call alone
    assert s.waiting_queue == []
    rec = _recorder(tmp_path)
    try:
        WRAPPED(_Scheduler())  # an empty queue: nothing read
        monkeypatch.setattr(envs.SGLANG_REQ_WAITING_TIMEOUT, "value", 0)
        kept = _Scheduler(_req("b", 9.0))
        WRAPPED(kept)  # SGLang's own early return
        assert [r.rid for r in kept.waiting_queue] == ["b"] and rec._reads == {}
    finally:
        hook_points.reset()


def test_only_releases_that_decide_per_rank_arm_it(monkeypatch):
    armed: set[str] = set()
    monkeypatch.setattr(source_probes, "ARMED", armed)
    patched = []
    monkeypatch.setattr(source_probes, "patch_attr", lambda cls, name, make: patched.append(name))
    hooks = {}
    monkeypatch.setattr(
        source_probes, "when_imported", lambda module, fn: hooks.setdefault(module, fn)
    )
    source_probes._arm("m", "Scheduler", "_abort_on_waiting_timeout", ("waiting-clock",), WRAPPED)
    hooks["m"](SimpleNamespace(Scheduler=type("Scheduler", (), {"_poll_timeout_aborts": 1})))
    assert armed == set() and patched == []  # 0.5.20+: PP0 decides, relayed
    hooks["m"](SimpleNamespace(Scheduler=_Scheduler))
    assert armed == {"waiting-clock"} and patched == ["_abort_on_waiting_timeout"]
