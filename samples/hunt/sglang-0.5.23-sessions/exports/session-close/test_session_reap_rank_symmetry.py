"""Streaming sessions are released on each rank's own reap tick, SGLang 0.5.23.

Exported from a hicache-diag run (session-close, no fault injected): the reap tick closed a session on one rank only (`sessions_closed` / `sources.session-clock`): rank 0 at step(s) 2384; rank 1 at step(s) 2383

`Scheduler.process_input_requests` calls `SessionController.maybe_reap(time.monotonic())` on
every rank. `maybe_reap` runs only when that rank's own 1 s tick fires (`_last_reap_time` is
per rank and starts at 0.0), and `Session.is_timed_out` compares that rank's own clock with
that rank's own `last_active_time`. Deferred closes and timeouts then call
`tree_cache.release_session` at a step that depends on each rank's clock, so two PP stages
running the same batches release the same session at different steps.

This test runs two PP stages as two processes joined by real gloo groups (SGLang's own
`init_distributed_environment` / `initialize_model_parallel`). Each stage is the release's
`Scheduler` (`object.__new__`, then its own `init_request_receiver` / `init_request_dispatcher`)
and runs what `event_loop_pp` runs per iteration for requests: `ingest_requests()` (PP0 pulls
from a real zmq socket, PP1 receives PP0's relay), then `_pp_send_pyobj_to_next_stage`. The
only per-rank quantity is the clock: `time.monotonic` is patched in each process to that
stage's own reading, and the code under test reads it where it does in production. The turns
a session runs (admitted, finished) are applied to both stages at the same step, as
`process_batch_result` does.
  - both stages polled idle from start-up, PP1 half a second behind (it booted later);
  - in lock-step, PP1 reads its clock after PP0's work of the step reached it (PIPE_LAG_S).
Invariant: after every iteration both stages hold the same sessions and have released the
same ones. A fix that decides the reap once and relays it (or aligns it any other way over
the process groups) passes; a release without this code path skips.

Run: python -m pytest -q test_session_reap_rank_symmetry.py   (plain pytest, against the installed SGLang)
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
    from sglang.srt.managers.io_struct import (
        CloseSessionReqInput,
        OpenSessionReqInput,
        sock_send,
    )
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

START = 1000.0  # PP0's clock at the first work step (s, monotonic)
STEP_S = 0.25  # one scheduler iteration
IDLE_STEPS = 40  # idle iterations before the first request (PP0 from 990.0)
BOOT_LAG_S = 0.5  # PP1 booted later: half a second behind while idle
PIPE_LAG_S = {0: 0.375}  # PP1 waits for PP0's prefill at step 0
DECODE_LAG_S = 0.125  # and for PP0's decode on the other steps
STEPS = 16
# The Scheduler methods this test drives (a release without one of them skips).
_PATH = ("ingest_requests", "process_input_requests", "init_request_receiver",
         "init_request_dispatcher", "_pp_send_pyobj_to_next_stage", "open_session",
         "close_session")
_TIMEOUT_S = 240


def _clock(pp_rank, step):
    """This stage's `time.monotonic()` at iteration `step` (negative: idle polls)."""
    now = START + step * STEP_S
    if pp_rank == 0:
        return now
    return now + (BOOT_LAG_S if step < 0 else PIPE_LAG_S.get(step, DECODE_LAG_S))


def _scheduler(pp_rank, tokenizer, rpc):
    """The release's Scheduler with only what request ingestion touches."""
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
    sched.rust_server = sched.external_corpus_manager = None
    sched.max_recv_per_poll = -1
    sched.output_streamer = sched.metrics_reporter = mock.MagicMock()
    sched.weight_updater = mock.MagicMock()
    sched.last_batch = None
    sched.waiting_queue = []
    sched._deferred_input_requests = []  # Scheduler.__init__'s own start value
    sched.enable_session_radix_cache = False
    sched.tree_cache = mock.MagicMock()  # records release_session
    sched.session_controller = SessionController(sched.tree_cache)
    sched.flush_wrapper = SchedulerFlushWrapper(
        flush_cache=mock.MagicMock(return_value=True), is_fully_idle=lambda: True,
        send_output=sched.send_control_output)
    sched.init_request_receiver()
    sched.init_request_dispatcher()
    return sched


def _turn_admitted(sid):
    # What `Session.create_req` does for a streaming session when the scheduler admits a turn.
    def apply(sched):
        sched.session_controller.get(sid)._inflight = True

    return apply


def _turn_finished(sid, rid):
    # What the scheduler's finish path does when the turn's request finishes.
    req = SimpleNamespace(rid=rid, origin_input_ids=[1, 2, 3], origin_input_ids_unpadded=[1, 2, 3],
                          full_untruncated_fill_ids=[1, 2, 3], session=sid,
                          multimodal_inputs=None, finished=lambda: True)

    def apply(sched):
        sched.session_controller.get(sid).finish_req(req)

    return apply


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
        sched = _scheduler(pp_rank, tokenizer, rpc)
        now = [0.0]
        states = []
        with mock.patch("time.monotonic", lambda: now[0]):
            for step in range(-IDLE_STEPS, STEPS):
                now[0] = _clock(pp_rank, step)
                requests, turns = schedule.get(step, ((), ()))
                if pp_rank == 0:  # the tokenizer's messages reach PP0 only
                    for req in requests:
                        sock_send(client, req)
                recv_reqs = sched.ingest_requests()
                if not sched.pp_group.is_last_rank:
                    sched._pp_send_pyobj_to_next_stage(recv_reqs)
                for apply in turns:
                    apply(sched)
                released = [c.args[0] for c in sched.tree_cache.release_session.call_args_list]
                states.append((step, sorted(sched.session_controller.sessions), released))
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
class TestSessionReapRankSymmetry(unittest.TestCase):
    def setUp(self):
        missing = [n for n in _PATH if not hasattr(Scheduler, n)]
        if missing:
            self.skipTest(f"this test drives Scheduler.{', Scheduler.'.join(missing)}, which "
                          "this release lacks")
        if publish_build_topology is None:
            self.skipTest(_NO_SCAFFOLD)

    def _drive(self, schedule):
        pp0, pp1 = _run_stages(self, schedule)
        for (step, held0, rel0), (_, held1, rel1) in zip(pp0, pp1):
            self.assertEqual(
                (held0, rel0), (held1, rel1),
                f"step {step}: PP0 holds {held0} and released {rel0}, "
                f"PP1 holds {held1} and released {rel1}",
            )

    def test_deferred_close_released_at_the_same_step(self):
        # A session closed while its turn decodes: the close is deferred on both stages and
        # carried out by the next reap after the turn finished.
        open_req = OpenSessionReqInput(capacity_of_str_len=64, session_id="c000", streaming=True)
        self._drive({
            0: ([open_req], [_turn_admitted("c000")]),
            1: ([CloseSessionReqInput(session_id="c000")], ()),
            3: ((), [_turn_finished("c000", "c000-t0")]),
        })

    def test_timed_out_session_released_at_the_same_step(self):
        # A session opened with a timeout and left idle: the reap closes it.
        open_req = OpenSessionReqInput(capacity_of_str_len=64, session_id="s000", streaming=True,
                                       timeout=2.0)
        self._drive({0: ([open_req], ())})


if __name__ == "__main__":
    unittest.main()
