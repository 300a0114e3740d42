"""The branches `export` can write a test for: which run they match (form, the function and file
the failing rank stopped in, its stage), the test template, the mechanism's steps and the
upstream threads found about it. One entry per branch; a run that matches none is refused."""

from __future__ import annotations

from dataclasses import dataclass

from hicache_diag.export.source_lines import Step

URC = "srt/mem_cache/unified_radix_cache.py"
_PULL = "https://github.com/sgl-project/sglang/pull/"
_ISSUE = "https://github.com/sgl-project/sglang/issues/"


@dataclass(frozen=True, slots=True)
class Related:
    ref: str  # "#29109"
    url: str
    state: str  # as found in the public tracker when the recipe was written
    why: str


@dataclass(frozen=True, slots=True)
class Recipe:
    name: str
    forms: tuple[str, ...]  # the verdict's crash form (any one)
    functions: tuple[str, ...] | None  # where the failing rank stopped (any one; None: any)
    file: str | None  # the basename in the traceback (None: any)
    follower: bool | None  # the failing rank is a PP stage > 0 (None: either)
    storage: bool  # the run had an L3 storage backend
    template: str  # under hicache_diag/export/templates/
    test_file: str
    error: str  # what the exported test fails with on an affected release
    title: str
    invariant: str
    steps: tuple[Step, ...]
    related: tuple[Related, ...]

    # Matched on the release's code rather than the crash line: a run with no fault on a
    # release whose source has every step (the divergence is upstream of where ranks stop).
    by_source: bool = False
    # Matched on the run's evidence (evidence_tags.run_tags: a `sources` probe name) before any
    # crash-line recipe: the mechanism that made the ranks part, wherever they then stopped.
    evidence: tuple[str, ...] = ()
    # REPORT.md: whether production reaches the state (apart from the code fact), the upstream
    # status as found in SGLang's tracker, and the committed non-fix the test rejects.
    reachable: str = ""
    upstream: str = ""
    nonfix: str = ""

    def matches(self, form: str | None, function: str | None, file: str | None,
                pp: int | None, storage: bool) -> bool:  # fmt: skip
        return (form in self.forms
                and (self.functions is None or function in self.functions)
                and (self.file is None or file == self.file)
                and (self.follower is None or ((pp or 0) > 0) == self.follower)
                and storage == self.storage)  # fmt: skip

    def describe(self) -> str:
        if self.evidence:
            return f"{'/'.join(self.evidence)} apart in the run's evidence"
        where = ("with no fault, on a release with this code" if self.by_source else
                 f"in {'/'.join(self.functions or ())} ({self.file}) on "
                 f"{'a PP follower' if self.follower else 'PP0'}")  # fmt: skip
        l3 = "with" if self.storage else "without"
        return f"form {'/'.join(self.forms)} {where}, {l3} L3"


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
        Step(URC, "UnifiedRadixCache", "_apply_cache_action", "self._execute_and_commit_kv_backup",
             "an insert's BackupKV is executed on each rank"),
        Step(URC, "UnifiedRadixCache", "_execute_kv_backup", "if self.evict_host(needed) < needed",
             "the host-room check and `evict_host` are rank-local"),
        Step(URC, "UnifiedRadixCache", "_execute_kv_backup", "return None",
             "a short host pool skips the backup on this rank only; no peer is told"),
        Step(URC, "UnifiedRadixCache", "_execute_and_commit_kv_backup", "self.inc_lock_ref",
             "a rank that did back up locks the node until its ack"),
        Step(URC, "UnifiedRadixCache", "_sync_hicache_ready_counts", "self.pp_rank > 0",
             "a PP follower does not count its own acks (only PP0 does)",
             alt=(("writing_check", "if self.pp_rank == 0:"),)),
        Step(URC, "UnifiedRadixCache", "_pp_sync", "torch.distributed.recv",
             "the follower receives PP0's ready count"),
        Step(URC, "UnifiedRadixCache", "writing_check", "ack = cc.ack_write_queue.pop(0)",
             "and pops that many acks from its own queue, with no length or node-id check"),
    ),
    related=(
        Related("#29109", _PULL + "29109", "closed",
                "'Fix intermittent PP HiCache ack queue desync': the same `pop from empty list`, "
                "proposes consuming only local acks that exist"),
        Related("#28429", _ISSUE + "28429", "closed",
                "root cause stated: divergent write_backup / load_back enqueue decisions per "
                "rank (HiRadixCache)"),
        Related("#31425", _PULL + "31425", "open",
                "reserve -> MIN consensus -> commit/abort for write-through and load-back "
                "(written against hiradix_cache.py)"),
        Related("#27489", _PULL + "27489", "merged",
                "unconditional ack all-reduce in UnifiedRadixCache; accepts divergent entries "
                "left undrained as a tradeoff"),
        Related("#22878", _PULL + "22878", "closed",
                "earlier PP write-ack count sync between ranks"),
        Related("#33473", _PULL + "33473", "merged",
                "batches the PP write/load completion sync (keeps the follower's blind pop)"),
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
        Step(HR, "HiRadixCache", "check_hicache_events", "self.drain_storage_control_queues()",
             "with pp_size > 1 every stage drains its storage control queues each step"),
        Step(HR, "HiRadixCache", "drain_storage_control_queues",
             "self._all_reduce_attn_groups(qsizes",
             "the count to drain is a MIN over the stage's own TP group only: no PP relay"),
        Step(HR, "HiRadixCache", "_drain_storage_control_queues_impl",
             "host_indices = cc.mem_pool_host.alloc(alloc_len)",
             "a storage hit allocates host memory on the stages that drained it"),
        Step(HR, "HiRadixCache", "_drain_storage_control_queues_impl",
             "cc.mem_pool_host.free(host_indices)",
             "a release frees host memory on the stages that drained it"),
        Step(HR, "HiRadixCache", "can_terminate_prefetch", "self._all_reduce_attn_groups(states",
             "prefetch termination is also agreed over TP only, per stage"),
        Step(HR, "HiRadixCache", "writing_check", "self._all_reduce(finish_count_tensor",
             "yet the write-ack count is PP0's, relayed to the followers"),
        Step(HR, "HiRadixCache", "writing_check",
             "ack = self.cache_controller.ack_write_queue.pop(0)",
             "so a follower whose host pool refused a write-through pops an ack it never had"),
    ),
    related=(
        Related("#27010", _PULL + "27010", "merged",
                "'[HiCache] Fix PP inconsistency with HiCache L3': PP0's control-queue counts "
                "relayed down the pipeline, followers wait for them; the fix"),
        Related("#22607", _ISSUE + "22607", "closed",
                "'[PP + HiCache] HiCache Consistency Fix Plan': why L3 breaks PP consistency"),
        Related("#22878", _PULL + "22878", "closed",
                "earlier PP write-ack count sync between ranks"),
        Related("#29109", _PULL + "29109", "closed",
                "the same `pop from empty list` in the ack queues under PP"),
    ),
    reachable=(
        "No fault is needed: each stage's storage threads fill its control queues at their "
        "own pace (a file backend's I/O), and the stage drains what it has."
    ),
    upstream="#27010 (merged): PP0's control-queue counts relayed down the pipeline (0.5.19).",
)

SCHED = "srt/managers/scheduler.py"
SESS = "srt/session/session_controller.py"
FLUSH = "srt/managers/scheduler_components/flush_wrapper.py"
_NO_FIX_PP = "no fix exists yet"

SESSION_REAP = Recipe(
    name="session-reap-per-rank-tick",
    forms=(),
    functions=None,
    file=None,
    follower=None,
    storage=False,
    evidence=("session-clock",),
    template="session_reap.py.tmpl",
    test_file="test_session_reap_rank_symmetry.py",
    error="AssertionError",
    title="Streaming sessions are released on each rank's own reap tick",
    invariant=(
        "Every rank that runs the same batches (each PP stage, each TP rank) releases a "
        "session's KV (`tree_cache.release_session`) at the same scheduler step: the sessions "
        "held and released agree across ranks after every step."
    ),
    steps=(
        Step(SCHED, "Scheduler", "process_input_requests",
             "self.session_controller.maybe_reap(now)",
             "every rank calls the reap with its own `time.monotonic()`"),
        Step(SESS, "SessionController", "__init__", "self._last_reap_time: float = 0.0",
             "the reap tick's phase is per rank, set from that rank's own first poll"),
        Step(SESS, "SessionController", "maybe_reap", "if now - self._last_reap_time > interval",
             "a rank reaps only when its own 1 s tick fires"),
        Step(SESS, "Session", "is_timed_out", "time.monotonic() - self.last_active_time",
             "a timeout compares that rank's clock with that rank's last-active stamp"),
        Step(SESS, "SessionController", "_close", "self.tree_cache.release_session(session_id)",
             "the close frees the session's KV on that rank only; no peer is told"),
    ),
    related=(
        Related("#40250", _PULL + "40250", "open",
                "'[Session] ... rank-symmetric session reap ...': its description names the "
                "rank-local `maybe_reap` on each rank's wall clock diverging cache state "
                "across the TP group"),
    ),
    reachable=(
        "No fault is needed. Each rank's reap tick starts from its own first idle poll, so "
        "its phase against the shared scheduler steps differs per rank, and each rank reads "
        "its own clock at a different point of a step (a PP stage reads it after the previous "
        "stage's work reached it). Any `--enable-streaming-session` workload whose sessions "
        "are closed while a turn decodes (deferred close) or opened with `timeout` releases "
        "the session's KV up to one tick (about 1 s, hundreds of steps) apart. Under memory "
        "pressure the stages then admit different batches: form A on PP (the committed runs), "
        "a hang on TP."
    ),
    upstream=(
        "#40250 (open when searched) describes the reap as rank-local and aligns it across the "
        "TP group; its diff was not read here (the repository snapshot was too large to fetch), "
        "so whether it also aligns PP stages is not verified: no merged fix exists yet."
    ),
    nonfix=(
        "`nonfix.patch`: reap on every scheduler iteration (`interval` 0.0) instead of every "
        "second. It removes the tick phase, so a deferred close lands at the same step, but a "
        "timeout still compares each rank's own clock: the timeout case still fails."
    ),
)

FLUSH_DEADLINE = Recipe(
    name="flush-deadline-per-rank-clock",
    forms=(),
    functions=None,
    file=None,
    follower=None,
    storage=False,
    evidence=("flush-deadline",),
    template="flush_deadline.py.tmpl",
    test_file="test_deferred_flush_rank_symmetry.py",
    error="AssertionError",
    title="A deferred /flush_cache ends by each rank's own deadline",
    invariant=(
        "A deferred `/flush_cache?timeout=` has one outcome on every rank: all ranks flush "
        "(tree reset, allocators cleared) at the same scheduler step, or none does."
    ),
    steps=(
        Step(FLUSH, "SchedulerFlushWrapper", "handle",
             "self._pending = (recv_req, time.monotonic() + timeout_s)",
             "each rank stamps its own deadline when it handles the request"),
        Step(SCHED, "Scheduler", "process_input_requests", "self.flush_wrapper.check_pending()",
             "every rank checks its pending flush each iteration"),
        Step(FLUSH, "SchedulerFlushWrapper", "check_pending", "if self._is_fully_idle():",
             "an idle rank flushes"),
        Step(FLUSH, "SchedulerFlushWrapper", "check_pending", "if time.monotonic() >= deadline:",
             "a busy rank past its own deadline gives up; no peer is told"),
        Step(SCHED, "Scheduler", "flush_cache", "self.tree_cache.reset()",
             "the flush resets the whole tree and the allocators on that rank only"),
    ),
    related=(
        Related("#21413", _PULL + "21413", "merged",
                "added `/flush_cache?timeout=` (the deferred flush)"),
        Related("#21490", _PULL + "21490", "merged",
                "one pending flush at a time, rejects concurrent ones; the deadline stays per "
                "rank"),
    ),
    reachable=(
        "The code fact needs no fault: the deadline is stamped and tested on each rank's own "
        "clock, and ranks handle the request and later steps at different wall times. "
        "Production reaches it only when the server turns idle within about one scheduler "
        "iteration of the deadline (a narrow window per flush). The committed run made it "
        "deterministic with an injected clock offset (`flush-clock:rank=1,offset-ms=3000`); "
        "no run here hit it without the fault."
    ),
    upstream="No upstream thread about the per-rank flush deadline was found: no fix exists yet.",
    nonfix=(
        "`nonfix.patch`: flush anyway when the deadline passes (instead of failing the "
        "request). The rank past its deadline then flushes while the other waits a step: "
        "still different steps, and a flush of a busy rank."
    ),
)

RECIPES: tuple[Recipe, ...] = (
    SESSION_REAP,
    FLUSH_DEADLINE,
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
