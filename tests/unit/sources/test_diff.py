"""`--diff`: sources added, removed and re-aligned between two synthetic releases."""

from __future__ import annotations

from hicache_diag.sources.diff import diff_inventories
from tests.unit.sources.tree import scan

OLD = """
import torch

class Cache:
    def writing_check(self):
        done = 0
        for ack in self.ack_write_queue:
            if not ack.finish_event.query():
                break
            done += 1
        t = torch.tensor(done)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.tp_group)
        done = int(t.item())
        while done > 0:
            done -= 1

    def touch(self, node):
        node.last_access_time = time.monotonic()

    def get_priority(self, node):
        return node.last_access_time
"""

NEW = (
    OLD.replace(
        "torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.tp_group)",
        "self._all_reduce(t, torch.distributed.ReduceOp.MIN)",
    )
    + """
    def _all_reduce(self, t, op):
        if self.pp_rank == 0:
            torch.distributed.all_reduce(t, op=op, group=self.tp_group)
        self._pp_sync(t)

    def _pp_sync(self, t):
        if self.pp_rank > 0:
            torch.distributed.recv(t, group_src=self.pp_rank - 1, group=self.pp_group)

    def check_pending(self):
        if time.monotonic() > self.deadline:
            self.flush_cache()
"""
)


def test_diff_names_the_realigned_ack_count_the_new_relay_and_the_added_clock(tmp_path):
    a = scan(tmp_path / "a", {"mem_cache/cache.py": OLD})
    b = scan(tmp_path / "b", {"mem_cache/cache.py": NEW})
    d = diff_inventories(a, b)
    assert [r.b.function for r in d.realigned] == ["Cache.writing_check"]
    r = d.realigned[0]
    assert r.a.alignment.covers_pp is False and r.b.alignment.covers_pp is True
    assert r.b.alignment.mechanism == "min+leader-relay"
    assert [s.function for s in d.added] == ["Cache.check_pending"]
    assert d.removed == ()
    assert (d.relays_a, d.relays_b) == ((), ("_pp_sync",))
    ack = next(c for c in d.classic if c.classic == "dma-ack-count")
    assert ack.changed and ack.a == {"min (no PP)": 1} and ack.b == {"min+leader-relay": 1}
    lru = next(c for c in d.classic if c.classic == "lru-clock")
    assert not lru.changed and lru.a == {"none": 1}


def test_identical_trees_diff_to_nothing(tmp_path):
    a = scan(tmp_path / "a", {"mem_cache/cache.py": OLD})
    b = scan(tmp_path / "b", {"mem_cache/cache.py": OLD})
    d = diff_inventories(a, b)
    assert (d.added, d.removed, d.realigned) == ((), (), ())
    assert not any(c.changed for c in d.classic)
