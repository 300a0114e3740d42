"""Recipes matched on the run's evidence (evidence_tags.run_tags) rather than its crash line:
per-rank clocks that make ranks part with no fault (the session reap, the waiting timeout) or
in a narrow window (the deferred flush)."""

from __future__ import annotations

from hicache_diag.export.recipe_types import _ISSUE, _PULL, Recipe, Related
from hicache_diag.export.source_lines import Step

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
        Step(
            SCHED,
            "Scheduler",
            "process_input_requests",
            "self.session_controller.maybe_reap(now)",
            "every rank calls the reap with its own `time.monotonic()`",
        ),
        Step(
            SESS,
            "SessionController",
            "__init__",
            "self._last_reap_time: float = 0.0",
            "the reap tick's phase is per rank, set from that rank's own first poll",
        ),
        Step(
            SESS,
            "SessionController",
            "maybe_reap",
            "if now - self._last_reap_time > interval",
            "a rank reaps only when its own 1 s tick fires",
        ),
        Step(
            SESS,
            "Session",
            "is_timed_out",
            "time.monotonic() - self.last_active_time",
            "a timeout compares that rank's clock with that rank's last-active stamp",
        ),
        Step(
            SESS,
            "SessionController",
            "_close",
            "self.tree_cache.release_session(session_id)",
            "the close frees the session's KV on that rank only; no peer is told",
        ),
    ),
    related=(
        Related(
            "#40250",
            _PULL + "40250",
            "open",
            "'[Session] ... rank-symmetric session reap ...': its description names the "
            "rank-local `maybe_reap` on each rank's wall clock diverging cache state "
            "across the TP group (Motivation read; diff not read)",
        ),
        Related(
            "#28140",
            _PULL + "28140",
            "open",
            "'[session] Fix reaper closing sessions mid-decode': skips a timed-out session "
            "whose streaming turn is in flight; still each rank's own clock",
        ),
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
        "No merged fix exists yet. #40250 (open when searched): only its description's "
        "Motivation was read (through a search of SGLang's PR threads; the repository "
        "snapshot was too large to fetch and the diff was not reachable). Its part (b) states "
        "this mechanism: `SessionController.maybe_reap` runs rank-locally in "
        "`process_input_requests` on each rank's own wall clock, deferred and timeout closes "
        "release KV on the tree cache, so two ranks apply the same close at different "
        "scheduler-loop iterations and diverge cache state 'across the TP group'; it also "
        "says the deferred-close readiness check ignored the streaming inflight marker. The "
        "description names the TP group only; whether its change also aligns PP stages (each "
        "stage reaps on its own tick, as the committed PP2 runs show) was not verified. "
        "#28140 (open) stops the reaper closing a session mid-decode; it does not align the "
        "tick across ranks by what its review thread shows."
    ),
    nonfix=(
        "`nonfix.patch`: start the reap tick from the first session opened instead of from each "
        "rank's own start-up (`_last_reap_time` set in `SessionController.open`). The tick's "
        "phase then no longer depends on boot, but each rank still stamps it, and tests it, on "
        "its own clock, which a PP stage reads after the previous stage's work reached it: "
        "both cases still fail (deferred close at step 5, timeout at step 10)."
    ),
    fix=(
        "`fix.patch` (against the 0.5.23 wheel; idea and cost in its header): the rank that "
        "pulls requests (PP0, attention TP/CP rank 0) decides the reap in "
        "`Scheduler.ingest_requests` (`SessionController.poll_reap`, its own clock), and the "
        "sessions it picks ride the request broadcast and the PP relay as a "
        "`ReapSessionsReqInput`, as #37143 did for the waiting-timeout aborts; every rank "
        "releases them (`SessionController.reap`) in the same iteration. No collective; a "
        "session's timeout and the tick are PP0's. The test passes with it and fails with "
        "`nonfix.patch` and on the release as it is."
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
        Step(
            FLUSH,
            "SchedulerFlushWrapper",
            "handle",
            "self._pending = (recv_req, time.monotonic() + timeout_s)",
            "each rank stamps its own deadline when it handles the request",
        ),
        Step(
            SCHED,
            "Scheduler",
            "process_input_requests",
            "self.flush_wrapper.check_pending()",
            "every rank checks its pending flush each iteration",
        ),
        Step(
            FLUSH,
            "SchedulerFlushWrapper",
            "check_pending",
            "if self._is_fully_idle():",
            "an idle rank flushes",
        ),
        Step(
            FLUSH,
            "SchedulerFlushWrapper",
            "check_pending",
            "if time.monotonic() >= deadline:",
            "a busy rank past its own deadline gives up; no peer is told",
        ),
        Step(
            SCHED,
            "Scheduler",
            "flush_cache",
            "self.tree_cache.reset()",
            "the flush resets the whole tree and the allocators on that rank only",
        ),
    ),
    related=(
        Related(
            "#21413",
            _PULL + "21413",
            "merged",
            "added `/flush_cache?timeout=` (the deferred flush)",
        ),
        Related(
            "#21490",
            _PULL + "21490",
            "merged",
            "one pending flush at a time, rejects concurrent ones; the deadline stays per rank",
        ),
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
        "request). The rank past its deadline then calls `Scheduler.flush_cache` while still "
        "busy, which refuses and answers failure, while its peer, idle a step later, flushes: "
        "still different outcomes."
    ),
    fix=(
        "`fix.patch` (against the 0.5.23 wheel; idea and cost in its header): only the rank "
        "that pulls requests (PP0, attention TP/CP rank 0) reads the deadline "
        "(`SchedulerFlushWrapper.poll_deadline` in `Scheduler.ingest_requests`); once it "
        "passed, a `FlushCacheDeadlineReqInput` rides the request broadcast and the PP relay, "
        "and `check_pending` gives up only on it, so every rank flushes, or gives up, in the "
        "same iteration. No collective; the timeout is PP0's. The test passes with it and "
        "fails with `nonfix.patch` and on the release as it is."
    ),
)

WAITING_TIMEOUT = Recipe(
    name="waiting-timeout-per-rank-clock",
    forms=(),
    functions=None,
    file=None,
    follower=None,
    storage=False,
    evidence=("waiting-timeout",),
    template="waiting_timeout.py.tmpl",
    test_file="test_waiting_timeout_rank_symmetry.py",
    error="AssertionError",
    title="Requests past SGLANG_REQ_WAITING_TIMEOUT are dropped on each rank's own clock",
    invariant=(
        "Every rank drops the same timed-out requests from its waiting queue in the same "
        "scheduler step: the waiting queues agree across ranks after every step."
    ),
    steps=(
        Step(
            SCHED,
            "Scheduler",
            "get_next_batch_to_run",
            "self._abort_on_waiting_timeout()",
            "every rank runs the waiting-timeout step each scheduler iteration",
        ),
        Step(
            SCHED,
            "Scheduler",
            "_abort_on_waiting_timeout",
            "deadline = time.perf_counter() - timeout_s",
            "the deadline is that rank's own clock",
        ),
        Step(
            SCHED,
            "Scheduler",
            "_abort_on_waiting_timeout",
            "if 0 < entry_time < deadline:",
            "against that rank's own queueing stamp",
        ),
        Step(
            SCHED,
            "Scheduler",
            "_abort_on_waiting_timeout",
            "self.waiting_queue = [",
            "and the request leaves that rank's waiting queue only; no peer is told",
        ),
    ),
    related=(
        Related(
            "#37143",
            _PULL + "37143",
            "merged",
            "'Make request-timeout aborts rank-consistent': the request-pulling rank scans "
            "and sends the aborts with the requests (0.5.20's `_poll_timeout_aborts`)",
        ),
        Related(
            "#27221",
            _ISSUE + "27221",
            "closed",
            "TP rank-divergence deadlock from per-rank clocks in abort-on-timeout",
        ),
        Related("#27164", _PULL + "27164", "closed", "an earlier fix for #27221, not merged"),
        Related(
            "#28881",
            _PULL + "28881",
            "open",
            "syncs the *running*-timeout abort across PP stages (#25887)",
        ),
        Related(
            "#17143",
            _PULL + "17143",
            "merged",
            "added the queued timeout; a comment there reports it causes PP divergence",
        ),
    ),
    reachable=(
        "No fault is needed: any PP or TP server with `SGLANG_REQ_WAITING_TIMEOUT` set whose "
        "queue waits straddle the timeout (overload) drops a request on one rank a step before "
        "the other. The committed 0.5.19 run (PP2, timeout 1.5 s, a request every 0.25 s served "
        "one at a time) diverged in 7 of 10 seeds (`samples/bisect/sglang-0.5.19-vs-0.5.20-"
        "waiting-timeout/`, 95% [0.40, 0.89]) and 0.5.20 in 0 of 10 ([0.00, 0.28]). With one "
        "prompt length nothing crashed: the stages silently computed different requests."
    ),
    upstream=(
        "#37143 (merged; in 0.5.20): the request-pulling rank (PP0, attention TP0/CP0) decides "
        "and the aborts travel with the requests, so every rank drops the same ones. It covers "
        "the waiting timeout and the running timeout on that path."
    ),
    nonfix=(
        "`nonfix.patch` (against 0.5.19): a grace margin on the deadline "
        "(`time.perf_counter() - timeout_s - 0.1`). It moves the boundary; each rank still "
        "crosses it on its own clock."
    ),
)
