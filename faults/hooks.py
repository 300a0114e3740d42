"""Named fault/probe points shared by both engines (builtin runtime and real SGLang); ours.

The runtime calls `hooks.apply(POINT, value, **ctx)` at each point and uses what comes back. With
no handler installed every point returns `value` unchanged, so a clean run pays one dict lookup.
Faults (hicache_diag.faults) register handlers here; the runtime never imports a concrete fault.

Points, the value they carry, and the context they pass:
- `dma_complete`  float: extra seconds before a DMA's finish event becomes ready.
                  ctx: direction ("write"|"load"), num_tokens.
- `host_alloc`    bool: whether the host pool may satisfy this alloc. ctx: num_tokens.
                  (A refusal with free slots is a state SGLang cannot reach: docs/faults.md.)
- `host_hold`     int: host-pool tokens a side pool holds on this rank from this step on (the
                  engine takes or returns them through the pool's own alloc/free).
                  ctx: held (now), free (the pool's available_size), capacity.
- `device_hold`   int: device tokens a concurrent consumer holds during this load-back (the
                  engine takes them through the device allocator and frees them after).
                  ctx: free (the allocator's available_size), need (tokens to load).
- `now`           float: the clock this rank's tree stamps `last_access_time` with.
- `storage_exists` int: leading L3 pages found. ctx: num_pages (asked).
- `storage_read`  bool: whether one page read succeeds (a handler may also sleep).
                  ctx: page_index, num_pages.
- `p2p_send`      float: seconds to delay one PP send. ctx: msg ("proxy"|"reqs"|"output"|"sync").
- `scheduler_step` float: seconds the scheduler thread sleeps before this step.
- `session_clock` float: seconds this rank's session reap tick is held back when it falls due
                  (the tick's phase: SGLang 0.5.23 `SessionController.maybe_reap`).
- `flush_clock`   float: seconds added to this rank's deferred `/flush_cache?timeout=` deadline
                  (SGLang 0.5.23 `SchedulerFlushWrapper`). ctx: timeout_s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

HOOK_POINTS = (
    "dma_complete",
    "host_alloc",
    "host_hold",
    "device_hold",
    "now",
    "storage_exists",
    "storage_read",
    "p2p_send",
    "scheduler_step",
    "session_clock",
    "flush_clock",
)

Handler = Callable[[Any, dict[str, Any]], Any]


class Hooks:
    """Per-rank hook table. `step` is kept current by the scheduler; `fired` is drained per step
    into the rank's jsonl (`faults_fired`). Thread-safe enough for our use: handlers run on the
    thread that calls the point (scheduler, DMA or storage threads) and only append to `fired`."""

    def __init__(self, rank: int = 0, pp_rank: int = 0, tp_rank: int = 0) -> None:
        self.rank, self.pp_rank, self.tp_rank = rank, pp_rank, tp_rank
        self.step = 0
        self.fired: list[dict[str, Any]] = []
        self._handlers: dict[str, list[Handler]] = defaultdict(list)

    def register(self, point: str, handler: Handler) -> None:
        if point not in HOOK_POINTS:
            raise ValueError(f"unknown hook point {point!r}; valid: {', '.join(HOOK_POINTS)}")
        self._handlers[point].append(handler)

    def has(self, point: str) -> bool:
        return bool(self._handlers.get(point))

    def apply(self, point: str, value: Any, **ctx: Any) -> Any:
        handlers = self._handlers.get(point)
        if not handlers:
            return value
        ctx.setdefault("step", self.step)
        for handler in handlers:
            value = handler(value, ctx)
        return value

    def record(self, fault: str, **detail: Any) -> None:
        """Called by a fault when it actually perturbs something."""
        self.fired.append({"fault": fault, "step": self.step, **detail})

    def drain_fired(self) -> list[dict[str, Any]]:
        fired, self.fired = self.fired, []
        return fired
