"""The one trial loop, for every engine: run dir, manifest, start, ready, workload, the hang
watch, stack dumps, reap, launcher.json, classification, verdict.json last.

The engine (trials/engine.py `Engine`: the builtin runtime in trials/builtin.py, real SGLang
in sglang/trial.py) starts, polls and reaps its ranks and records their facts; judging them is
the classifier's. The root cause is the first failure in time: the first rank to end badly is
recorded, the survivors get the engine's grace to log their cascade (`Connection closed by
peer`), then are reaped.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hicache_diag import evidence as ev
from hicache_diag.errors import EngineStartError
from hicache_diag.evidence.verdict import Verdict
from hicache_diag.trials.engine import (
    Engine,
    EngineConfig,
    Progress,
    RankRecord,
    TrialWatch,
    rank_process,
)
from hicache_diag.trials.hang_watch import HangWatch, usable_hang_timeout
from hicache_diag.trials.proc_facts import StopWatch, oom_kill_count
from hicache_diag.trials.rundir import prepare_run_dir, utc_now, write_json, write_manifest
from hicache_diag.trials.signals import last_signal, restore_sigterm, trap_sigterm
from hicache_diag.trials.trial_guard import (
    VerdictReserve,
    disk_full,
    environment_error,
    environment_in_logs,
    signals_deferred,
)
from hicache_diag.trials.trial_verdict import judge, write_verdict

STACK_DEADLINE_S = 4.0  # py-spy attaches in well under a second; a stuck one is killed
FAULTHANDLER_WAIT_S = 1.0


@dataclass(slots=True)
class TrialResult:
    verdict: Verdict
    run_dir: Path


def run_engine_trial(
    engine: Engine,
    cfg: EngineConfig,
    argv: list[str] | None = None,
    on_progress: Progress | None = None,
) -> TrialResult:
    """One run, start to verdict. SIGINT/SIGTERM/SIGHUP end it early: every rank is reaped and
    the verdict (outcome `interrupted`, exit 130) is still written, with the evidence so far. A
    full disk or an I/O error at any point: the ranks reaped, verdict.json `undecided` with the
    cause, no rank named (trials/trial_guard.py)."""
    torch.set_num_threads(1)  # the reference shares 2 cores with the ranks; threads only thrash
    old = trap_sigterm()
    try:
        with signals_deferred():  # a run dir is made whole, or not at all
            run_dir = prepare_run_dir(cfg.out, cfg.seed)
            reserve = VerdictReserve(run_dir)
        t0 = time.time()
        watch = TrialWatch(oom_kills_before=oom_kill_count())
        _run(engine, cfg, run_dir, argv, watch, on_progress, reserve)
        verdict = judge(run_dir, engine, watch, t0)
        write_verdict(run_dir, verdict, reserve)
    finally:
        restore_sigterm(old)
    return TrialResult(verdict, run_dir)


def _run(
    engine: Engine,
    cfg: EngineConfig,
    run_dir: Path,
    argv: list[str] | None,
    watch: TrialWatch,
    on_progress: Progress | None,
    reserve: VerdictReserve,
) -> None:
    """Start, watch, reap, and write the evidence; whatever ends it, the ranks are reaped and
    launcher.json says why."""
    started = utc_now()
    try:
        engine.prepare(run_dir)
        write_manifest(run_dir, engine.manifest(argv or []))
        engine.start()
        engine.wait_ready(watch, on_progress)
        engine.drive()
        _watch_loop(engine, cfg, run_dir, watch, on_progress)
        if watch.first_failure is None and watch.hang is None:
            engine.drained(watch)
    except KeyboardInterrupt:
        watch.interrupted, watch.interrupted_at = True, time.time()
        watch.interrupt_signal = last_signal() or "SIGINT"
        try:
            _note_interrupt_stall(engine, run_dir, watch)
        except KeyboardInterrupt:  # a second Ctrl-C: reap at once, without the stacks
            pass
    except EngineStartError as exc:  # a run that never started: the environment's failure
        watch.startup_error = str(exc)
    except OSError as exc:  # a full disk, EIO: the machine's failure, never a rank's
        _environment(watch, exc, "running the trial")
    finally:
        _close(engine, run_dir, watch, started, reserve)


def _close(
    engine: Engine, run_dir: Path, watch: TrialWatch, started: str, reserve: VerdictReserve
) -> None:
    """Reap every rank (again after a second Ctrl-C), then the rest of the evidence with stop
    signals held (one that comes marks the run interrupted; the evidence is still finished and
    launcher.json written), each step kept from stopping the next: a full disk is recorded,
    never raised."""
    try:
        engine.close(watch)
    except KeyboardInterrupt:  # a second Ctrl-C while reaping: reap anyway
        engine.close(watch)
    with signals_deferred(drop=True) as held:  # every rank is reaped: nothing left to stop
        for doing, step in (
            ("dropping empty stack files", lambda: drop_empty_stack_files(run_dir)),
            ("finishing the evidence", lambda: engine.finish_evidence(watch)),
        ):
            try:
                step()
            except OSError as exc:
                _environment(watch, exc, doing)
        _find_environment_error(engine, run_dir, watch)
        if held and not watch.interrupted:
            watch.interrupted, watch.interrupted_at = True, time.time()
            watch.interrupt_signal = signal.Signals(held[-1]).name
        try:
            reserve.release()  # the ranks are gone: their room is launcher.json's and the verdict's
            write_launcher_json(run_dir, engine, watch, started)
        except OSError as exc:
            _environment(watch, exc, f"writing {ev.LAUNCHER}")


def _find_environment_error(engine: Engine, run_dir: Path, watch: TrialWatch) -> None:
    """A rank that died of the machine (its log's `[Errno 28]`), or a disk left full."""
    if watch.environment_error is None and (watch.first_failure or watch.hang):
        ranks = [p.rank for p in engine.ranks()]
        watch.environment_error = environment_in_logs(run_dir, ranks)
    if watch.environment_error is None and disk_full(run_dir):
        watch.environment_error = "disk full: the run directory's file system has no room left"


def _environment(watch: TrialWatch, exc: OSError, doing: str) -> None:
    """Record the machine's failure (the first one); anything else is our bug: raised."""
    cause = environment_error(exc, doing)
    if cause is None:
        raise exc
    watch.environment_error = watch.environment_error or cause


def _watch_loop(
    engine: Engine,
    cfg: EngineConfig,
    run_dir: Path,
    watch: TrialWatch,
    on_progress: Progress | None,
) -> None:
    timeout = usable_hang_timeout(cfg.hang_timeout, engine.poll_s, watch.notes)
    hang = watch.hang_watch = HangWatch(
        run_dir,
        cfg.world_size,
        timeout,
        busy=engine.busy,
        startup_grace_s=engine.startup_grace(timeout),
    )
    grace_until = None
    while engine.running():
        time.sleep(engine.poll_s)
        now = time.time()
        for failure in engine.poll(now):
            if watch.first_failure is None:
                watch.first_failure = _first_failure(failure.record)
                grace_until = now + failure.grace_s
        hang.poll(now)
        hang.note_activity(engine.activity())
        watch.stops.poll(engine.kernel_states(), now)
        if on_progress is not None:
            on_progress({"ranks": hang.snapshot(), "elapsed_s": now - engine.started_at})
        if grace_until is not None:
            if now > grace_until:
                engine.stop("killed")
        elif _hung(hang, watch.stops, timeout, now) and engine.live():
            # a hang needs a rank still there that stopped stepping: ranks that all ended
            # (the workload done) are not hung, however long the last step was ago
            _handle_hang(engine, hang, run_dir, watch, now)


def _hung(hang: HangWatch, stops: StopWatch, timeout: float, now: float) -> bool:
    """No step for the hang timeout (start-up: its grace), or before the first step a rank the
    kernel has shown stopped for the hang timeout (it cannot finish starting)."""
    if hang.stalled(now):
        return True
    return not hang.stepped and any(s > timeout for s in stops.stopped_for(now).values())


INTERRUPT_STALL_S = 1.0  # every rank this long without a step when Ctrl-C came: a stalled run


def _note_interrupt_stall(engine: Engine, run_dir: Path, watch: TrialWatch) -> None:
    """Ctrl-C on a run that had stopped stepping (before the hang timeout): take the stacks, as
    a hang would, so the verdict can name the rank the others were waiting for. The step files'
    mtimes say when each rank last stepped (the watch loop may not have begun: the reference
    is computed while the ranks already run)."""
    now = watch.interrupted_at or time.time()
    if watch.hang is not None or not engine.alive():
        return
    last = {}
    for p in engine.ranks():
        try:
            st = ev.rank_jsonl(run_dir, p.rank).stat()
        except OSError:
            return  # a rank that never stepped: start-up, not a stall
        if not st.st_size:
            return
        last[str(p.rank)] = st.st_mtime
    if not last or min(now - t for t in last.values()) < INTERRUPT_STALL_S:
        return
    stopped = set(watch.stops.stopped_for(now))
    hang = watch.hang_watch
    watch.interrupt_stall = ev.HangRecord(
        stalled_ranks=[p.rank for p in engine.alive()],
        last_progress=last,
        proc_status={str(r): s for r, s in watch.stops.last_status.items()},
        stopped_ranks=sorted(stopped),
        last_steps=hang.last_steps() if hang else {},
        idle_s={r: round(now - t, 3) for r, t in last.items()},
    )
    watch.stacks = _stacks(engine, run_dir, stopped)


def _handle_hang(
    engine: Engine, hang: HangWatch, run_dir: Path, watch: TrialWatch, now: float
) -> None:
    stopped = set(watch.stops.stopped_for(now))
    watch.hang = ev.HangRecord(
        stalled_ranks=[p.rank for p in engine.live()],
        last_progress=hang.last_progress(line_clock=engine.line_clock),
        proc_status={str(r): s for r, s in watch.stops.last_status.items()},
        stopped_ranks=sorted(stopped),
        last_steps=hang.last_steps(),
        detected_at=now,
        during_startup=not hang.stepped,
    )
    watch.stacks = _stacks(engine, run_dir, stopped)
    engine.stop("hung")


def _stacks(engine: Engine, run_dir: Path, stopped: set[int]) -> ev.StacksRecord:
    """The engine's own way to the stacks (its ranks on other machines), else ours."""
    taken = engine.dump_stacks(run_dir, stopped)
    if taken is not None:
        return taken
    return dump_rank_stacks(engine, run_dir, skip=stopped, fallback=engine.faulthandler)


def dump_rank_stacks(
    ranks: Any, run_dir: Path, skip: set[int] | None = None, fallback: bool = True
) -> ev.StacksRecord:
    """py-spy every live rank (`ranks.alive()`) in parallel under one deadline (a hung py-spy is
    killed); when any rank could not be dumped and the ranks have a faulthandler (`fallback`;
    SGLang's schedulers do not), fall back to it (SIGUSR1 -> stacks/rank{r}.txt) and record why,
    so the verdict can say it. `skip`: stopped ranks, which neither py-spy nor their own signal
    handler can answer for."""
    alive = [p for p in ranks.alive() if p.rank not in (skip or set())]
    error = _pyspy_dumps(alive, run_dir)
    if error is None or not fallback:
        return ev.StacksRecord("py-spy", error)
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    _wait_for_faulthandler(alive, run_dir)
    return ev.StacksRecord("faulthandler", error)


def _pyspy_dumps(alive: list[RankRecord], run_dir: Path) -> str | None:
    """Write stacks/rank{r}.json for every rank py-spy could dump; the errors of the others."""
    try:
        from hicache_diag.triage.pyspy import dump_stacks

        results = dump_stacks([p.pid for p in alive], deadline_s=STACK_DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - any py-spy failure means: use the fallback
        return f"{type(exc).__name__}: {exc}"
    errors = []
    for p in alive:
        res = results.get(p.pid)
        if res is not None and res.threads is not None:
            write_json(ev.stack_json(run_dir, p.rank), res.threads)
        else:
            errors.append(f"rank{p.rank}: {res.error if res else 'no dump'}")
    return "; ".join(errors) or None


def _wait_for_faulthandler(alive: list, run_dir: Path) -> None:
    """faulthandler writes from a C signal handler, even in a rank blocked inside gloo; wait
    until every signalled rank's file has content (bounded)."""
    deadline = time.time() + FAULTHANDLER_WAIT_S
    files = [ev.stack_txt(run_dir, p.rank) for p in alive]
    sizes: list[int] = []
    while time.time() < deadline:
        time.sleep(0.05)
        now = [_size(f) for f in files]
        if all(now) and now == sizes:
            return  # every file written and no longer growing (one block per thread)
        sizes = now


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def drop_empty_stack_files(run_dir: Path) -> None:
    """Every rank opens its faulthandler file at start; keep only the ones that were written."""
    for path in (run_dir / ev.STACKS).glob("rank*.txt"):
        if _size(path) == 0:
            path.unlink(missing_ok=True)


def write_launcher_json(run_dir: Path, engine: Engine, watch: TrialWatch, started: str) -> None:
    """launcher.json, the one writer: how each rank process ended and what the loop saw."""
    hang = watch.hang_watch
    oom_after = oom_kill_count()
    oom = None
    if watch.oom_kills_before is not None and oom_after is not None:
        oom = oom_after - watch.oom_kills_before  # OOM kills in our cgroup during this run
    record = ev.LauncherRecord(
        ranks=[rank_process(p) for p in engine.ranks()],
        first_failure=_first_failure(watch.first_failure),
        hang=watch.hang,
        stacks=watch.stacks or ev.StacksRecord(),
        interrupted=watch.interrupted,
        interrupted_at=watch.interrupted_at,
        interrupt_stall=watch.interrupt_stall,
        startup_error=watch.startup_error,
        interrupt_signal=watch.interrupt_signal,
        environment_error=watch.environment_error,
        notes=watch.notes,
        timings=watch.timings,
        oom_kills=oom,
        startup={
            "grace_s": hang.startup_grace_s if hang else None,
            "first_step_s": hang.startup_s() if hang else {},
        },
        last_steps=hang.last_steps() if hang else {},
        started_at=started,
        ended_at=ev.utc_now(),
        extra=engine.launcher_extra(),
    )
    write_json(run_dir / ev.LAUNCHER, record)


def _first_failure(record: ev.FirstFailure | None) -> ev.FirstFailure | None:
    """An engine's failure record (typed: trials/engine.py `Failure`)."""
    return record
