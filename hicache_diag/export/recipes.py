"""The branches `export` can write a test for: which run they match (form, the function and file
the failing rank stopped in, its stage), the test template, the mechanism's steps and the
upstream threads found about it. One entry per branch; a run that matches none is refused."""

from __future__ import annotations

from hicache_diag.export.recipe_types import _ISSUE, _PULL, Recipe, Related
from hicache_diag.export.recipes_evidence import FLUSH_DEADLINE, SESSION_REAP, WAITING_TIMEOUT
from hicache_diag.export.recipes_write_through import URC_WRITE_THROUGH
from hicache_diag.export.source_lines import Step

HR = "srt/mem_cache/hiradix_cache.py"

HIRADIX_STORAGE_DRAIN = Recipe(
    name="hiradix-pp-storage-control-drain",
    forms=("A", "B", "C"),
    functions=None,
    file=None,
    follower=None,
    storage=True,
    by_source=True,
    cache_class="HiRadixCache",
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
    URC_WRITE_THROUGH,
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
    cache: str | None = None,
) -> Recipe | None:
    """The first recipe the run matches: by the mechanism its evidence names (`tags`), else
    by its crash; `shape(recipe)` says whether the run's release has a by-source recipe's code
    (None: no release source at hand, so none of those match). A recipe that drives another
    tree cache class than the run's (`cache`, when the run says) never matches."""
    for r in RECIPES:
        if cache and r.cache_class and r.cache_class != cache:
            continue
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
