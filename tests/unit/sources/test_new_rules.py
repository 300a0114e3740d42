"""The rules issue 28 part 5 added, each on a tiny tree of our own written in SGLang's shape:
random draws, a clock stored and read by a sort key, a backend's existence check linked to the
voted hit, a rank-0 broadcast over the world group, alignment per if/else branch with the flag
that selects it, logical per-rank state apart, and the scope widened by imports."""

from __future__ import annotations

from tests.unit.sources.tree import only, scan

POLICY = """
import random

class SchedulePolicy:
    def calc_priority(self, waiting_queue):
        if self.policy == "random":
            SchedulePolicy._sort_randomly(waiting_queue)
        if len(waiting_queue) > 32:
            return "fcfs"

    @staticmethod
    def _sort_randomly(waiting_queue):
        random.shuffle(waiting_queue)
"""
SCHEDULER = """
class Scheduler:
    def _get_new_batch_prefill_raw(self):
        self.policy.calc_priority(self.waiting_queue)
        if len(self.waiting_queue) == 0:
            return None
"""


def test_random_shuffle_of_the_waiting_queue_is_a_source_and_queue_length_is_logical(tmp_path):
    files = {"managers/schedule_policy.py": POLICY, "managers/scheduler.py": SCHEDULER}
    inv = scan(tmp_path, files)
    shuffle = only(inv, kind="random")
    assert shuffle.function == "SchedulePolicy._sort_randomly"
    assert shuffle.decisions == ("batch-admission",) and shuffle.alignment.mechanism == "none"
    assert not [s for s in inv.sources if s.kind in ("queue-size", "logical-state")]
    logical = {(s.function, s.kind) for s in inv.logical}
    assert logical == {
        ("SchedulePolicy.calc_priority", "logical-state"),
        ("Scheduler._get_new_batch_prefill_raw", "logical-state"),
    }


def test_a_clock_stored_in_a_stamp_orders_the_sort_that_reads_it(tmp_path):
    stats = """
    import time

    class ReqTimeStats:
        def set_wait_queue_entry_time(self, ts=None):
            ts = ts or time.perf_counter()
            self.wait_queue_entry_time = ts
    """
    policy = """
    from sglang.srt.observability.req_time_stats import ReqTimeStats

    class SchedulePolicy:
        def get_new_batch_prefill(self, waiting_queue):
            waiting_queue.sort(key=lambda r: (r.priority, r.time_stats.wait_queue_entry_time))
    """
    files = {"observability/req_time_stats.py": stats, "managers/schedule_policy.py": policy}
    inv = scan(tmp_path, files)
    stamp = only(inv, function="ReqTimeStats.set_wait_queue_entry_time")
    (use,) = stamp.nearest
    assert use.how == "sort-key" and use.function == "SchedulePolicy.get_new_batch_prefill"
    assert stamp.decisions == ("batch-admission",) and stamp.alignment.mechanism == "none"


def test_the_scope_widens_to_what_a_decision_file_imports(tmp_path):
    stats = """
    import time

    class ReqTimeStats:
        def stamp(self):
            self.entry = time.perf_counter()
    """
    policy = """
    from sglang.srt.observability.req_time_stats import ReqTimeStats

    class SchedulePolicy:
        def get_new_batch_prefill(self, q):
            q.sort(key=lambda r: r.stats.entry)
    """
    # observability/ is outside the fixed scope: it is scanned because the policy imports it
    unrelated = "import time\ndef f():\n    if time.time() > 1:\n        pass\n"
    files = {"observability/req_time_stats.py": stats, "managers/schedule_policy.py": policy}
    inv = scan(tmp_path, {**files, "observability/unrelated.py": unrelated})
    assert "observability/req_time_stats.py" in inv.files
    assert "observability/unrelated.py" not in inv.files
    assert only(inv, kind="clock").file == "observability/req_time_stats.py"


STORAGE = """
import os

class HiCacheStorage:
    def batch_exists(self, keys):
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

class HiCacheFile(HiCacheStorage):
    def exists(self, key):
        if self.metadata_cache is not None and self.metadata_cache.contains(key):
            return True
        return os.path.exists(os.path.join(self.file_path, key))
"""
CONTROLLER = """
import torch

class HiCacheController:
    def prefetch_thread_func(self, operation):
        hit = self.storage_backend.batch_exists(operation.keys)
        t = torch.tensor(hit)
        for group in (self.tp_group, self.pp_group):
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=group)
        self.prefetch_from_storage(t.item())

    def prefetch_from_storage(self, n):
        if n > 0:
            self.start(n)
"""


def test_a_backend_existence_cache_feeds_the_voted_hit(tmp_path):
    # the check serves `exists`, which the base class's `batch_exists` (the controller's call)
    # calls: it takes that call's uses, after the MIN over TP and PP
    files = {"mem_cache/hicache_storage.py": STORAGE, "managers/cache_controller.py": CONTROLLER}
    inv = scan(tmp_path, files)
    checks = [s for s in inv.sources if s.function == "HiCacheFile.exists"]
    called = sorted(s.expr.split("(")[0] for s in checks)
    assert called == ["os.path.exists", "self.metadata_cache.contains"]
    for s in checks:
        assert s.kind == "storage-exists" and s.classic == "l3-hit"
        assert s.alignment.mechanism == "min" and s.alignment.covers_pp
        assert s.decisions == ("prefetch-admission",)


def test_a_rank0_broadcast_over_the_world_group_is_a_leader_relay(tmp_path):
    sizer = """
    import time
    from sglang.srt.utils import broadcast_pyobj

    class DynamicChunkSizer:
        def profile_and_fit(self):
            samples = []
            if self.pp_group.is_first_rank:
                start = time.perf_counter()
                samples.append(time.perf_counter() - start)
            samples = broadcast_pyobj([samples], self.world_group.rank,
                                      self.world_group.cpu_group, src=0)[0]
            return samples

    class Scheduler:
        def get_new_batch_prefill(self):
            if self.sizer.profile_and_fit():
                return 1
    """
    inv = scan(tmp_path, {"managers/scheduler_components/dynamic_chunk_sizer.py": sizer})
    for s in [s for s in inv.sources if s.kind == "clock"]:
        assert s.alignment.mechanism == "leader-relay", s.alignment
        assert s.alignment.covers_pp and s.alignment.covers_tp
        assert s.decisions == ("batch-admission",)


def test_alignment_per_code_branch_names_the_flag_that_selects_it(tmp_path):
    cache = """
    import torch

    class Cache:
        def __init__(self, memory):
            self.host_memory_mode = memory.hicache_host_memory_mode

        def _reduce_tp(self, t):
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.tp_group)

        def _reduce_all(self, t):
            self._reduce_tp(t)
            torch.distributed.recv(t, group=self.pp_group)

        def writing_check(self):
            n = self.cache_controller.ack_queue.qsize()
            t = torch.tensor(n)
            if self.host_memory_mode == "buffer_only":
                self._reduce_tp(t)
            else:
                self._reduce_all(t)
            while t.item() > 0:
                self.pop()
    """
    inv = scan(tmp_path, {"mem_cache/cache.py": cache})
    src = only(inv, kind="queue-size")
    assert src.alignment.mechanism == "min+leader-relay"  # the default (else) branch
    (mode,) = src.modes
    assert mode.flags == ("--hicache-host-memory-mode buffer_only",)
    assert mode.then.mechanism == "min" and mode.then.covers_pp is False
    assert mode.orelse.mechanism == "min+leader-relay" and mode.orelse.covers_pp
