"""The dynamic half's probes: which inventoried reads the SGLang plugin records per step and rank,
and what each record holds (docs/sources.md, "Dynamic"). Pure data, shared by the plugin, which
records under these names, and `dynamic.py`, which reads them back from a run dir.

A record is `{"n": reads, "v": [value, ...], "d": [outcome, ...]}` per step: `v` what the rank
read (the first `MAX_VALUES`), `d` what the decision the read feeds did with it, present only in
a step where that decision acted.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_VALUES = 4  # per source and step: enough to compare, bounded on a busy step


@dataclass(frozen=True, slots=True)
class Probe:
    name: str  # the key under a line's "sources"
    kind: str  # a rules.READ_KINDS key
    classic: str | None  # the classic source it is, as the static inventory names it
    decision: str  # a rules.DECISIONS category
    reads: str  # where SGLang reads the value (qualnames, as the static inventory names them)
    wraps: tuple[str, ...]  # the methods the plugin wraps to see it (absent ones: not armed)
    value: str  # what `v` holds
    outcome: str  # what `d` holds, and when
    # The static inventory's reads this probe observes: same kind, in one of these functions
    # (method names; () = any function, with the probe's classic source).
    static: tuple[str, ...] = ()


PROBES: tuple[Probe, ...] = (
    Probe(
        "session-clock",
        "clock",
        None,
        "session-release",
        "Scheduler.process_input_requests: time.monotonic() -> SessionController.maybe_reap",
        ("SessionController.maybe_reap",),
        "`now`, the rank's monotonic clock passed to maybe_reap (s, 3 decimals)",
        "sessions the reap tick closed, when it closed any",
        ("process_input_requests",),
    ),
    # 0.5.1x-0.5.19 only: from 0.5.20 PP0 TP0 decides (`_poll_timeout_aborts`) and relays the
    # aborts with its requests, so no rank reads its own clock for it and the probe is not armed.
    Probe(
        "waiting-clock",
        "clock",
        None,
        "request-abort",
        "Scheduler._abort_on_waiting_timeout: time.perf_counter() - SGLANG_REQ_WAITING_TIMEOUT "
        "against each waiting request's wait_queue_entry_time",
        ("Scheduler._abort_on_waiting_timeout",),
        "seconds the rank's oldest waiting request is past the timeout, by the rank's own "
        "perf_counter (3 decimals; > 0: due), in a step with a waiting request",
        "the rids the rank dropped from its own waiting queue, when it dropped any",
        ("_abort_on_waiting_timeout",),
    ),
    Probe(
        "flush-deadline",
        "clock",
        None,
        "flush",
        "SchedulerFlushWrapper.check_pending: time.monotonic() >= deadline",
        ("SchedulerFlushWrapper.check_pending",),
        "seconds left to the rank's own deadline (3 decimals)",
        "'flush' (idle: tree reset) or 'timeout', when the pending flush ended",
        ("check_pending",),
    ),
    Probe(
        "dma-ack-count.write",
        "event-ready",
        "dma-ack-count",
        "ack-release",
        "_count_ready_acks(cc.ack_write_queue): leading finish_event.query()",
        ("UnifiedRadixCache._count_ready_acks", "HiRadixCache._count_ready_acks"),
        "the count the rank read (PP0 alone where PP0's count is relayed)",
        "the finish_count writing_check popped, when > 0",
        ("_count_ready_acks", "writing_check"),
    ),
    Probe(
        "dma-ack-count.load",
        "event-ready",
        "dma-ack-count",
        "ack-release",
        "_count_ready_acks(cc.ack_load_queue): leading finish_event.query()",
        ("UnifiedRadixCache._count_ready_acks", "HiRadixCache._count_ready_acks"),
        "the count the rank read (PP0 alone where PP0's count is relayed)",
        "the finish_count loading_check popped, when > 0",
        ("_count_ready_acks", "loading_check"),
    ),
    Probe(
        "l3-control-queues",
        "queue-size",
        "l3-progress",
        "storage-queue-drain",
        "drain_storage_control_queues / _sync_hicache_ready_counts: cc.<queue>.qsize()",
        (
            "UnifiedRadixCache.drain_storage_control_queues",
            "HiRadixCache.drain_storage_control_queues",
            "UnifiedRadixCache._sync_hicache_ready_counts",
            "HiRadixCache._sync_hicache_ready_counts",
            "UnifiedRadixCache._drain_storage_control_queues_impl",
            "HiRadixCache._drain_storage_control_queues_impl",
        ),
        "the rank's own sizes [prefetch_hit, ack_backup, host_mem_release], read just before "
        "SGLang reads them (PP>0 of 0.5.2x reads none: it takes PP0's)",
        "the counts _drain_storage_control_queues_impl drained [n_storage_hit, n_backup, "
        "n_release], when any is > 0",
        ("drain_storage_control_queues", "_sync_hicache_ready_counts"),
    ),
    Probe(
        "host-alloc",
        "alloc-result",
        "host-alloc",
        "write-back",
        "HostKVCache.alloc(need_size) is None",
        ("HostKVCache.alloc",),
        "tokens asked (need_size)",
        "1 allocated, 0 None (short), on every call",
    ),
)

BY_NAME = {p.name: p for p in PROBES}
CONTROL_QUEUES = ("prefetch_hit_queue", "ack_backup_queue", "host_mem_release_queue")
