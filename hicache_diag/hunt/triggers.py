"""The trigger table: which workload (a natural trigger) or physical perturbation (a fault) makes
ranks read different values of a given kind of per-rank read, for a given decision. A trigger
is run options in the command line's names; an engine that cannot take them (a workload only
SGLang's HTTP API has, a fault the builtin runtime lacks) refuses them at parse time, and the
hunt moves to the next variant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hicache_diag.sources.model import Source


@dataclass(frozen=True, slots=True)
class Variant:
    """One way to pull a trigger: run options, and a fault when it is a perturbation."""

    flags: Mapping[str, Any] = field(default_factory=dict)
    fault: str | None = None  # None: a natural trigger (no fault)


@dataclass(frozen=True, slots=True)
class Trigger:
    name: str
    what: str  # the physical event or workload, in words
    variants: tuple[Variant, ...]  # natural first, then perturbations


@dataclass(frozen=True, slots=True)
class TriggerRule:
    """Reads of these `kinds` feeding one of these `decisions` are pulled by `trigger`."""

    kinds: tuple[str, ...]
    decisions: tuple[str, ...]
    trigger: Trigger


SESSION_CLOSE = Trigger(
    "session-close",
    "a streaming session closed while its turn decodes, released on each rank's reap tick",
    (Variant({"workload": "session-close", "requests": 3, "max_new_tokens": 16}),),
)
SESSION_TIMEOUT = Trigger(
    "session-timeout",
    "streaming sessions that time out in flight",
    (Variant({"workload": "session-timeout", "requests": 6}),),
)
WAITING_TIMEOUT = Trigger(
    "overload-waiting-timeout",
    "an overload whose waits straddle SGLANG_REQ_WAITING_TIMEOUT",
    (
        Variant(
            {
                "workload": "overload",
                "requests": 96,
                "sglang_env": ["SGLANG_REQ_WAITING_TIMEOUT=1.5"],
            }
        ),
    ),
)
FLUSH_DEADLINE = Trigger(
    "flush-deadline",
    "/flush_cache with a deadline while requests run; then a clock offset of one rank",
    (
        Variant({"workload": "flush-timeout", "requests": 7}),
        Variant({"workload": "flush-timeout", "requests": 7}, "flush-clock:rank=1,offset-ms=3000"),
    ),
)
DMA_TIMING = Trigger(
    "dma-timing",
    "host<->device copies completing at different times per rank (a slower link on one)",
    (Variant(), Variant({}, "dma-delay:rank=1,ms=30")),
)
HOST_POOL = Trigger(
    "host-pool",
    "a small device pool cycling prefixes through the host tier; then one rank's host pool short",
    (
        Variant({"max_total_tokens": 256}),
        Variant({"max_total_tokens": 256}, "host-shortage:rank=1,leave=0"),
        Variant({"max_total_tokens": 256}, "host-alloc-fail:rank=1"),
    ),
)
L3_STORAGE = Trigger(
    "l3-storage",
    "the file L3 backend with prefetch and backup threads; then one rank's storage missing pages",
    (
        Variant({"hicache_storage_backend": "file"}),
        Variant({"hicache_storage_backend": "file"}, "l3-partial-hit:rank=1,keep=0.5"),
    ),
)
LRU_CLOCK = Trigger(
    "lru-clock",
    "one rank's clock skewed under eviction (a wall clock stamping the tree)",
    (Variant({"max_total_tokens": 256}, "clock-skew:rank=1,offset-ms=50"),),
)

_POOLS = ("write-back", "eviction", "load-back", "batch-admission", "prefetch-alloc", "retraction")
RULES: tuple[TriggerRule, ...] = (
    TriggerRule(("clock",), ("session-release",), SESSION_CLOSE),
    TriggerRule(("clock",), ("session-release",), SESSION_TIMEOUT),
    TriggerRule(("clock", "queue-size"), ("flush",), FLUSH_DEADLINE),
    TriggerRule(("clock",), ("request-abort",), WAITING_TIMEOUT),
    TriggerRule(("event-ready", "queue-size"), ("ack-release", "load-back"), DMA_TIMING),
    TriggerRule(("alloc-result", "pool-size"), _POOLS, HOST_POOL),
    TriggerRule(
        ("storage-read", "storage-exists", "queue-size"),
        ("prefetch-termination", "storage-queue-drain", "storage-backup", "prefetch-admission"),
        L3_STORAGE,
    ),
    TriggerRule(("clock", "lru-stamp"), ("eviction",), LRU_CLOCK),
)


def triggers_for(read: Source) -> list[Trigger]:
    """The triggers whose rule covers this read (none: the read is listed as not mapped)."""
    return [
        r.trigger
        for r in RULES
        if read.kind in r.kinds and any(d in r.decisions for d in read.decisions)
    ]
