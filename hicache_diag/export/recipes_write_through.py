"""The write-through backup decided on each rank alone (UnifiedRadixCache, 0.5.23): one recipe
for the mechanism, whichever rank was short and whatever form the run ended in (a PP follower
short: form B in `writing_check`; PP0 short: form A in the model's forward; a TP rank short:
form C). Chosen by the run's evidence: a rank whose step lines recorded SGLang's own shortage
branch (`host_shortages`) while its peer backed the same write up."""

from __future__ import annotations

from hicache_diag.export.recipe_types import _ISSUE, _PULL, Recipe, Related
from hicache_diag.export.source_lines import Step

URC = "srt/mem_cache/unified_radix_cache.py"

_STEPS = (
    Step(
        URC,
        "UnifiedRadixCache",
        "_apply_cache_action",
        "self._execute_and_commit_kv_backup",
        "an insert's BackupKV is executed on each rank",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_execute_kv_backup",
        "if self.evict_host(needed) < needed",
        "the host-room check and `evict_host` are rank-local",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_execute_kv_backup",
        "return None",
        "a short host pool skips the backup on this rank only; no peer is told",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_execute_and_commit_kv_backup",
        "self.inc_lock_ref",
        "a rank that did back up locks the node until its ack",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_sync_hicache_ready_counts",
        "self.pp_rank > 0",
        "a PP follower does not count its own acks (only PP0 does)",
        alt=(("writing_check", "if self.pp_rank == 0:"),),
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_all_reduce_attn_groups",
        "torch.distributed.all_reduce(tensor, op=op, group=group)",
        "TP ranks MIN-reduce their ready counts: a rank's extra ack is never drained",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "_pp_sync",
        "torch.distributed.recv",
        "a PP follower receives PP0's ready count",
    ),
    Step(
        URC,
        "UnifiedRadixCache",
        "writing_check",
        "ack = cc.ack_write_queue.pop(0)",
        "and pops that many acks from its own queue, with no length or node-id check",
    ),
)

_RELATED = (
    Related(
        "#28429",
        _ISSUE + "28429",
        "closed",
        "root cause stated: divergent write_backup / load_back enqueue decisions per rank; the "
        "MIN-reduce syncs the count of acks drained, not which nodes were enqueued",
    ),
    Related(
        "#31425",
        _PULL + "31425",
        "open",
        "reserve -> all_reduce(MIN) consensus -> commit/abort for write_backup and load_back, "
        "written against `hiradix_cache.py` / `cache_controller.py`",
    ),
    Related(
        "#29109",
        _PULL + "29109",
        "closed",
        "'Fix intermittent PP HiCache ack queue desync': the same `pop from empty list`, "
        "proposes consuming only local acks that exist",
    ),
    Related(
        "#27489",
        _PULL + "27489",
        "merged",
        "unconditional ack all-reduce in UnifiedRadixCache; accepts divergent entries left "
        "undrained as a tradeoff",
    ),
    Related("#22878", _PULL + "22878", "closed", "earlier PP write-ack count sync between ranks"),
    Related(
        "#33473",
        _PULL + "33473",
        "merged",
        "batches the PP write/load completion sync (keeps the follower's blind pop)",
    ),
)


def _error_for(values: dict[str, object]) -> str:
    """A PP follower short raises SGLang's own IndexError in `writing_check`; the others fail
    the test's assertion."""
    if values.get("topology") == "pp" and int(str(values.get("short_rank") or 0)) > 0:
        return "IndexError: pop from empty list"
    return "AssertionError"


URC_WRITE_THROUGH = Recipe(
    name="urc-write-through-per-rank",
    forms=(),
    functions=None,
    file=None,
    follower=None,
    storage=False,
    evidence=("host-shortage",),
    cache_class="UnifiedRadixCache",
    template="urc_write_through.py.tmpl",
    test_file="test_write_through_rank_symmetry.py",
    error="AssertionError",
    error_for=_error_for,
    title="A write-through backup is decided on one rank alone",
    invariant=(
        "Every rank that runs the same batches (each PP stage, each TP rank) holds the same "
        "write-through state after an ack round: the same nodes locked for a backup, the same "
        "host backups committed, the same host slots taken; no rank consumes an ack it does "
        "not have."
    ),
    steps=_STEPS,
    related=_RELATED,
    reachable=(
        "The code fact: the backup is decided per rank on the rank's own host pool, and only "
        "the count of acks is agreed (PP0's count relayed, or a TP MIN), never which nodes were "
        "backed up. Whether production reaches it: one rank's host pool must be shorter than "
        "its peers' for the same write. Host capacities are MIN-synced at start and the free "
        "lists follow identical tree operations, so in 0.5.23 that needs an earlier divergence "
        "or host memory taken outside the tree on one rank only (side pools sized per rank, a "
        "shared allocation domain). Every committed run of this mechanism held one rank's host "
        "pool with an injected side pool (`host-shortage`); none reached it with no fault. "
        "#28429 reports a production TP8 hang of this family, with the origin inferred, not "
        "traced."
    ),
    upstream=(
        "No fix for `UnifiedRadixCache` exists yet: #31425 (open when searched) proposes "
        "reserve -> MIN consensus -> commit/abort, written against `hiradix_cache.py`, which "
        "0.5.23 no longer uses for this path; #28429 (closed) states the root cause; #27489 "
        "(merged) made the ack all-reduce unconditional and left divergent entries undrained."
    ),
    nonfix=(
        "`nonfix.patch` is the obvious fix for the symptom each run ended in: for a PP "
        "follower's `pop from empty list` (form B), cap the follower's pop at its own queue; "
        "for the stuck ack of PP0 short (form A) or a TP rank short (form C), let every rank "
        "drain the acks it has ready itself (#29109's 'consume only local acks'). Either way "
        "the crash or the stuck lock goes, and one rank still committed a host backup its peer "
        "did not, so the test still fails."
    ),
    fix=(
        "`fix.patch` (against the 0.5.23 wheel; idea, cost and limit in its header): the host "
        "room `_execute_kv_backup` decides on becomes a per-round protocol quantity. The "
        "event poll every rank runs at the same point of each round (`check_hicache_events` "
        "-> `_sync_hicache_ready_counts`) carries PP0's room in the ready-count tensor it "
        "already reduces: a MIN over PP0's attention TP/CP ranks, relayed down the pipeline "
        "by the same `_all_reduce`. Each backup that round spends from the agreed room (less "
        "what the round's backups took, plus what their `evict_host` freed), so every rank "
        "evicts for that room and backs up, or skips, alike, with no collective at decision "
        "time (a first candidate relayed at decision time and deadlocked the PP2 server: PP1 "
        "posts no matching recv). Cost: no extra message; the host cache degrades to its most "
        "loaded rank, and host slots freed between the poll and a decision count from the "
        "next round. With it the test passes where PP0 or a TP rank is the short one (forms "
        "A, C-TP). A PP follower short where PP0 is not (form B) cannot be absorbed by a "
        "decision that only travels down the pipeline (the follower's room would have to "
        "travel up, and a stage waiting for a later one deadlocks the PP loop): the patch "
        "then stops at the decision with a named assertion instead of a later `pop from empty "
        "list`, and the test still fails. Host capacities are MIN-synced and the free lists "
        "follow identical tree operations, so that case needs an earlier divergence or a "
        "fault (every committed run injected one)."
    ),
)
