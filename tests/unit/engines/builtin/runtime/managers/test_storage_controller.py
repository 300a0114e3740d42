"""StorageController: real threads, real files; the comm is an in-process stand-in that runs
the MIN across two "ranks" (two controllers in this process) and records which thread called."""

from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import time
import traceback

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache_diag.engines.builtin.runtime.managers.storage_builder import build_storage_controller
from hicache_diag.engines.builtin.runtime.managers.storage_controller import (
    STORAGE_QUEUES,
    StorageController,
)
from hicache_diag.engines.builtin.runtime.managers.storage_operation import PrefetchTimeoutConfig
from hicache_diag.engines.builtin.runtime.mem_cache.hicache_storage import (
    HiCacheFile,
    HiCacheStorageConfig,
    get_page_hashes,
)
from hicache_diag.engines.builtin.runtime.protocol import build_protocol
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from hicache_diag.errors import UsageError
from hicache_diag.faults.hooks import Hooks

PAGE = 2  # tokens per page
TOKENS = list(range(100, 110))  # 5 pages
HASHES = get_page_hashes(TOKENS, PAGE)
FULL = build_protocol("full")
PREFETCH = ServerArgs().hicache_storage_prefetch_policy  # the run's default (run_options.py)
LEGACY = build_protocol("legacy")


class TinyHostPool:
    """Layer-first host K/V as HostKVCache keeps them; a plain free list."""

    def __init__(self, size: int = 32, layers: int = 2, heads: int = 2, head_dim: int = 2):
        self.k_buffer = torch.zeros(layers, size, heads, head_dim)
        self.v_buffer = torch.zeros(layers, size, heads, head_dim)
        self.free_slots = list(range(size))
        self.size = size

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor(out, dtype=torch.int64)

    def free(self, indices: torch.Tensor) -> int:
        self.free_slots.extend(indices.tolist())
        return indices.numel()


class RankGroupComm:
    """One rank's end of an in-process all-reduce over `world` ranks; records every call as
    (thread name, group, value sent). A missing peer shows up as a barrier timeout (a hang)."""

    def __init__(self, rank: int, shared: dict, world: int, timeout: float = 5.0):
        self.rank, self.shared, self.world, self.timeout = rank, shared, world, timeout
        self.pp_rank, self.pp_size, self.tp_rank, self.tp_size = rank, world, 0, 1
        self.calls: list[tuple[str, str, int]] = []

    def all_reduce_thread_group(self, name: str, tensor: torch.Tensor, op: str = "min") -> None:
        self.calls.append((threading.current_thread().name, name, int(tensor.item())))
        slot = self.shared.setdefault(name, {"barrier": threading.Barrier(self.world), "v": {}})
        slot["v"][self.rank] = int(tensor.item())
        slot["barrier"].wait(self.timeout)
        result = min(slot["v"].values())
        slot["barrier"].wait(self.timeout)  # nobody overwrites before everyone has read
        tensor.fill_(result)

    def all_reduce_tp(self, tensor: torch.Tensor, op: str = "min") -> None:
        self.calls.append((threading.current_thread().name, "tp", int(tensor.sum())))

    def pp_sync(self, tensor: torch.Tensor) -> None:
        """PP0 -> PP1 relay: PP1 blocks until PP0's value arrives, as `_pp_sync` does."""
        relay = self.shared.setdefault("pp_sync", queue.Queue())
        if self.rank == 0:
            relay.put(tensor.clone())
        else:
            tensor.copy_(relay.get(timeout=self.timeout))


def comms(world: int) -> list[RankGroupComm]:
    shared: dict = {}
    return [RankGroupComm(r, shared, world) for r in range(world)]


@pytest.fixture
def make_ctrl(tmp_path):
    made: list[StorageController] = []

    def make(comm, protocol=FULL, hooks=None, **kw):
        cfg = HiCacheStorageConfig(pp_rank=comm.rank, pp_size=comm.world, model_name="tiny")
        storage = HiCacheFile(cfg, str(tmp_path / "l3"), hooks=hooks)
        kw.setdefault("storage_batch_size", 2)
        kw.setdefault("prefetch_policy", PREFETCH)
        ctrl = StorageController(storage, TinyHostPool(), PAGE, comm, protocol, **kw)
        ctrl.start()
        made.append(ctrl)
        return ctrl

    yield make
    for ctrl in made:
        assert ctrl.stop() == []
    left = [t.name for t in threading.enumerate() if t.name.startswith("hicache-")]
    assert left == [], f"storage threads left behind: {left}"


def fill(ctrl: StorageController, n_pages: int, hashes=HASHES) -> None:
    numel = ctrl.host_pages.page_numel()
    for i in range(n_pages):
        assert ctrl.storage.set(hashes[i], torch.full((numel,), float(i + 1)))


def hit_query(ctrls, tokens=TOKENS):
    ops = [c.prefetch(f"r{i}", tokens) for i, c in enumerate(ctrls)]
    got = [c.drain_queue("prefetch_hit_queue", 1, timeout=5)[0] for c in ctrls]
    assert [g is o for g, o in zip(got, ops, strict=True)] == [True] * len(ctrls)
    return ops


def run_io(ctrl: StorageController, op, expect_acks: int):
    assert ctrl.submit_prefetch_io(op)
    acks = ctrl.consume_prefetch_acks(expect_acks, timeout=5)
    time.sleep(0.05)
    assert ctrl.storage_queue_sizes()["ack_prefetch_queue"] == 0, "more acks than batches + 1"
    return acks


# ---- prefetch thread: hit count and its consensus -------------------------------------------


def test_l3_hit_min_agrees_on_the_shorter_prefix_in_the_prefetch_thread(make_ctrl):
    c0, c1 = (make_ctrl(c) for c in comms(2))
    fill(c0, 5)
    fill(c1, 3)  # rank 1 lacks pages 3 and 4
    op0, op1 = hit_query([c0, c1])
    assert (op0.storage_hit_count_local, op1.storage_hit_count_local) == (10, 6)
    assert op0.storage_hit_count == op1.storage_hit_count == 6
    assert op0.hash_value == op1.hash_value == HASHES[:3]
    for c in (c0, c1):
        assert c.comm.calls == [("hicache-prefetch", "prefetch_hits", c.comm.calls[0][2])]
    assert c0.probe_stats()["sync_received"]["l3_hit"] == 6


def test_l3_hit_local_keeps_each_ranks_own_count_and_calls_no_collective(make_ctrl):
    c0, c1 = (make_ctrl(c, LEGACY) for c in comms(2))
    fill(c0, 5)
    fill(c1, 3)
    op0, op1 = hit_query([c0, c1])
    assert (op0.storage_hit_count, op1.storage_hit_count) == (10, 6)  # the legacy divergence
    assert c0.comm.calls == c1.comm.calls == []


def test_partial_hit_hook_shortens_one_rank_and_min_absorbs_it(make_ctrl):
    hooks = Hooks()
    hooks.register("storage_exists", lambda found, ctx: min(found, 1))
    pair = comms(2)
    c0, c1 = make_ctrl(pair[0]), make_ctrl(pair[1], hooks=hooks)
    fill(c0, 5)
    fill(c1, 5)
    op0, op1 = hit_query([c0, c1])
    assert op1.storage_hit_count_local == 2 and op0.storage_hit_count_local == 10
    assert op0.storage_hit_count == op1.storage_hit_count == 2


def test_failed_or_terminated_query_still_joins_the_min_once(make_ctrl):
    class Broken(HiCacheFile):
        def exists(self, key):
            raise OSError("storage gone")

    c0, c1 = (make_ctrl(c) for c in comms(2))
    c1.storage.__class__ = Broken
    fill(c0, 5)
    op0, op1 = hit_query([c0, c1])
    assert op0.storage_hit_count == op1.storage_hit_count == 0
    assert [f.op for f in c1.drain_storage_faults()] == ["query"]
    # terminated before the query: zero hits, but the collective still runs (call counts match)
    c1.storage.__class__ = HiCacheFile
    ops = [c.prefetch("t", TOKENS) for c in (c0, c1)]
    ops[0].mark_terminate()
    for c in (c0, c1):
        c.drain_queue("prefetch_hit_queue", 1, timeout=5)
    assert ops[0].storage_hit_count == ops[1].storage_hit_count == 0
    assert len(c0.comm.calls) == len(c1.comm.calls) == 2


# ---- IO + sync threads: message conservation --------------------------------------------------


def test_reads_land_in_host_memory_with_one_ack_per_batch_then_completion(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    fill(c, 5)
    (op,) = hit_query([c])
    acks = run_io(c, op, expect_acks=4)  # batches of 2 pages: 2 + 2 + 1, then completion
    assert [a.completed_tokens for a in acks[:3]] == [4, 8, 10]
    assert acks[3].completed_req and op.io_done and op.completed_tokens == 10
    for i in range(5):
        page = c.host_pages.get_page(op.host_indices[i * PAGE : (i + 1) * PAGE])
        assert torch.equal(page, torch.full_like(page, float(i + 1))), f"page {i}"


@pytest.mark.parametrize(
    ("failing", "expected"),
    [
        ({1}, [2, 2, 2]),  # a hole in batch 0: that batch stops, later batches are skipped
        ({3}, [4, 6, 6]),
        ({0, 1, 2, 3, 4}, [0, 0, 0]),
    ],
)
def test_read_failures_still_give_one_ack_per_batch(make_ctrl, failing, expected):
    hooks = Hooks()
    hooks.register("storage_read", lambda ok, ctx: ctx["page_index"] not in failing)
    (c,) = (make_ctrl(x, hooks=hooks) for x in comms(1))
    fill(c, 5)
    (op,) = hit_query([c])
    acks = run_io(c, op, expect_acks=4)
    assert [a.completed_tokens for a in acks[:3]] == expected
    assert acks[3].completed_req and op.completed_tokens_local == expected[-1]


def test_truncated_page_is_a_reported_fault_and_the_acks_keep_flowing(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    fill(c, 5)
    with open(c.storage.key_path(HASHES[2]), "r+b") as f:
        f.truncate(5)
    (op,) = hit_query([c])
    assert op.storage_hit_count == 10  # exists() still counts it, as SGLang does
    acks = run_io(c, op, expect_acks=4)
    assert [a.completed_tokens for a in acks[:3]] == [4, 4, 4]
    (fault,) = c.drain_storage_faults()
    assert fault.op == "read" and fault.key == HASHES[2] and "short read" in fault.reason
    assert c.probe_stats()["threads_alive"] == 4


def test_a_backend_that_raises_mid_read_costs_pages_not_acks(make_ctrl):
    class Exploding(HiCacheFile):
        def get(self, key, target_location=None):
            raise RuntimeError("driver crashed")

    (c,) = (make_ctrl(x) for x in comms(1))
    fill(c, 5)
    (op,) = hit_query([c])
    c.storage.__class__ = Exploding
    acks = run_io(c, op, expect_acks=4)
    assert [a.completed_tokens for a in acks[:3]] == [0, 0, 0] and acks[3].completed_req
    assert [f.op for f in c.drain_storage_faults()] == ["read"]


def test_l3_progress_min_runs_in_the_sync_thread_over_its_own_group(make_ctrl):
    hooks = Hooks()
    hooks.register("storage_read", lambda ok, ctx: ctx["page_index"] != 3)
    pair = comms(2)
    c0, c1 = make_ctrl(pair[0]), make_ctrl(pair[1], hooks=hooks)
    fill(c0, 5)
    fill(c1, 5)
    op0, op1 = hit_query([c0, c1])
    for c, op in ((c0, op0), (c1, op1)):
        assert c.submit_prefetch_io(op)
    a0, a1 = (c.consume_prefetch_acks(4, timeout=5) for c in (c0, c1))
    assert [a.completed_tokens for a in a0[:3]] == [a.completed_tokens for a in a1[:3]] == [4, 6, 6]
    assert [a.completed_tokens_local for a in a0[:3]] == [4, 8, 10]
    for c in (c0, c1):
        groups = {}
        for thread, group, _ in c.comm.calls:
            groups.setdefault(group, set()).add(thread)
        assert groups == {
            "prefetch_hits": {"hicache-prefetch"},
            "prefetch_completion": {"hicache-prefetch-sync"},
        }, "a communicator shared between two threads"


def test_l3_progress_local_reports_each_ranks_own_progress(make_ctrl):
    hooks = Hooks()
    hooks.register("storage_read", lambda ok, ctx: ctx["page_index"] != 3)
    pair = comms(2)
    c0, c1 = make_ctrl(pair[0], LEGACY), make_ctrl(pair[1], LEGACY, hooks=hooks)
    fill(c0, 5)
    fill(c1, 5)
    op0, op1 = hit_query([c0, c1])
    acks = [run_io(c, op, 4) for c, op in ((c0, op0), (c1, op1))]
    assert [a.completed_tokens for a in acks[0][:3]] == [4, 8, 10]
    assert [a.completed_tokens for a in acks[1][:3]] == [4, 6, 6]  # the legacy divergence


def test_local_hits_with_min_progress_unbalance_the_collective(make_ctrl):
    """l3-hit=local + l3-progress=min: ranks with different hit lengths make a different number
    of progress MINs; on a real gloo group that is a hang. Here: the call counts differ."""
    proto = build_protocol("legacy", ["l3-progress=min"])
    hooks = Hooks()
    hooks.register("storage_exists", lambda found, ctx: min(found, 1))
    pair = comms(2)
    for comm in pair:
        comm.timeout = 1.0
    c0, c1 = make_ctrl(pair[0], proto), make_ctrl(pair[1], proto, hooks=hooks)
    fill(c0, 5)
    fill(c1, 5)
    op0, op1 = hit_query([c0, c1])
    assert (len(op0.hash_value), len(op1.hash_value)) == (5, 1)
    for c, op in ((c0, op0), (c1, op1)):
        c.submit_prefetch_io(op)

    def progress_calls(c):
        return sum(g == "prefetch_completion" for _, g, _ in c.comm.calls)

    deadline = time.monotonic() + 20
    while progress_calls(c0) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (progress_calls(c0), progress_calls(c1)) == (3, 1)  # 3 batches vs 1: no partner
    # the unmatched MIN broke (a hang on gloo); the thread survived, acks still flow
    assert any(f.op == "thread" for f in c0.drain_storage_faults())
    assert len(c0.consume_prefetch_acks(4, timeout=10)) == 4


def test_host_pool_short_means_no_io_and_no_acks(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    fill(c, 5)
    (op,) = hit_query([c])
    c.host_pool.free_slots = c.host_pool.free_slots[:3]
    assert not c.submit_prefetch_io(op)
    with pytest.raises(TimeoutError, match="0 of 1"):
        c.drain_queue("ack_prefetch_queue", 1, timeout=0.3)


# ---- backup thread ---------------------------------------------------------------------------


def test_backup_writes_pages_that_a_second_controller_reads_back(make_ctrl):
    c0, c1 = (make_ctrl(x) for x in comms(1) + comms(1))
    slots = c0.host_pool.alloc(len(TOKENS))
    c0.host_pool.k_buffer[:, slots] = torch.randn(2, len(TOKENS), 2, 2)
    c0.host_pool.v_buffer[:, slots] = torch.randn(2, len(TOKENS), 2, 2)
    c0.write_storage(slots, TOKENS)
    (done,) = c0.drain_queue("ack_backup_queue", 1, timeout=5)
    assert done.completed_tokens == 10 and done.hash_value == HASHES
    (op,) = hit_query([c1])  # warm start: another controller over the same directory
    assert op.storage_hit_count == 10
    run_io(c1, op, expect_acks=4)
    assert torch.equal(c1.host_pool.k_buffer[:, op.host_indices], c0.host_pool.k_buffer[:, slots])
    assert torch.equal(c1.host_pool.v_buffer[:, op.host_indices], c0.host_pool.v_buffer[:, slots])


def test_backup_failure_is_a_fault_and_still_acked(make_ctrl, tmp_path):
    (c,) = (make_ctrl(x) for x in comms(1))
    slots = c.host_pool.alloc(len(TOKENS))
    (tmp_path / "l3").rename(tmp_path / "gone")
    c.write_storage(slots, TOKENS)
    (done,) = c.drain_queue("ack_backup_queue", 1, timeout=5)
    assert done.completed_tokens == 0
    assert {f.op for f in c.drain_storage_faults()} == {"write"}


def test_host_mem_release_queue_holds_pages(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    c.append_host_mem_release(torch.arange(6))
    assert c.storage_queue_sizes()["host_mem_release_queue"] == 3


# ---- policies ---------------------------------------------------------------------------------


def test_timeout_budget_formula():
    cfg = PrefetchTimeoutConfig()
    assert cfg.timeout_s(0) == 2.0
    assert cfg.timeout_s(10 * 1024) == pytest.approx(3.0)
    assert cfg.timeout_s(10**7) == 30.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("policy", "before", "after_budget", "after_done"),
    [
        ("best_effort", True, True, True),
        ("wait_complete", False, False, True),
        ("timeout", False, True, True),
    ],
)
def test_prefetch_policies(make_ctrl, policy, before, after_budget, after_done):
    clock = FakeClock()
    (c,) = (make_ctrl(x, prefetch_policy=policy, clock=clock) for x in comms(1))
    fill(c, 5)
    (op,) = hit_query([c])
    assert op.start_time == 100.0  # the rank's own clock
    assert c.can_terminate_prefetch(op) is before
    clock.now += 2.0 + 0.1 * len(TOKENS) / 1024 + 0.01
    assert c.can_terminate_prefetch(op) is after_budget
    clock.now = 100.0
    run_io(c, op, expect_acks=4)
    assert c.can_terminate_prefetch(op) is after_done


def test_a_skewed_clock_times_out_alone(make_ctrl):
    """Rank-local timeout: the same operation age reads differently on a skewed rank."""
    clocks = [FakeClock(), FakeClock()]
    pair = comms(2)
    c0, c1 = (make_ctrl(pair[r], prefetch_policy="timeout", clock=clocks[r]) for r in (0, 1))
    op0, op1 = hit_query([c0, c1])
    clocks[1].now += 2.5
    assert (c0.can_terminate_prefetch(op0), c1.can_terminate_prefetch(op1)) == (False, True)


# ---- lifecycle --------------------------------------------------------------------------------


def test_stop_joins_every_thread_and_is_idempotent(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    assert c.probe_stats()["threads_alive"] == 4
    assert c.stop() == [] and c.stop() == []
    assert c.probe_stats()["threads_alive"] == 0
    with pytest.raises(RuntimeError, match="stopped"):
        c.drain_queue("prefetch_hit_queue", 1)


def test_stop_reports_a_thread_stuck_in_a_collective(make_ctrl):
    (comm,) = comms(1)
    entered, release = threading.Event(), threading.Event()

    def stuck(name, tensor, op="min"):
        entered.set()
        release.wait(10)

    comm.all_reduce_thread_group = stuck
    c = make_ctrl(comm)
    c.prefetch("r", TOKENS)
    assert entered.wait(10)
    assert c.stop(timeout=0.3) == ["hicache-prefetch"]
    release.set()
    assert c.stop() == []


def test_step_evidence_has_hit_and_progress_before_and_after_consensus(make_ctrl):
    hooks = Hooks()
    hooks.register("storage_exists", lambda found, ctx: min(found, 4))
    hooks.register("storage_read", lambda ok, ctx: ctx["page_index"] != 1)
    pair = comms(2)
    c0 = make_ctrl(pair[0], storage_batch_size=8)
    c1 = make_ctrl(pair[1], hooks=hooks, storage_batch_size=8)
    fill(c0, 5)
    fill(c1, 5)
    for i, c in enumerate((c0, c1)):
        c.prefetch(f"rid{i}", TOKENS)
    op0, op1 = (c.consume_prefetch_hits(1, timeout=5)[0] for c in (c0, c1))
    for c, op in ((c0, op0), (c1, op1)):
        c.submit_prefetch_io(op)
    for c in (c0, c1):
        c.consume_prefetch_acks(2, timeout=5)  # one batch, then completion
    ev0, ev1 = c0.drain_step_evidence(), c1.drain_step_evidence()
    assert ev0["l3_hit_len"] == {"rid0": 8} and ev0["l3_hit_len_local"] == {"rid0": 10}
    assert ev1["l3_hit_len"] == {"rid1": 8} and ev1["l3_hit_len_local"] == {"rid1": 8}
    assert ev0["l3_progress"] == {"rid0": 2} and ev0["l3_progress_local"] == {"rid0": 8}
    assert ev1["l3_progress_local"] == {"rid1": 2} and ev1["storage_faults"] == []
    assert c0.drain_step_evidence()["l3_hit_len"] == {}  # drained: per step


def test_step_evidence_carries_storage_faults(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    fill(c, 1)
    open(c.storage.key_path(HASHES[0]), "wb").close()
    (op,) = hit_query([c])
    run_io(c, op, expect_acks=2)
    (fault,) = c.drain_step_evidence()["storage_faults"]
    assert fault["op"] == "read" and fault["key"] == HASHES[0]


def test_probe_stats_shows_every_storage_queue(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    stats = c.probe_stats()
    assert set(stats["queues"]) == set(STORAGE_QUEUES) and len(STORAGE_QUEUES) == 8
    assert set(stats["sync_received"]) == {"l3_hit", "l3_progress"}


# ---- conservation, property-based (the IO loop driven synchronously, no threads) -------------


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n_pages=st.integers(0, 9),
    batch=st.integers(1, 4),
    failing=st.sets(st.integers(0, 8), max_size=4),
    raising=st.sets(st.integers(0, 8), max_size=2),
    terminate_at=st.one_of(st.none(), st.integers(0, 8)),
)
def test_io_acks_are_conserved_whatever_fails(
    tmp_path, n_pages, batch, failing, raising, terminate_at
):
    hooks = Hooks()
    op_box = []

    def on_read(ok, ctx):
        i = ctx["page_index"]
        if terminate_at is not None and i >= terminate_at:
            op_box[0].mark_terminate()
        if i in raising:
            raise RuntimeError("backend blew up")
        return i not in failing

    hooks.register("storage_read", on_read)
    storage = HiCacheFile(HiCacheStorageConfig(model_name="p"), str(tmp_path / "l3"), hooks)
    ctrl = StorageController(
        storage, TinyHostPool(size=32), PAGE, comms(1)[0], FULL, PREFETCH, storage_batch_size=batch
    )
    tokens = list(range(n_pages * PAGE))
    hashes = get_page_hashes(tokens, PAGE)
    fill(ctrl, n_pages, hashes)
    op = ctrl.prefetch("r", tokens)
    op_box.append(op)
    op.hash_value, op.host_indices = hashes, ctrl.host_pool.alloc(n_pages * PAGE)
    ctrl._prefetch_io_one(op)
    acks = [ctrl.prefetch_sync_queue.get_nowait() for _ in range(ctrl.prefetch_sync_queue.qsize())]
    n_batches = -(-n_pages // batch)
    assert len(acks) == n_batches + 1, "one ack per batch, then one completion"
    assert [a.completed_req for a in acks] == [False] * n_batches + [True]
    progress = [a.completed_tokens for a in acks[:-1]]
    assert progress == sorted(progress) and all(p % PAGE == 0 for p in progress)
    done = progress[-1] // PAGE if progress else 0
    first_bad = next((i for i in range(n_pages) if i in failing | raising), n_pages)
    # a failed read ends the count at that page; a raising backend voids its whole batch
    start = first_bad - first_bad % batch  # batch_get reads its whole batch, so a raise
    voided = any(start <= i < start + batch for i in raising if i < n_pages)  # voids it all
    expected = start if voided else first_bad
    assert done <= expected, "pages past the first failure were counted"
    if terminate_at is None:
        assert done == expected
    ctrl.stop()


# ---- factory --------------------------------------------------------------------------------


def test_build_storage_controller_from_server_args(tmp_path):
    pool = TinyHostPool()
    comm = comms(2)[1]
    assert build_storage_controller(ServerArgs(), FULL, comm, pool) is None
    sa = ServerArgs(
        hicache_storage_backend="file",
        hicache_storage_dir=str(tmp_path / "l3"),
        hicache_storage_prefetch_policy="timeout",
    )
    ctrl = build_storage_controller(sa, LEGACY, comm, pool)
    assert ctrl.storage.config_suffix == "_tiny-llama_0_1_2_1"
    assert ctrl.prefetch_policy == "timeout" and not ctrl.l3_hit_min and ctrl._threads == []
    fallback = build_storage_controller(
        dataclasses.replace(sa, hicache_storage_dir=None),
        FULL,
        comm,
        pool,
        default_dir=str(tmp_path / "run" / "l3"),
    )
    assert fallback.storage.file_path.endswith("run/l3") and fallback.l3_hit_min


@pytest.mark.parametrize("bad", ["missing", "file"])
def test_build_storage_controller_rejects_bad_dirs(tmp_path, bad):
    (tmp_path / "f").write_text("x")
    path = None if bad == "missing" else str(tmp_path / "f")
    sa = ServerArgs(hicache_storage_backend="file", hicache_storage_dir=path)
    with pytest.raises(UsageError, match="storage-dir"):
        build_storage_controller(sa, FULL, comms(1)[0], TinyHostPool())


# ---- scheduler side: control queues drained by agreed counts ----------------------------------


def slow_exists(seconds: float) -> Hooks:
    hooks = Hooks()
    hooks.register("storage_exists", lambda found, ctx: time.sleep(seconds) or found)
    return hooks


def wait_qsize(ctrl, name, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while ctrl.storage_queue_sizes()[name] < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ctrl.storage_queue_sizes()[name] == n


def test_relayed_counts_make_a_slow_stage_wait_for_its_own_thread(make_ctrl):
    class SlowDisk(HiCacheFile):
        def set(self, key, value):
            time.sleep(0.1)
            return super().set(key, value)

    pair = comms(2)
    c0, c1 = make_ctrl(pair[0]), make_ctrl(pair[1])
    c1.storage.__class__ = SlowDisk
    for c in (c0, c1):
        c.write_storage(c.host_pool.alloc(len(TOKENS)), TOKENS)
    wait_qsize(c0, "ack_backup_queue", 1)
    assert c1.storage_queue_sizes()["ack_backup_queue"] == 0  # PP1's backup is still writing
    d0 = c0.drain_storage_control_queues(timeout=10)
    t = time.monotonic()
    d1 = c1.drain_storage_control_queues(timeout=10)
    assert time.monotonic() - t > 0.1, "PP1 should have blocked for its own thread"
    assert len(d0["ack_backup_queue"]) == len(d1["ack_backup_queue"]) == 1
    assert d1["ack_backup_queue"][0].completed_tokens == 10
    ev0, ev1 = c0.drain_step_evidence(), c1.drain_step_evidence()
    assert ev0["storage_counts"] == ev1["storage_counts"]
    assert ev0["storage_counts"]["ack_backup_queue"] == 1


def test_local_counts_shift_a_slow_stage_by_a_step(make_ctrl):
    pair = comms(2)
    c0, c1 = make_ctrl(pair[0], LEGACY), make_ctrl(pair[1], LEGACY, hooks=slow_exists(0.4))
    for c in (c0, c1):
        c.prefetch("a", TOKENS)
    wait_qsize(c0, "prefetch_hit_queue", 1)
    d0, d1 = (c.drain_storage_control_queues(timeout=10) for c in (c0, c1))
    assert (len(d0["prefetch_hit_queue"]), len(d1["prefetch_hit_queue"])) == (1, 0)
    assert c0.drain_step_evidence()["l3_hit_len"] == {"a": 0}
    assert c1.drain_step_evidence()["l3_hit_len"] == {}  # the legacy divergence, as data
    assert all(g != "pp_sync" for _, g, _ in c0.comm.calls + c1.comm.calls)


def test_drain_frees_released_host_pages(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    free_before = len(c.host_pool.free_slots)
    slots = c.host_pool.alloc(6)
    c.append_host_mem_release(slots)
    drained = c.drain_storage_control_queues(timeout=5)
    assert len(drained["host_mem_release_queue"]) == 3
    assert len(c.host_pool.free_slots) == free_before


def test_prefetch_rate_limit_at_half_the_host_pool(make_ctrl):
    (c,) = (make_ctrl(x) for x in comms(1))
    assert c.prefetch_capacity_limit == 16 and not c.prefetch_rate_limited()
    c.prefetch_tokens_occupied = 16
    assert c.prefetch_rate_limited()
    assert c.probe_stats()["prefetch_tokens_occupied"] == 16


def test_storage_threads_show_sglang_function_names_to_stack_dumps(make_ctrl):
    """triage recognises storage threads by SGLang's function names in their stacks."""
    (c,) = (make_ctrl(x) for x in comms(1))
    frames = sys._current_frames()
    names = {}
    for t in threading.enumerate():
        if t.name.startswith("hicache-"):
            names[t.name] = {f.name for f in traceback.extract_stack(frames[t.ident])}
    assert "prefetch_thread_func" in names["hicache-prefetch"]
    assert "prefetch_io_aux_func" in names["hicache-prefetch-io"]
    assert "prefetch_sync_thread_func" in names["hicache-prefetch-sync"]
    assert "backup_thread_func" in names["hicache-backup"]
