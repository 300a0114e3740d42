"""Alignment rules: what a value goes through between its read and the decision that uses it."""

from __future__ import annotations

from tests.unit.sources.tree import only, scan

# A cache with SGLang's shape of sync helpers, written for this test: an attn-group all_reduce
# whose op is a parameter, a PP relay by recv/isend, and a wrapper that does both.
SYNC_HELPERS = """
import torch

class Cache:
    def _reduce_attn(self, tensor, op):
        for group in (self.attn_cp_group, self.attn_tp_group):
            torch.distributed.all_reduce(tensor, op=op, group=group)

    def _relay(self, data):
        if self.pp_rank > 0:
            torch.distributed.recv(data, group_src=self.pp_rank - 1, group=self.pp_group)
        if self.pp_rank + 1 < self.pp_size:
            torch.distributed.isend(data.clone(), group_dst=self.pp_rank + 1, group=self.pp_group)

    def _sync(self, data, op):
        if self.pp_rank == 0:
            self._reduce_attn(data, op)
        self._relay(data)
"""


def test_unaligned_ack_count_feeds_ack_release(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": SYNC_HELPERS
            + """
    def writing_check(self):
        done = 0
        for ack in self.ack_write_queue:
            if not ack.finish_event.query():
                break
            done += 1
        while done > 0:
            self.ack_write_queue.pop(0)
            done -= 1
"""
        },
    )
    s = only(inv, kind="event-ready")
    assert s.function == "Cache.writing_check"
    assert s.classic == "dma-ack-count"
    assert s.decisions == ("ack-release",)
    assert s.alignment.mechanism == "none" and s.alignment.covers_pp is False


def test_min_through_a_wrapper_resolves_the_op_and_groups(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": SYNC_HELPERS
            + """
    def writing_check(self):
        done = 0
        for ack in self.ack_write_queue:
            if not ack.finish_event.query():
                break
            done += 1
        t = torch.tensor(done)
        self._reduce_attn(t, torch.distributed.ReduceOp.MIN)
        done = int(t.item())
        while done > 0:
            done -= 1
"""
        },
    )
    a = only(inv, kind="event-ready").alignment
    assert a.mechanism == "min"
    assert a.steps[0].groups == ("attn_cp", "attn_tp")
    assert a.covers_tp is True and a.covers_pp is False


def test_leader_relay_is_min_plus_relay_covering_pp(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": SYNC_HELPERS
            + """
    def _count_ready(self, queue):
        n = 0
        for ack in queue:
            if not ack.finish_event.query():
                break
            n += 1
        return n

    def check_events(self):
        counts = torch.zeros(1)
        if self.pp_rank == 0:
            counts[0] = self._count_ready(self.ack_write_queue)
        self._sync(counts, torch.distributed.ReduceOp.MIN)
        self.writing_check(finish_count=int(counts[0]))

    def writing_check(self, finish_count):
        while finish_count > 0:
            finish_count -= 1
"""
        },
    )
    s = only(inv, kind="event-ready")
    assert s.function == "Cache._count_ready"  # reported where it is read
    assert s.alignment.mechanism == "min+leader-relay"
    assert s.alignment.covers_pp is True
    assert [st.kind for st in s.alignment.steps] == ["all_reduce", "pp_relay"]
    assert "ack-release" in s.decisions


def test_max_vote_is_named_max(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": SYNC_HELPERS
            + """
    def can_terminate_prefetch(self, op):
        flag = torch.tensor(time.monotonic() - op.start > op.timeout)
        self._sync(flag, torch.distributed.ReduceOp.MAX)
        if flag.item():
            self.terminate(op)
"""
        },
    )
    s = only(inv, kind="clock")
    assert s.decisions == ("prefetch-termination",)
    assert s.alignment.mechanism == "max+leader-relay"


def test_tp_group_all_reduce_leaves_pp_out(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/cache.py": """
import torch

class Cache:
    def write_backup(self, node):
        free = torch.tensor(self.pool_host.available_size())
        torch.distributed.all_reduce(free, op=torch.distributed.ReduceOp.MIN, group=self.tp_group)
        if free.item() < node.size:
            return 0
"""
        },
    )
    s = only(inv, kind="pool-size")
    assert s.classic == "host-alloc"
    assert s.alignment.mechanism == "min"
    assert s.alignment.covers_pp is False and s.alignment.steps[0].groups == ("tp",)


def test_lru_stamp_from_a_counter_is_logical_and_from_a_clock_is_none(tmp_path):
    inv = scan(
        tmp_path,
        {
            "mem_cache/tree.py": """
import time

_counter = 0

def next_tick():
    global _counter
    _counter += 1
    return _counter

class LRU:
    def get_priority(self, node):
        return node.last_access_time

class LogicalTree:
    def touch(self, node):
        node.last_access_time = next_tick()

class ClockTree:
    def touch(self, node):
        node.last_access_time = time.monotonic()
"""
        },
    )
    logical = only(inv, function="LogicalTree.touch")
    clock = only(inv, function="ClockTree.touch")
    assert logical.kind == "lru-stamp" and logical.alignment.mechanism == "logical"
    assert clock.kind == "clock" and clock.alignment.mechanism == "none"
    assert logical.classic == clock.classic == "lru-clock"
    assert logical.decisions == clock.decisions == ("eviction",)


def test_a_clock_only_logged_reaches_no_decision(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/scheduler.py": """
import time

class Scheduler:
    def get_next_batch_to_run(self):
        start = time.perf_counter()
        self.run()
        if time.perf_counter() - start > 1.0:
            logger.warning("slow step")
"""
        },
    )
    assert inv.sources == ()
    assert inv.reads_without_decision == 2


def test_a_gather_into_a_buffer_over_an_aliased_tp_group_covers_tp_not_pp(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/prefill_delayer.py": """
import time
import torch

class PrefillDelayer:
    def __init__(self, parallel):
        self._gather_group = parallel.tp_group.cpu_group
        self._buf = torch.empty(4, 2)

    def _gather(self, expired):
        local = torch.tensor([int(expired)])
        all_gather_single(self._buf.flatten(), local, group=self._gather_group)
        return self._buf[:, 0]

    def get_new_batch_prefill(self, state):
        everyone = self._gather(time.perf_counter() - state.start > 1.0)
        if everyone.max().item() > 0:
            return None
"""
        },
    )
    a = only(inv, kind="clock").alignment
    assert a.mechanism == "gather" and a.steps[0].groups == ("tp",)
    assert a.covers_tp is True and a.covers_pp is False


def test_a_stamp_function_imported_from_another_module_is_resolved_through_the_import(tmp_path):
    tick = """
_n = [0.0]

def tick():
    _n[0] += 1.0
    return _n[0]
"""
    inv = scan(
        tmp_path,
        {
            "mem_cache/counter.py": tick,
            "mem_cache/other.py": tick,  # a second `tick`: only the import can tell them apart
            "mem_cache/tree.py": """
from sglang.srt.mem_cache.counter import tick

class Tree:
    def touch(self, node):
        node.last_access_time = tick()

    def evict(self):
        if self.a.last_access_time < self.b.last_access_time:
            self.drop(self.a)
""",
        },
    )
    s = only(inv, function="Tree.touch")
    assert s.alignment.mechanism == "logical" and s.decisions == ("eviction",)


def test_a_sync_inherited_from_an_aliased_base_class_and_its_built_groups(tmp_path):
    inv = scan(
        tmp_path,
        {
            "managers/cache_controller.py": """
import torch

class Controller:
    def start(self):
        self.hit_groups = self._make_groups()

    def _make_groups(self):
        return [new_group(g) for g in (self.tp_group, self.pp_group)]

    def _all_reduce(self, t, op, groups):
        for group in groups:
            torch.distributed.all_reduce(t, op=op, group=group)
""",
            "mem_cache/hybrid_controller.py": """
import torch
from sglang.srt.managers.cache_controller import Controller as BaseController

class HybridController(BaseController):
    def check_prefetch_progress(self, op):
        hit = torch.tensor(self.storage_backend.batch_exists(op.keys))
        self._all_reduce(hit, torch.distributed.ReduceOp.MIN, self.hit_groups)
        if hit.item() < self.threshold:
            self.revoke(op)
""",
        },
    )
    a = only(inv, kind="storage-exists").alignment
    assert a.mechanism == "min" and a.steps[0].groups == ("tp", "pp")
    assert a.covers_pp is True
