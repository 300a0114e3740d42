"""The plugin's parts without SGLang: post-import patching, hook points, the recorder, log split."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from hicache_diag.engines.sglang.plugin import dma_points, hook_points, pool_points
from hicache_diag.engines.sglang.plugin.hook_state import apply_hook
from hicache_diag.engines.sglang.plugin.post_import import patch_attr, when_imported
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.engines.sglang.trial import split_rank_logs
from hicache_diag.faults.hooks import Hooks


@pytest.fixture
def fake_module(tmp_path, monkeypatch):
    (tmp_path / "hd_fake_mod.py").write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "hd_fake_mod"
    sys.modules.pop("hd_fake_mod", None)


def test_patch_lands_before_anyone_imports_the_name(fake_module):
    when_imported(fake_module, lambda m: patch_attr(m, "f", lambda orig: lambda: orig() + 41))
    from hd_fake_mod import f  # a by-name import, as SGLang's modules do

    assert f() == 42
    import hd_fake_mod

    patch_attr(hd_fake_mod, "f", lambda orig: lambda: 0)  # a second patch is a no-op
    assert hd_fake_mod.f() == 42


def test_hook_points_do_nothing_until_a_rank_is_armed():
    hook_points.reset()
    assert apply_hook("host_alloc", True, num_tokens=8) is True
    hooks = Hooks(rank=1, pp_rank=1)
    hooks.register("host_alloc", lambda ok, ctx: False)
    hook_points.STATE.hooks = hooks
    try:
        alloc = pool_points.wrap_host_alloc(lambda self, n: f"slots:{n}")
        assert alloc(None, 8) is None  # what the pool returns when it is short
    finally:
        hook_points.reset()


def test_every_empty_host_alloc_is_counted_faulted_or_short(tmp_path):
    # Evidence for the divergence source: the pool's own None counts too, not only a fault's.
    hooks = Hooks(rank=1, pp_rank=1)
    hooks.register("host_alloc", lambda ok, ctx: ok and ctx["num_tokens"] != 4)
    rec = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, hooks)
    hook_points.STATE.hooks, hook_points.STATE.recorder = hooks, rec
    try:
        alloc = pool_points.wrap_host_alloc(lambda self, n: None if n > 100 else f"slots:{n}")
        assert [alloc(None, n) for n in (8, 4, 200)] == ["slots:8", None, None]
        rec.begin_step()
        rec.end_step(_scheduler(), None)
    finally:
        hook_points.reset()
        rec.close()
    line = json.loads((tmp_path / "rank1.jsonl").read_text().splitlines()[-1])
    assert line["host_alloc_failed"] == 2 and not line.get("idle"), line


def test_crash_line_keeps_what_the_step_counted_before_it_raised(tmp_path):
    hooks = Hooks(rank=1, pp_rank=1)
    rec = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, hooks)
    rec.begin_step()
    rec.count("host_alloc_failed", 1)
    rec.write_crash(IndexError("pop from empty list"))
    rec.close()
    line = json.loads((tmp_path / "rank1.jsonl").read_text())
    assert line["crashed"] is True and line["error"] == "IndexError: pop from empty list"
    assert (line["host_alloc_failed"], line["pp"], line["step"]) == (1, 1, 0)
    assert "must_agree" not in line  # a step cut short is compared with nothing


def test_a_crash_after_the_steps_line_names_that_step_once(tmp_path):
    # Form A raises in the forward, after get_next_batch_to_run wrote step 0's line; the event
    # loop's wrapper writes the crash line, the step wrapper (not reached) does not repeat it.
    rec = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, Hooks(rank=1, pp_rank=1))
    rec.begin_step()
    rec.end_step(_scheduler(), _batch())
    rec.write_crash(RuntimeError("shape '[58, -1, 16]' is invalid for input of size 7744"))
    rec.write_crash(RuntimeError("the same exception, leaving the next wrapper"))
    rec.close()
    lines = [json.loads(x) for x in (tmp_path / "rank1.jsonl").read_text().splitlines()]
    assert [(x["step"], x.get("crashed", False)) for x in lines] == [(0, False), (0, True)]
    assert lines[1]["error"].startswith("RuntimeError: shape '[58, -1, 16]'")


class _Event:
    def __init__(self) -> None:
        self.synced = False

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synced = True


def test_dma_delay_makes_the_completion_late_for_the_ack_and_the_forward_alike(tmp_path):
    """The late copy's one event stands in everywhere SGLang handed it out: the ack, the
    allocator's transfer-done event, and the producer's per-layer events the forward waits on."""
    from collections import namedtuple

    Ack = namedtuple("Ack", "start_event finish_event node_ids num_tokens")
    hooks = Hooks()
    hooks.register("dma_complete", lambda v, ctx: v + 0.2 if ctx["direction"] == "load" else v)
    hook_points.STATE.hooks = hooks
    hook_points.STATE.recorder = StepRecorder(str(tmp_path / "rank1.jsonl"), 1, 1, 0, hooks)
    handed = {}

    class Layer:  # LayerLoadingEvent's shape
        def __init__(self):
            self.load_events = [_Event(), _Event()]

        def wait(self, layer_index):
            return layer_index

    class Controller:
        def __init__(self):
            self.load_queue = [SimpleNamespace(device_indices=[0, 1, 2, 3])]
            self.ack_load_queue = []
            self.layer_done_counter = SimpleNamespace(events=[Layer(), Layer(), Layer()])
            self.mem_pool_device_allocator = SimpleNamespace(
                set_hicache_transfer_done_event=lambda key, ev: handed.update({key[1]: ev})
            )

        def start_loading(self):
            self.ack_load_queue.append(Ack(None, _Event(), [1], 4))
            self.load_queue = []
            return 1

    try:
        cc = Controller()
        assert dma_points.wrap_start("load", "ack_load_queue")(Controller.start_loading)(cc) == 1
        ack_event = cc.ack_load_queue[0].finish_event
        assert not ack_event.query() and not handed["load"].query()
        layer = cc.layer_done_counter.events[1]
        assert not layer.load_events[-1].query()  # update_producer's assert would see it
        assert cc.layer_done_counter.events[0].load_events[0].query()  # other producers: on time
        wait = dma_points.wrap_layer_wait(Layer.wait)
        t0 = time.monotonic()
        wait(layer, 0)  # the forward's wait on layer 0 blocks until the copy is done
        assert time.monotonic() - t0 >= 0.15 and ack_event.query()
        assert hook_points.STATE.recorder._waits["dma_wait_ms"] >= 150
    finally:
        hook_points.reset()


def _scheduler(free: int = 100):
    cc = SimpleNamespace(
        write_queue=[],
        load_queue=[],
        ack_write_queue=[],
        ack_load_queue=[],
        mem_pool_host=SimpleNamespace(available_size=lambda: 64),
    )
    tree = SimpleNamespace(cache_controller=cc, evictable_size=lambda: 3, protected_size=lambda: 0)
    return SimpleNamespace(
        tree_cache=tree, token_to_kv_pool_allocator=SimpleNamespace(available_size=lambda: free)
    )


def _batch():
    mode = SimpleNamespace(name="EXTEND", is_extend=lambda: True)
    req = SimpleNamespace(rid="r0", prefix_len=8, host_hit_length=4, storage_hit_length=0)
    return SimpleNamespace(reqs=[req], forward_mode=mode, extend_num_tokens=12)


def test_recorder_writes_busy_steps_and_folds_idle_polls(tmp_path):
    path = tmp_path / "rank1.jsonl"
    rec = StepRecorder(str(path), 1, 1, 0, Hooks(rank=1, pp_rank=1))
    for _ in range(5):  # idle polls: folded, not written one by one
        rec.begin_step()
        rec.end_step(_scheduler(), None)
    rec.begin_step()
    rec.consumed("write", 2)
    rec.end_step(_scheduler(), _batch())
    rec.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    busy = lines[-1]
    assert busy["step"] == 5 and busy["idle_polls"] >= 4
    assert busy["rids"] == ["r0"] and busy["extend_num_tokens"] == 12
    assert busy["prefix_len"] == {"r0": 8} and busy["host_hit_len"] == {"r0": 4}
    assert busy["acks_consumed"] == {"write": 2, "load": 0}
    assert busy["host_free"] == 64 and busy["device_free"] == 100
    assert set(busy["must_agree"]) <= set(busy) and "rids" in busy["must_agree"]
    assert all(line.get("idle") for line in lines[:-1])  # at most the first heartbeat


def test_recorder_survives_a_scheduler_it_cannot_read(tmp_path):
    path = tmp_path / "rank0.jsonl"
    rec = StepRecorder(str(path), 0, 0, 0, Hooks())
    rec.begin_step()
    rec.end_step(SimpleNamespace(token_to_kv_pool_allocator=None, tree_cache=object()), object())
    rec.close()
    assert rec.step == 1  # the step still counts; the line says what broke
    assert "recorder_error" in path.read_text() or "rids" in path.read_text()


def test_rank_logs_split_on_sglang_prefixes_and_keep_traceback_bodies(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        textwrap.dedent("""\
        [2026-12-01 02:46:52] server_args=...
        [2026-12-01 02:46:52 PP0] Load weight begin.
        [2026-12-01 02:46:53 PP1 TP0] Scheduler hit an exception: Traceback (most recent call last):
          File "x.py", line 1, in writing_check
        IndexError: pop from empty list
        [2026-12-01 02:46:54] SIGQUIT received.
        [2026-12-01 02:46:54 PP0] RuntimeError: Connection closed by peer
    """)
    )
    paths = split_rank_logs(log, tmp_path, tp_size=1)
    assert sorted(paths) == [0, 1]
    rank1 = paths[1].read_text()
    assert "IndexError: pop from empty list" in rank1 and "SIGQUIT" not in rank1
    assert "Connection closed by peer" in paths[0].read_text()


def test_recorder_reads_tensor_fields_by_length_not_truth(tmp_path):
    """0.5.18/0.5.21 keep `prefix_indices` as a tensor (no `prefix_len`): an empty one has no
    truth value, and `or ()` raised on every prefill, leaving the recorder blind."""
    import torch

    path = tmp_path / "rank0.jsonl"
    rec = StepRecorder(str(path), 0, 0, 0, Hooks())
    reqs = [
        SimpleNamespace(
            rid="a",
            prefix_indices=torch.empty(0, dtype=torch.int64),
            host_hit_length=torch.tensor(0),
        ),
        SimpleNamespace(rid="b", prefix_indices=torch.arange(6), host_hit_length=2),
    ]
    batch = _batch()
    batch.reqs, batch.extend_num_tokens = reqs, torch.tensor(10)
    rec.begin_step()
    rec.end_step(_scheduler(), batch)
    rec.close()
    line = json.loads(path.read_text().splitlines()[-1])
    assert "recorder_error" not in line
    assert line["prefix_len"] == {"a": 0, "b": 6} and line["host_hit_len"] == {"a": 0, "b": 2}
    assert line["extend_num_tokens"] == 10


def test_every_failed_step_is_counted_and_written_at_most_once_a_second(tmp_path):
    path = tmp_path / "rank0.jsonl"
    rec = StepRecorder(str(path), 0, 0, 0, Hooks())
    broken = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(available_size=None))
    for _ in range(50):
        rec.begin_step()
        rec.end_step(broken, None)
    rec.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines and all("recorder_error" in x for x in lines)
    assert len(lines) < 50  # folded, not one line per failed poll
    assert lines[0]["recorder_errors"] == 1 and "TypeError" in lines[0]["recorder_error"]


def test_a_start_up_failure_is_the_environments_only_before_any_scheduler_stepped(tmp_path):
    """0.5.13's form B can come while SGLang serves its own readiness request: once a rank has
    recorded a step the failure is the run's, not the environment's."""
    from hicache_diag.engines.sglang.trial import _any_step_recorded

    assert not _any_step_recorded(tmp_path, 2)
    (tmp_path / "rank1.jsonl").write_text("")
    assert not _any_step_recorded(tmp_path, 2)
    (tmp_path / "rank1.jsonl").write_text('{"step": 0}\n')
    assert _any_step_recorded(tmp_path, 2)
