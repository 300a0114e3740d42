"""Hypothesis state machines: HiRadixCache + host pool against a plain model, and HostKVCache
alone; `check_integrity` after every step."""

from __future__ import annotations

from hicache_helpers import PAGE, make_bundle, settle
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache

keys = st.lists(st.integers(0, 2), min_size=1, max_size=4).map(
    lambda pages: [t for p in pages for t in (p, p)]
)


class HiRadixMachine(RuleBasedStateMachine):
    """The tree never reports a prefix that was never inserted, an insert makes its key fully
    device-resident, a load-back makes device + host hit device, and pools balance."""

    policy = "write_through"

    def __init__(self) -> None:
        super().__init__()
        self.b = make_bundle(
            "ack-count=local",
            max_total_tokens=24,
            hicache_ratio=1.0,
            hicache_write_policy=self.policy,
        )
        self.tree = self.b.tree_cache
        self.inserted: set[tuple[int, ...]] = set()
        self.locked: list = []

    def teardown(self) -> None:
        self.b.shutdown()

    def _known(self, key: list[int]) -> int:
        return max((len(p) for p in self.inserted if tuple(key[: len(p)]) == p), default=0)

    @rule(key=keys)
    def insert(self, key):
        value = self.b.allocator.alloc(len(key))
        if value is None:
            return
        device = self.tree.match_prefix(key).device_indices.numel()
        prefix = self.tree.insert(key, value)
        assert prefix == device, f"insert said {prefix} cached, match said {device}"
        self.b.allocator.free(value[:prefix])
        self.inserted.update(tuple(key[:i]) for i in range(PAGE, len(key) + 1, PAGE))
        assert self.tree.match_prefix(key).device_indices.numel() == len(key)

    @rule(key=keys)
    def match_and_load_back(self, key):
        m = self.tree.match_prefix(key)
        total = m.device_indices.numel() + m.host_hit_length
        assert total <= self._known(key), f"tree reports {total} > known {self._known(key)}"
        indices, _node = self.tree.init_load_back(m, mem_quota=24)
        self.tree.ready_to_load_host_cache()
        if indices.numel() > m.device_indices.numel():
            assert indices.numel() == total, "a load-back brings the whole host part"
            assert self.tree.match_prefix(key).device_indices.numel() == total

    @rule(key=keys)
    def lock(self, key):
        node = self.tree.match_prefix(key).last_device_node
        self.tree.inc_lock_ref(node)
        self.locked.append(node)

    @precondition(lambda self: self.locked)
    @rule()
    def unlock(self):
        self.tree.dec_lock_ref(self.locked.pop())

    @rule(n=st.integers(1, 12))
    def evict(self, n):
        before = self.tree.total_size()
        freed = self.tree.evict(n)
        assert self.tree.total_size() == before - freed
        assert freed >= n or self.tree.evictable_size() == 0, "stopped while leaves remained"

    @rule(n=st.integers(1, 12))
    def evict_host(self, n):
        free = self.b.host_pool.available_size()
        freed = self.tree.evict_host(n)
        assert self.b.host_pool.available_size() == free + freed

    @rule()
    def check_events(self):
        settle(self.b)
        self.tree.check_hicache_events()  # two-phase: commits the pending backups here
        settle(self.b)
        self.tree.check_hicache_events()
        assert not self.tree.pending_backup
        assert self.b.controller.ack_write_queue == [] and self.b.controller.ack_load_queue == []
        assert not self.tree.ongoing_write_through and not self.tree.ongoing_load_back

    @invariant()
    def integrity(self):
        self.tree.check_integrity()
        self.b.allocator.check_integrity()
        dev = self.b.allocator
        loading = sum(len(op.device_indices) for op in self.b.controller.load_queue)
        assert self.tree.total_size() + dev.available_size() + loading <= dev.size


class SelectiveMachine(HiRadixMachine):
    policy = "write_through_selective"


class WriteBackMachine(HiRadixMachine):
    policy = "write_back"


class TwoPhaseMachine(HiRadixMachine):
    host_alloc = "two-phase"


class TwoPhaseWriteBackMachine(HiRadixMachine):
    policy = "write_back"
    host_alloc = "two-phase"


class HostPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = HostKVCache(16, PAGE, 1, 1, 1)
        self.held: list = []

    @rule(pages=st.integers(1, 5))
    def alloc(self, pages):
        free = self.pool.available_size()
        got = self.pool.alloc(pages * PAGE)
        if pages * PAGE > free:
            assert got is None
        else:
            assert got is not None and len(got) == pages * PAGE
            taken = {int(i) for h in self.held for i in h}
            assert not taken & {int(i) for i in got}, "handed out a slot already held"
            self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 10))
    def free(self, i):
        self.pool.free(self.held.pop(i % len(self.held)))

    @invariant()
    def balance(self):
        self.pool.check_integrity()
        assert self.pool.available_size() + sum(len(h) for h in self.held) == 16


_fast = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestHiRadixMachine = HiRadixMachine.TestCase
TestHiRadixMachine.settings = _fast
TestSelectiveMachine = SelectiveMachine.TestCase
TestSelectiveMachine.settings = _fast
TestWriteBackMachine = WriteBackMachine.TestCase
TestWriteBackMachine.settings = _fast
TestTwoPhaseMachine = TwoPhaseMachine.TestCase
TestTwoPhaseMachine.settings = _fast
TestTwoPhaseWriteBackMachine = TwoPhaseWriteBackMachine.TestCase
TestTwoPhaseWriteBackMachine.settings = _fast
TestHostPoolMachine = HostPoolMachine.TestCase
TestHostPoolMachine.settings = _fast
