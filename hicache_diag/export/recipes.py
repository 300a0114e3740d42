"""The branches `export` can write a test for: which run they match (form, the function and file
the failing rank stopped in, its stage), the test template, the mechanism's steps and the
upstream threads found about it. One entry per branch; a run that matches none is refused."""

from __future__ import annotations

from hicache_diag.export.recipe_types import _ISSUE, _PULL, Recipe, Related
from hicache_diag.export.recipes_evidence import FLUSH_DEADLINE, SESSION_REAP, WAITING_TIMEOUT
from hicache_diag.export.source_lines import Step

URC = "srt/mem_cache/unified_radix_cache.py"

URC_WRITE_THROUGH_FORM_B = Recipe(
    name="urc-pp-follower-write-through",
    forms=("B",),
    functions=("writing_check",),
    file="unified_radix_cache.py",
    follower=True,
    storage=False,
    template="urc_write_through_form_b.py.tmpl",
    test_file="test_pp_follower_write_through_ack.py",
    error="IndexError: pop from empty list",
    title="A PP follower pops a write-through ack it never enqueued",
    invariant=(
        "Every PP stage holds the same write-through ledger: a stage consumes only acks it "
        "enqueued, and the count PP0 relays never exceeds what a follower's `ack_write_queue` "
        "holds."
    ),
    steps=(
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
            "_pp_sync",
            "torch.distributed.recv",
            "the follower receives PP0's ready count",
        ),
        Step(
            URC,
            "UnifiedRadixCache",
            "writing_check",
            "ack = cc.ack_write_queue.pop(0)",
            "and pops that many acks from its own queue, with no length or node-id check",
        ),
    ),
    related=(
        Related(
            "#29109",
            _PULL + "29109",
            "closed",
            "'Fix intermittent PP HiCache ack queue desync': the same `pop from empty list`, "
            "proposes consuming only local acks that exist",
        ),
        Related(
            "#28429",
            _ISSUE + "28429",
            "closed",
            "root cause stated: divergent write_backup / load_back enqueue decisions per "
            "rank (HiRadixCache)",
        ),
        Related(
            "#31425",
            _PULL + "31425",
            "open",
            "reserve -> MIN consensus -> commit/abort for write-through and load-back "
            "(written against hiradix_cache.py)",
        ),
        Related(
            "#27489",
            _PULL + "27489",
            "merged",
            "unconditional ack all-reduce in UnifiedRadixCache; accepts divergent entries "
            "left undrained as a tradeoff",
        ),
        Related(
            "#22878", _PULL + "22878", "closed", "earlier PP write-ack count sync between ranks"
        ),
        Related(
            "#33473",
            _PULL + "33473",
            "merged",
            "batches the PP write/load completion sync (keeps the follower's blind pop)",
        ),
    ),
    reachable=(
        "Needs an earlier divergence or a fault. The follower's host pool must be shorter "
        "than PP0's for the same write; host capacities are MIN-synced and the free lists "
        "follow identical tree operations, so in 0.5.23 that happens only after another "
        "divergence, or with side pools that differ per stage. The committed run held PP1's "
        "host pool with an injected side pool (`host-shortage`); the code fact (no consensus "
        "on the backup, a blind pop on the follower) stands apart from that."
    ),
    upstream=(
        "#31425 (open when searched) proposes reserve -> MIN consensus -> commit/abort, written "
        "against `hiradix_cache.py`, which 0.5.23 no longer ships; #28429 (closed) states the "
        "root cause; no fix for `UnifiedRadixCache` exists yet."
    ),
    nonfix=(
        "`nonfix.patch`: cap the follower's pop at its own queue (the #29109-style guard). The "
        "crash goes; PP0 still committed a host backup PP1 did not, so the test still fails."
    ),
)

HR = "srt/mem_cache/hiradix_cache.py"

HIRADIX_STORAGE_DRAIN = Recipe(
    name="hiradix-pp-storage-control-drain",
    forms=("A", "B", "C"),
    functions=None,
    file=None,
    follower=None,
    storage=True,
    by_source=True,
    template="hiradix_storage_drain.py.tmpl",
    test_file="test_pp_storage_control_drain.py",
    error="AssertionError",
    title="PP stages drain L3 storage control queues by different counts",
    invariant=(
        "Every PP stage applies the same L3 storage control events (storage hits and their "
        "host allocations, backup acks, host-memory releases) in the same scheduler step, so "
        "host pools, and every write-through and load-back decided from them, stay equal "
        "across stages."
    ),
    steps=(
        Step(
            HR,
            "HiRadixCache",
            "check_hicache_events",
            "self.drain_storage_control_queues()",
            "with pp_size > 1 every stage drains its storage control queues each step",
        ),
        Step(
            HR,
            "HiRadixCache",
            "drain_storage_control_queues",
            "self._all_reduce_attn_groups(qsizes",
            "the count to drain is a MIN over the stage's own TP group only: no PP relay",
        ),
        Step(
            HR,
            "HiRadixCache",
            "_drain_storage_control_queues_impl",
            "host_indices = cc.mem_pool_host.alloc(alloc_len)",
            "a storage hit allocates host memory on the stages that drained it",
        ),
        Step(
            HR,
            "HiRadixCache",
            "_drain_storage_control_queues_impl",
            "cc.mem_pool_host.free(host_indices)",
            "a release frees host memory on the stages that drained it",
        ),
        Step(
            HR,
            "HiRadixCache",
            "can_terminate_prefetch",
            "self._all_reduce_attn_groups(states",
            "prefetch termination is also agreed over TP only, per stage",
        ),
        Step(
            HR,
            "HiRadixCache",
            "writing_check",
            "self._all_reduce(finish_count_tensor",
            "yet the write-ack count is PP0's, relayed to the followers",
        ),
        Step(
            HR,
            "HiRadixCache",
            "writing_check",
            "ack = self.cache_controller.ack_write_queue.pop(0)",
            "so a follower whose host pool refused a write-through pops an ack it never had",
        ),
    ),
    related=(
        Related(
            "#27010",
            _PULL + "27010",
            "merged",
            "'[HiCache] Fix PP inconsistency with HiCache L3': PP0's control-queue counts "
            "relayed down the pipeline, followers wait for them; the fix",
        ),
        Related(
            "#22607",
            _ISSUE + "22607",
            "closed",
            "'[PP + HiCache] HiCache Consistency Fix Plan': why L3 breaks PP consistency",
        ),
        Related(
            "#22878", _PULL + "22878", "closed", "earlier PP write-ack count sync between ranks"
        ),
        Related(
            "#29109",
            _PULL + "29109",
            "closed",
            "the same `pop from empty list` in the ack queues under PP",
        ),
    ),
    reachable=(
        "No fault is needed: each stage's storage threads fill its control queues at their "
        "own pace (a file backend's I/O), and the stage drains what it has. Any PP server with "
        "an L3 backend under load: the clean bisect (`samples/bisect/sglang-0.5.18-vs-0.5.19-"
        "l3-clean/`, PP2, file backend, own L3 dir per trial) ended in a crash or hang in 5 of "
        "5 decided 0.5.18 trials (forms A:1 B:2 C:2; 95% [0.57, 1.00]) and 0 of 5 on 0.5.19 "
        "([0.00, 0.43])."
    ),
    upstream="#27010 (merged): PP0's control-queue counts relayed down the pipeline (0.5.19).",
    nonfix=(
        "`nonfix.patch` (against 0.5.18): cap the follower's pops in `writing_check` / "
        "`loading_check` at its own queues (the obvious fix for the `pop from empty list` these "
        "runs end in). The crash goes; the stages still drain their storage control queues by "
        "different counts, so the test still fails."
    ),
)

RECIPES: tuple[Recipe, ...] = (
    SESSION_REAP,
    FLUSH_DEADLINE,
    WAITING_TIMEOUT,
    URC_WRITE_THROUGH_FORM_B,
    HIRADIX_STORAGE_DRAIN,
)


def find_recipe(
    form: str | None,
    function: str | None,
    file: str | None,
    pp: int | None,
    storage: bool = False,
    shape=None,
    tags=frozenset(),
) -> Recipe | None:
    """The first recipe the run matches: by the mechanism its evidence names (`tags`), else
    by its crash; `shape(recipe)` says whether the run's release has a by-source recipe's code
    (None: no release source at hand, so none of those match)."""
    for r in RECIPES:
        if r.evidence:
            if set(r.evidence) & set(tags):
                return r
            continue
        if not r.matches(form, function, file, pp, storage):
            continue
        if r.by_source and (shape is None or not shape(r)):
            continue
        return r
    return None
