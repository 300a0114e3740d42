"""Next steps in the seed's troubleshooting order: classify, crash form, hang cause, bisect."""

from __future__ import annotations

from hicache_diag.rules.signatures import Context

BISECT = (
    "bisect the switches: `hicache-diag bisect --storage-backend none,file "
    "--hicache-size 16MiB,64MiB --trials 20`; still failing without a storage backend => "
    "L2-dimension divergence; a lower rate with a smaller host size => eviction pressure"
)

_CRASH = {
    "A": [
        "form A: compare each rank's extend_num_tokens for the failing batch; the downstream "
        "stage scheduled a different token count than the upstream stage sent",
        "look for the per-rank prefix / host-hit length that differs (ack counts, L3 hit "
        "length, host alloc, LRU clock); a `hicache-diag run` records them per step",
        "check the build has pp_sync (#27285) and the PP MIN of host capacity (#29258)",
    ],
    "B": [
        "form B: compare each rank's ack_write_queue / ack_load_queue depth at the failing "
        "step; the agreed finish count exceeded this rank's local queue",
        "check whether write_backup / host alloc failed on this rank only (#28429, #31425)",
    ],
    None: [
        "read the first failing rank's full traceback; errors on the other ranks after it "
        "(Connection closed by peer) are the cascade, not the cause",
    ],
}

_HANG = {
    "protocol-deadlock": [
        "not a network fault: one rank waits at a HiCache sync point that its peers never "
        "reach; compare per-rank call counts of check_hicache_events / writing_check / "
        "check_prefetch_progress",
        "try the fixed protocol: `--switch tp-collective=unconditional`, "
        "`--switch ack-count=leader` (upstream #26923/#28429, #27285)",
    ],
    "network-suspect": [
        "every rank sits in the same communication call: check the links first (NCCL_DEBUG=INFO, "
        "gloo timeouts, NIC / IB errors), then rerun with TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
        "for the NCCL flight recorder",
    ],
    "straggler": [
        "the culprit is outside communication while its peers wait: look for CPU / GIL "
        "contention or a slow device on that rank (`py-spy top --pid PID`)",
    ],
    None: [
        "take another look with --samples 3 --interval 2 to tell a wedge from slow progress",
    ],
}


# What the culprit's wait site says on its own (SGLang's scheduler and cache controller code).
_SITE = {
    "ack-event-synchronize": "the culprit waits for its own DMA completion "
    "(finish_event.synchronize): its copies are slower than PP0's; with the leader ack count "
    "this is a stall, so check that rank's copy engine before the protocol",
    "storage-queue-get": "the culprit waits for its own storage thread to produce what PP0 "
    "already saw: check that rank's prefetch/backup threads (a dead `Exception in thread` "
    "in its log, slow or failing L3 reads)",
    "hicache-pp-sync-recv": "the culprit waits for the pp_sync value from the previous stage: "
    "that stage called check_hicache_events fewer times (an early return in "
    "get_new_batch_prefill) or is stuck before it",
    "hicache-pp-sync-send": "the culprit is sending its pp_sync counts down the chain and the "
    "next stage does not receive them: that stage is stuck before check_hicache_events",
    "hicache-pp-sync-drain": "PP0 waits for the next stage to consume last round's pp_sync "
    "message: that stage lags or skipped a check_hicache_events call",
    "hicache-tp-allreduce": "the culprit sits in a HiCache TP/CP MIN its TP peers never "
    "entered: a conditional or rank-local early return skipped the collective (#28429, #30760)",
}


_PLAIN_HANG = [
    "no PP or HiCache in the evidence: read the stacks of every rank (py-spy dump --native) "
    "for the collective or lock they wait in; NCCL_DEBUG=INFO and "
    "TORCH_NCCL_TRACE_BUFFER_SIZE=2000 (flight recorder) show which collective is missing",
]


def next_steps(
    kind: str,
    form: str | None,
    cause: str | None,
    site: str | None = None,
    ctx: Context | None = None,
) -> list[str]:
    """Steps that fit the evidence: HiCache bisect advice only where PP or HiCache is in it."""
    ctx = ctx or Context(pp=True, hicache=True)
    ours = ctx.pp or ctx.hicache or form in ("A", "B") or bool(site and "hicache" in site)
    if kind == "crash":
        return _CRASH.get(form, _CRASH[None]) + ([BISECT] if ours else [])
    if kind == "hang" and not ours:
        return _PLAIN_HANG + _HANG.get(cause, _HANG[None])
    if kind == "hang" and cause == "network-suspect" and site and site.startswith("hicache"):
        return [
            f"every rank sits in the same HiCache sync ({site}); if the links are healthy the "
            "ranks entered it a different number of times (#30760): compare per-rank call "
            "counts (SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1)",
            *_HANG["network-suspect"],
            BISECT,
        ]
    if kind == "hang":
        hint = [_SITE[site]] if site in _SITE else []
        return hint + _HANG.get(cause, _HANG[None]) + [BISECT]
    if kind in ("healthy", "busy"):
        steps = ["no hang: the ranks make progress or wait for requests"]
        if cause == "straggler":
            steps += _HANG["straggler"]
        return steps + ["for load/write ack latency per iteration run `hicache-diag timeline`"]
    return [
        "give triage something to read: --discover on the serving host, --pid of the "
        "scheduler processes, --dumps with py-spy output, or --logs with the server log",
    ]
