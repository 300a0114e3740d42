"""A side pool on one rank's host KV pool: the `host_hold` hook point's effect; ours.

In production the host budget of a stage is shared with state HiCache does not own: hybrid
models keep SWA/Mamba/MTP host sidecars beside the KV pool (`register_sidecar_pool`), and the
per-stage layer split makes them differ by stage. When such a sidecar grows on one stage, that
stage's KV pool has fewer free slots than its peers', although start-up sized every pool alike
(the capacity MIN-sync of #29258 runs once). The side pool takes its slots through the pool's
own `alloc` and gives them back through its own `free`, so `available_size()` falls, SGLang's
`evict_host` runs when a backup needs more, and its own shortage branch decides the backup.
Both engines call `settle` once per scheduler step (docs/faults.md, `host-shortage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from hicache_diag.faults.hooks import Hooks


class TokenPool(Protocol):
    """What a side pool asks of a pool, SGLang's host pool or ours (`memory_pool_host`); an
    optional `page_size` / `logical_page_size` and `size` are read with getattr."""

    def available_size(self) -> int: ...
    def alloc(self, need_size: int) -> Any: ...  # an index tensor, or None when it is short
    def free(self, indices: Any) -> Any: ...


def page_of(pool: TokenPool) -> int:
    """The pool's allocation unit: SGLang 0.5.2x widens it under DCP (`logical_page_size`)."""
    return int(getattr(pool, "logical_page_size", None) or getattr(pool, "page_size", 1) or 1)


class SidePool:
    """The host slots held away from HiCache on this rank. Scheduler thread only."""

    def __init__(self) -> None:
        self._chunks: list[Any] = []  # index tensors, as the pool's alloc returned them
        self.tokens = 0

    def settle(self, pool: TokenPool, target: int) -> int:
        """Grow toward `target` tokens with what the pool has free (never by making it fail),
        or give chunks back until at most `target` are held. Returns the tokens held."""
        page = page_of(pool)
        if target > self.tokens:
            want = (target - self.tokens) // page * page
            free = int(pool.available_size()) // page * page
            take = min(want, free)
            if take > 0:
                got = pool.alloc(take)
                if got is not None:
                    self._chunks.append(got)
                    self.tokens += take
        while self._chunks and self.tokens > target:
            chunk = self._chunks.pop()
            pool.free(chunk)
            self.tokens -= int(chunk.numel())
        return self.tokens

    def hold(self, hooks: Hooks | None, pool: TokenPool | None) -> int:
        """Ask the `host_hold` point how much to hold at this step, then hold it."""
        if pool is None or hooks is None:
            return self.tokens
        capacity = int(getattr(pool, "size", 0) or 0)
        if capacity and self.tokens + int(pool.available_size()) > capacity:
            # The pool was cleared under us (SGLang's flush_cache resets the host pool's free
            # list): our slots are its free slots again, so hold nothing rather than count
            # them twice (or free them twice).
            self._chunks.clear()
            self.tokens = 0
        target = hooks.apply(
            "host_hold",
            self.tokens,
            held=self.tokens,
            free=int(pool.available_size()),
            capacity=capacity,
        )
        if target == self.tokens:
            return self.tokens
        return self.settle(pool, max(0, int(target)))
