"""Mirrors sglang/srt/managers/schedule_policy.py: `PrefillAdder` admits waiting requests.

Admission reads only this rank's tree and pools. That is the point: every stage decides its batch
on its own, so any per-rank cache difference becomes a per-stage batch difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.engines.builtin.runtime.managers.schedule_batch import Req


def page_align_up(n: int, page_size: int) -> int:
    return -(-n // page_size) * page_size


@dataclass
class PrefillAdder:
    """check/commit in one: `add_one_req` either admits the request (prefix locked, slots
    allocated) or leaves every pool untouched and returns False."""

    tree_cache: Any
    allocator: Any
    page_size: int
    rem_reqs: int
    rem_input_tokens: int
    can_run_list: list[Req] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)
    evicted: int = 0

    def add_one_req(self, req: Req) -> bool:
        if self.rem_reqs <= 0:
            return False
        tree = self.tree_cache
        # Keep at least one token to compute, as SGLang matches on fill_ids[:-1].
        match = tree.match_prefix(req.origin_input_ids[:-1])
        indices, last_node = match.device_indices, match.last_device_node
        if match.host_hit_length > 0:
            quota = self.allocator.available_size() + tree.evictable_size()
            indices, last_node = tree.init_load_back(match, quota)
        extend = len(req.origin_input_ids) - len(indices)
        if self.can_run_list and extend > self.rem_input_tokens:
            return False
        need = page_align_up(extend + req.max_new_tokens, self.page_size)
        tree.inc_lock_ref(last_node)
        slots = self._alloc(need)
        if slots is None:
            tree.dec_lock_ref(last_node)
            return False
        req.prefix_indices, req.alloc_slots, req.last_node = indices, slots, last_node
        req.host_hit_length = len(indices) - len(match.device_indices)
        req.host_loaded_length = req.host_hit_length  # what init_load_back really loaded
        self.can_run_list.append(req)
        self.prefix_lens.append(len(indices))
        self.rem_reqs -= 1
        self.rem_input_tokens -= extend
        return True

    def _alloc(self, need: int):
        short = need - self.allocator.available_size()
        if short > 0:
            self.evicted += self.tree_cache.evict(short)
        return self.allocator.alloc(need)
