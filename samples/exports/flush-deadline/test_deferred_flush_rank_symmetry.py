"""A deferred /flush_cache ends by a per-rank deadline, SGLang 0.5.23.

Exported from a hicache-diag run (sglang-0.5.23-flush-clock): deferred flush #6 ended differently per rank (rank<r>.log): rank 0 timed out (2026-12-02 03:25:55), rank 1 flushed (2026-12-02 03:25:55)

`/flush_cache?timeout=T` reaches every scheduler; `SchedulerFlushWrapper.handle` stamps a
deadline `time.monotonic() + T` on each rank when that rank handles the request, and
`check_pending` (every `process_input_requests`) flushes when the rank is idle, or gives up
when that rank's own clock passes its own deadline. Ranks read their clocks at different
moments (PP1 handles the request after PP0's step reached it), so around the deadline one rank
gives up while the other, one step later and idle, resets its whole tree and allocators.

This test runs two PP stages as two processes joined by real gloo groups (SGLang's own
`init_distributed_environment` / `initialize_model_parallel`). Each stage is the release's
`Scheduler` (`object.__new__`, then its own `init_request_receiver` / `init_request_dispatcher`,
its real `flush_cache` behind a real `SchedulerFlushWrapper`) and runs what `event_loop_pp` runs
per iteration for requests: `ingest_requests()` (PP0 pulls the request from a real zmq socket,
PP1 receives PP0's relay), then `_pp_send_pyobj_to_next_stage`. The only per-rank quantity is
the clock: `time.monotonic` is patched in each process to that stage's own reading (PP1 reads
it after PP0's work of the step reached it, PIPE_LAG_S); the busy/idle sequence is the same on
both. The precondition is PP1's lag when it handles the request exceeding its lag when it
checks the deadline; with a constant lag the stages agree.
Invariant: after every iteration both stages have flushed at the same steps and answered the
same. A fix that decides the outcome once and relays it (or aligns it any other way over the
process groups) passes; a release without this code path skips.

Run: python -m pytest -q test_deferred_flush_rank_symmetry.py   (plain pytest, against the installed SGLang)
"""

import multiprocessing
import os
import tempfile
import traceback
import unittest
from types import SimpleNamespace
from unittest import mock

try:
    import zmq

    from sglang.srt.distributed import parallel_state
    from sglang.srt.managers.io_struct import FlushCacheReqInput, sock_send
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper
    from sglang.srt.runtime_context import get_server_args
    from sglang.srt.session.session_controller import SessionController
except ImportError as exc:  # a release without this code path
    Scheduler = None
    _MISSING = f"{type(exc).__name__}: {exc}"

try:  # the test's own scaffolding (SGLang 0.5.23's test helper), apart from the code path
    from sglang.test.test_utils import publish_build_topology
except ImportError:
    publish_build_topology = None
_NO_SCAFFOLD = ("this test builds its ranks' process groups with "
                "sglang.test.test_utils.publish_build_topology (0.5.23's test helper), which "
                "this release lacks: not run here, which says nothing of the mechanism")

START = 1000.0  # PP0's clock when the flush request arrives (s, monotonic)
STEP_S = 0.25  # one scheduler iteration
PIPE_LAG_S = {0: 0.375}  # PP1 waits for PP0's prefill at step 0
DECODE_LAG_S = 0.125  # and for PP0's decode on the other steps
TIMEOUT_S = 2.0  # /flush_cache?timeout=2
BUSY_STEPS = 9  # the running batch finishes at step 8; both ranks are idle from step 9
STEPS = 12
# The Scheduler methods this test drives (a release without one of them skips).
_PATH = ("ingest_requests", "process_input_requests", "init_request_receiver",
         "init_request_dispatcher", "_pp_send_pyobj_to_next_stage", "flush_cache")
_TIMEOUT_S = 240


def _clock(pp_rank, step):
    """This stage's `time.monotonic()` at iteration `step`."""
    now = START + step * STEP_S
    return now + (PIPE_LAG_S.get(step, DECODE_LAG_S) if pp_rank else 0.0)


def _scheduler(pp_rank, tokenizer, rpc, step):
    """The release's Scheduler with only what request ingestion and the flush touch."""
    sched = object.__new__(Scheduler)
    sched.world_group = parallel_state.get_world_group()
    sched.pp_group = parallel_state.get_pp_group()
    sched.tp_group = parallel_state.get_tp_group()
    sched.server_args = get_server_args()
    sched.model_config = SimpleNamespace(is_multimodal=False)
    sched.recv_from_tokenizer = tokenizer
    sched.ipc_channels = SimpleNamespace(recv_from_rpc=rpc, send_to_tokenizer=mock.MagicMock())
    sched.recv_skipper = sched.input_blocker = sched.mm_receiver = None
    sched.scripted_scheduler_hook = sched.scheduler_stage_metrics = None
    sched.rust_server = sched.external_corpus_manager = sched.draft_worker = None
    sched.max_recv_per_poll = -1
    sched.output_streamer = sched.metrics_reporter = mock.MagicMock()
    sched.weight_updater = sched.grammar_manager = mock.MagicMock()
    sched.last_batch = sched.cur_batch_for_debug = None
    sched.waiting_queue = []
    sched.running_batch = SimpleNamespace(reqs=["r0"])  # for flush_cache's refusal line
    sched._deferred_input_requests = []  # Scheduler.__init__'s own start value
    sched._engine_paused = False  # Scheduler.__init__'s own start value
    # What the flush clears: recorders (the tree's reset is the flush that must agree).
    sched.tree_cache = mock.MagicMock()
    sched.req_to_token_pool = sched.token_to_kv_pool_allocator = mock.MagicMock()
    sched.session_controller = SessionController(sched.tree_cache)
    # The batches: the same on every stage (busy until BUSY_STEPS).
    sched.is_fully_idle = lambda **_: step[0] >= BUSY_STEPS
    sched.flush_wrapper = SchedulerFlushWrapper(
        flush_cache=sched.flush_cache, is_fully_idle=sched.is_fully_idle,
        send_output=sched.send_control_output)
    sched.init_request_receiver()
    sched.init_request_dispatcher()
    return sched


def _stage(pp_rank, init_file, schedule, conn):
    """One PP stage's process: SGLang's process groups over gloo, then the iterations."""
    try:
        publish_build_topology(world_rank=pp_rank, pp_size=2)
        parallel_state.init_distributed_environment(
            world_size=2, rank=pp_rank, local_rank=pp_rank, backend="gloo",
            distributed_init_method=f"file://{init_file}", timeout=120)
        parallel_state.initialize_model_parallel(backend="gloo")
        ctx = zmq.Context()
        tokenizer, rpc, client = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        tokenizer.bind("inproc://tokenizer")
        rpc.bind("inproc://rpc")
        client.connect("inproc://tokenizer")
        step = [0]
        sched = _scheduler(pp_rank, tokenizer, rpc, step)
        now = [0.0]
        states = []
        with mock.patch("time.monotonic", lambda: now[0]):
            for k in range(STEPS):
                step[0], now[0] = k, _clock(pp_rank, k)
                if pp_rank == 0:  # the tokenizer's messages reach PP0 only
                    for req in schedule.get(k, ()):
                        sock_send(client, req)
                recv_reqs = sched.ingest_requests()
                if not sched.pp_group.is_last_rank:
                    sched._pp_send_pyobj_to_next_stage(recv_reqs)
                flushed = sched.tree_cache.reset.call_count
                answered = [c.args[0].success for c in
                            sched.ipc_channels.send_to_tokenizer.send_output.call_args_list]
                states.append((k, flushed, answered))
        conn.send(("ok", states))
    except BaseException as exc:  # noqa: BLE001 - reported to the test process
        try:
            conn.send(("error", exc, traceback.format_exc()))
        except Exception:  # an exception that does not pickle
            conn.send(("error", RuntimeError(repr(exc)), traceback.format_exc()))


def _run_stages(test, schedule):
    """Both stages' states per iteration; a stage's exception is raised here as itself."""
    ctx = multiprocessing.get_context("fork")
    init_file = os.path.join(tempfile.mkdtemp(), "gloo-init")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_stage, args=(r, init_file, schedule, pipes[r][1]), daemon=True)
             for r in range(2)]
    for p in procs:
        p.start()
    results = []
    try:
        for r, (recv, _) in enumerate(pipes):
            if not recv.poll(_TIMEOUT_S):
                test.fail(f"PP{r} sent nothing in {_TIMEOUT_S} s (hung in a collective?)")
            results.append(recv.recv())
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    for r, result in enumerate(results):
        if result[0] == "error":
            exc, tb = result[1], result[2]
            if isinstance(exc, AttributeError):
                test.fail(f"PP{r}: this release's Scheduler reads an attribute the test does not "
                          f"build ({exc}); update _scheduler() for it.\n{tb}")
            raise exc from RuntimeError(f"PP{r} raised:\n{tb}")
    return [r[1] for r in results]


@unittest.skipIf(Scheduler is None, f"this SGLang lacks what the test imports: {globals().get('_MISSING')}")
class TestDeferredFlushRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [n for n in _PATH if not hasattr(Scheduler, n)]
        if missing:
            self.skipTest(f"this test drives Scheduler.{', Scheduler.'.join(missing)}, which "
                          "this release lacks")
        if publish_build_topology is None:
            self.skipTest(_NO_SCAFFOLD)

    def test_deferred_flush_same_outcome_on_every_rank(self):
        pp0, pp1 = _run_stages(self, {0: [FlushCacheReqInput(timeout_s=TIMEOUT_S)]})
        for (k, flushed0, answered0), (_, flushed1, answered1) in zip(pp0, pp1):
            self.assertEqual(
                (flushed0, answered0), (flushed1, answered1),
                f"step {k}: PP0 flushed {flushed0} time(s) and answered {answered0}, PP1 "
                f"flushed {flushed1} time(s) and answered {answered1} (success per answer)",
            )


if __name__ == "__main__":
    unittest.main()
