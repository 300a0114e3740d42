"""A recorded rank's dumps (issue 37): its dumper thread answers each new dump-request id once,
and the operator's signal once per signal, with a snapshot taken from inside the process (the
last step lines held in memory, queues, pools, tree digest, every thread's stack); SGLang's
watchdog and the consensus checker's mismatch fire one through the plugin's own patches."""

from __future__ import annotations

import logging
import os
import signal
import time
from types import SimpleNamespace

import pytest

from hicache_diag.engines.sglang.plugin import boot, consensus_block, dumps, hook_points
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.evidence import recording as rec
from hicache_diag.faults.hooks import Hooks


class _Pool:
    def available_size(self):
        return 96


def _scheduler():
    return SimpleNamespace(
        token_to_kv_pool_allocator=_Pool(),
        waiting_queue=[1, 2, 3],
        running_batch=SimpleNamespace(reqs=[1]),
        forward_ct=17,
    )


@pytest.fixture
def rank(tmp_path):
    meta = rec.RankMeta(0, 0, 0, os.getpid(), "h", "0.5.23", ["extend_num_tokens"], 0.0, {})
    recording = rec.RankRecording(tmp_path / "s", meta, rec.Limits(reserve_bytes=0))
    recorder = StepRecorder(str(tmp_path / "rank0.jsonl"), 0, 0, 0, Hooks(rank=0))
    for _ in range(3):
        recorder.begin_step()
        recorder.end_step(object(), SimpleNamespace(reqs=[], forward_mode=None))
    state = SimpleNamespace(scheduler=_scheduler())
    dumper = dumps.RankDumper(recording, recorder, state)
    yield dumper
    recording.turn_off("test over")  # the dumper thread ends with the recording
    dumper.thread.join(2) if dumper.thread.is_alive() else None
    recorder.close()


def _dumps(dumper, n: int, timeout_s: float = 5.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = rec.read_rank(dumper.session, 0).dumps
        if len(found) >= n:
            return found
        time.sleep(0.05)
    return rec.read_rank(dumper.session, 0).dumps


def test_a_snapshot_holds_the_last_lines_queues_pools_and_every_threads_stack(rank):
    path = rank.dump("watchdog", detail={"watchdog": "Scheduler", "soft": False})
    snap = rec.read_rank(rank.session, 0).snapshots[0]
    assert path is not None and snap.reason == "watchdog" and snap.pid == os.getpid()
    assert [s.step for s in snap.steps] == [0, 1, 2] and snap.last_step == 2 and snap.step == 3
    assert snap.scheduler == {"waiting": 3, "running": 1, "forward_ct": 17}
    assert snap.device_free == 96 and snap.detail["watchdog"] == "Scheduler"
    main = snap.main_thread
    assert main is not None and main.frames[-1].endswith("in thread_dumps")
    assert any("test_a_snapshot_holds" in f for f in main.frames) and snap.errors == []


def test_each_new_request_is_answered_once(rank):
    rank.start()
    rec.write_dump_request(rank.session, "triage-1")
    first = _dumps(rank, 1)
    assert [(d["reason"], d["request"]) for d in first] == [("asked", "triage-1")]
    rec.write_dump_request(rank.session, "triage-1", now=time.time() + 5)  # same id, rewritten
    time.sleep(0.8)
    assert len(rec.read_rank(rank.session, 0).dumps) == 1
    rec.write_dump_request(rank.session, "triage-2")
    assert [d["request"] for d in _dumps(rank, 2)] == ["triage-1", "triage-2"]


def test_the_operators_signal_gives_one_dump_per_signal(rank):
    name = rank.install_signal()
    try:
        assert name == "SIGUSR2" and rank._wakeup is not None
        rank.start()
        os.kill(os.getpid(), signal.SIGUSR2)
        found = _dumps(rank, 1)
        time.sleep(0.6)  # the Python-level handler has run by now too: still one dump
        assert [d["reason"] for d in rec.read_rank(rank.session, 0).dumps] == ["signal"]
        assert found[0]["request"] is None
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)


def test_a_signal_someone_else_handles_is_left_alone(rank):
    def theirs(signum, frame):
        pass

    signal.signal(signal.SIGUSR2, theirs)
    try:
        assert rank.install_signal() is None
        assert signal.getsignal(signal.SIGUSR2) is theirs
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_sglangs_watchdog_fires_a_dump_before_its_own_py_spy_dump(rank):
    """WatchdogRaw._watchdog_once calls the module's pyspy_dump_schedulers() when it fires."""
    calls = []
    module = SimpleNamespace(pyspy_dump_schedulers=lambda: calls.append(len(rank_dumps(rank))))
    boot._patch_watchdog(module)

    class WatchdogRaw:  # SGLang's fields, as sglang/srt/utils/watchdog.py has them
        debug_name, soft, watchdog_timeout = "Scheduler", True, 300

        def _watchdog_once(self):
            module.pyspy_dump_schedulers()

    dumps.RANK[:] = [rank]
    try:
        WatchdogRaw()._watchdog_once()
    finally:
        dumps.RANK.clear()
    snap = rec.read_rank(rank.session, 0).snapshots[0]
    assert calls == [1]  # ours was on disk before SGLang's py-spy dump started
    assert snap.reason == "watchdog"
    assert snap.detail == {"watchdog": "Scheduler", "soft": True, "timeout_s": 300}


def rank_dumps(dumper) -> list[dict]:
    return rec.read_rank(dumper.session, 0).dumps


def test_the_checkers_mismatch_goes_into_a_dump_in_a_recorded_server(rank):
    state = SimpleNamespace(scheduler=_scheduler(), recorder=rank.recorder)
    handler = consensus_block.BlockHandler(None, 0, 0, 0, state)
    dumps.RANK[:] = [rank]
    try:
        line = "Found rank divergence for 1 events(s)! local hash: ab12, events = ['x']"
        handler.emit(logging.LogRecord("c", logging.CRITICAL, "f", 1, line, None, None))
    finally:
        dumps.RANK.clear()
    snap = rec.read_rank(rank.session, 0).snapshots[0]
    assert snap.reason == "mismatch" and handler.written == "dump"
    block = snap.detail["block"]
    assert block["local_hash"] == "ab12" and [s["step"] for s in block["steps"]] == [0, 1, 2]


def test_a_dump_fired_where_no_rank_is_recorded_does_nothing():
    hook_points.reset()
    dumps.RANK.clear()
    dumps.fire("exception", {"error": "x"})  # run --engine sglang: no recording, no dump


def test_a_stuck_disk_never_holds_sglangs_thread_in_a_fired_dump(rank, monkeypatch):
    """The watchdog's own thread fires the dump: if the write hangs, SGLang still gets its
    thread back (and goes on to its SIGQUIT) after WAIT_S."""
    from hicache_diag.engines.sglang.plugin import sinks

    monkeypatch.setattr(sinks, "WAIT_S", 0.2)
    release = __import__("threading").Event()
    monkeypatch.setattr(rank.recording, "dump", lambda doc, reason: release.wait(10))
    dumps.RANK[:] = [rank]
    try:
        start = time.monotonic()
        dumps.fire("watchdog", {"watchdog": "Scheduler"})
        assert time.monotonic() - start < 2.0
    finally:
        release.set()
        dumps.RANK.clear()
