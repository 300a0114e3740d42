"""A recorded server's plugin is never in the way (issue 37): in production every patch is
guarded, so whatever the plugin's own code raises around SGLang's call (a probe, the recorder,
a wrapper) turns the rank's recording off, once, while SGLang's call is made and its result
kept; SGLang's own exceptions pass through as the very same object."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from hicache_diag.engines.sglang.plugin import hook_points, post_import, production, source_probes
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.evidence import recording as rec
from hicache_diag.faults.hooks import Hooks


@pytest.fixture
def guarded():
    said: list[str] = []
    post_import.guard_patches(said.append)
    yield said
    post_import._on_failure.clear()


def _patched(make):
    class Owner:
        def call(self, x):
            return x * 2

    post_import.patch_attr(Owner, "call", make)
    return Owner()


def test_a_wrapper_raising_before_sglangs_call_still_makes_it(guarded):
    def make(original):
        def call(self, x):
            raise KeyError("probe")

        return call

    assert _patched(make).call(21) == 42
    assert guarded == ["Owner.call: KeyError: 'probe'"]


def test_a_wrapper_raising_after_sglangs_call_keeps_its_result(guarded):
    calls = []

    def make(original):
        def call(self, x):
            result = original(self, x)
            calls.append(result)
            raise ValueError("recorder")

        return call

    assert _patched(make).call(5) == 10 and calls == [10]  # made once, never twice
    assert len(guarded) == 1 and "ValueError: recorder" in guarded[0]


def test_sglangs_own_exception_passes_through_as_the_same_object(guarded):
    boom = RuntimeError("shape '[4, -1, 64]' is invalid")

    class Owner:
        def call(self):
            raise boom

    def make(original):
        def call(self):
            try:
                return original(self)
            except RuntimeError:
                raise  # what the event-loop wrapper does after writing the crash line

        return call

    post_import.patch_attr(Owner, "call", make)
    with pytest.raises(RuntimeError) as caught:
        Owner().call()
    assert caught.value is boom and guarded == []


def test_nested_guarded_calls_each_keep_their_own_result(guarded):
    class Inner:
        def get(self):
            return "inner"

    def fail_after(original):
        def get(self):
            original(self)
            raise OSError("disk")

        return get

    post_import.patch_attr(Inner, "get", fail_after)
    inner = Inner()

    class Outer:
        def run(self):
            return inner.get() + "+outer"

    post_import.patch_attr(Outer, "run", lambda original: original)
    assert Outer().run() == "inner+outer"
    assert len(guarded) == 1 and "Inner.get: OSError: disk" in guarded[0]


def test_without_the_guard_a_run_sees_the_plugins_error():
    """`run --engine sglang` is unchanged: a broken wrapper is loud there."""

    def make(original):
        def call(self, x):
            raise KeyError("probe")

        return call

    with pytest.raises(KeyError):
        _patched(make).call(1)


def _recorder(tmp_path, on_failure=None) -> StepRecorder:
    recorder = StepRecorder(str(tmp_path / "rank0.jsonl"), 0, 0, 0, Hooks(rank=0))
    recorder.on_failure = on_failure
    return recorder


def test_a_probe_raising_in_production_turns_the_rank_off_and_sglang_goes_on(tmp_path):
    said: list[str] = []
    hook_points.STATE.recorder = _recorder(tmp_path, said.append)
    try:
        tree = SimpleNamespace(enable_storage=True, cache_controller=SimpleNamespace())
        drain = source_probes._wrap_drain(lambda self: "drained")
        source_probes.control_queue_sizes = _raise  # the probe's read fails
        try:
            assert drain(tree) == "drained"
        finally:
            source_probes.control_queue_sizes = _real_sizes
    finally:
        hook_points.reset()
    assert len(said) == 1 and said[0].startswith("probe l3-control-queues: ZeroDivisionError")


def _raise(*_args):
    return 1 / 0


_real_sizes = source_probes.control_queue_sizes


def test_a_step_that_cannot_be_recorded_in_production_turns_the_rank_off(tmp_path):
    said: list[str] = []
    recorder = _recorder(tmp_path, said.append)
    bad = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(available_size=_raise))
    recorder.begin_step()
    recorder.end_step(bad, batch=None)
    recorder.close()
    assert len(said) == 1 and "ZeroDivisionError" in said[0]
    lines = (tmp_path / "rank0.jsonl").read_text().splitlines()
    assert not any("recorder_error" in ln for ln in lines)  # a run would have written one


def test_rank_off_says_so_once_in_the_log_and_the_meta(tmp_path, caplog):
    off = production.RankOff()
    off.rank = 3
    recording = rec.RankRecording(tmp_path / "s", _meta(3), rec.Limits(reserve_bytes=0), off)
    hook_points.STATE.recorder = object()
    try:
        with caplog.at_level(logging.WARNING, logger="hicache_diag.recorder"):
            recording.turn_off("probe host-alloc: KeyError: 'x'")
            off("a second failure")
            recording.turn_off("a third")
        assert hook_points.STATE.recorder is None
    finally:
        hook_points.reset()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["hicache-diag recorder off on rank 3: probe host-alloc: KeyError: 'x'"]
    meta = json.loads(rec.meta_path(tmp_path / "s", 3).read_text())
    assert meta["on"] is False and meta["off_reason"] == "probe host-alloc: KeyError: 'x'"


def _meta(rank: int) -> rec.RankMeta:
    return rec.RankMeta(rank, rank, 0, 1, "h", "0.5.23", ["extend_num_tokens"], 0.0, {})


def test_arming_where_no_folder_can_be_made_leaves_no_recorder_and_says_why(tmp_path, caplog):
    """A record dir that cannot hold the session (here a file in its path: refused even to
    root, as a read-only mount is): the rank serves unrecorded, and its log line says why."""
    (tmp_path / "file").write_text("")
    try:
        with caplog.at_level(logging.WARNING, logger="hicache_diag.recorder"):
            session = str(tmp_path / "file" / "session")
            production.arm_rank(session, Hooks(rank=1), None, (1, 1, 0))
        assert hook_points.STATE.recorder is None
    finally:
        hook_points.reset()
        production.OFF.__init__()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("hicache-diag recorder off on rank 1: ")
    assert "Not a directory" in said[0]


def test_a_rank_another_live_process_records_is_not_recorded_twice(tmp_path, caplog):
    """Two processes with one rank number in one session (data-parallel replicas): the second
    stays off rather than interleave its lines with the first's."""
    session = tmp_path / "s"
    rec.RankRecording(session, rec.RankMeta(0, 0, 0, 1, "h", None, [], 0.0, {}), None).close()
    try:
        with caplog.at_level(logging.WARNING, logger="hicache_diag.recorder"):
            production.arm_rank(str(session), Hooks(rank=0), None, (0, 0, 0))
        assert hook_points.STATE.recorder is None
    finally:
        hook_points.reset()
        production.OFF.__init__()
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "hicache-diag recorder off on rank 0: rank 0 of this session is recorded by pid 1 already"
    ]
