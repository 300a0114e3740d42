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
from hicache_diag.evidence.verdict import CrashForm, Outcome, RankState, Verdict
from hicache_diag.rules.signatures import Context, crash_form
from hicache_diag.trials.engine import (
    Engine,
    EngineConfig,
    Progress,
    RankRecord,
    TrialWatch,
    rank_process,
)
from hicache_diag.trials.hang_watch import HangWatch
from hicache_diag.trials.proc_facts import StopWatch, oom_kill_count
from hicache_diag.trials.reference import compare_outputs
from hicache_diag.trials.rundir import prepare_run_dir, utc_now, write_json, write_manifest
from hicache_diag.trials.signals import restore_sigterm, trap_sigterm

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
    """One run, start to verdict. SIGINT/SIGTERM end it early: every rank is reaped and the
    verdict (outcome `interrupted`, exit 130) is still written, with the evidence so far."""
    torch.set_num_threads(1)  # the reference shares 2 cores with the ranks; threads only thrash
    run_dir = prepare_run_dir(cfg.out, cfg.seed)
    engine.prepare(run_dir)
    write_manifest(run_dir, engine.manifest(argv or []))
    started, t0 = utc_now(), time.time()
    watch = TrialWatch(oom_kills_before=oom_kill_count())
    old = trap_sigterm()
    try:
        engine.start()
        engine.wait_ready(watch, on_progress)
        engine.drive()
        _watch_loop(engine, cfg, run_dir, watch, on_progress)
        if watch.first_failure is None and watch.hang is None:
            engine.drained(watch)
    except KeyboardInterrupt:
        watch.interrupted, watch.interrupted_at = True, time.time()
        try:
            _note_interrupt_stall(engine, run_dir, watch)
        except KeyboardInterrupt:  # a second Ctrl-C: reap at once, without the stacks
            pass
    except EngineStartError as exc:  # a run that never started: the environment's failure
        watch.startup_error = str(exc)
    finally:
        try:
            engine.close(watch)
        except KeyboardInterrupt:  # a second Ctrl-C while reaping: reap anyway
            engine.close(watch)
        restore_sigterm(old)
        drop_empty_stack_files(run_dir)
        engine.finish_evidence(watch)
        write_launcher_json(run_dir, engine, watch, started)
    verdict = engine.amend(_classify(run_dir, engine.tie_tolerance), watch)
    verdict.duration_s = round(time.time() - t0, 3)
    verdict.run_dir = str(run_dir)
    verdict.write(run_dir / ev.VERDICT)
    return TrialResult(verdict, run_dir)


def _watch_loop(
    engine: Engine,
    cfg: EngineConfig,
    run_dir: Path,
    watch: TrialWatch,
    on_progress: Progress | None,
) -> None:
    hang = watch.hang_watch = HangWatch(
        run_dir,
        cfg.world_size,
        cfg.hang_timeout,
        busy=engine.busy,
        startup_grace_s=engine.startup_grace(cfg.hang_timeout),
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
        elif _hung(hang, watch.stops, cfg.hang_timeout, now):
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


def _classify(run_dir: Path, tie_tolerance: float | None = None) -> Verdict:
    """The diagnosis classifier; our minimal one if it fails (a checker that crashes must not
    crash the run: Jepsen's check-safe). `tie_tolerance`: the engine's."""
    from hicache_diag.diagnosis.classify import classify_run  # lazy: pandas, see diagnosis/

    try:
        return classify_run(run_dir, None if tie_tolerance is None else lambda _: tie_tolerance)
    except Exception as exc:  # noqa: BLE001
        verdict = fallback_verdict(run_dir)
        verdict.evidence.append(f"classifier failed ({type(exc).__name__}: {exc}); fallback used")
        return verdict


def _read_json(path: Path, default: Any = None) -> Any:
    try:
        return ev.read_json(path)
    except (OSError, ValueError):
        return default


def _read_record(kind: type[ev.Record], path: Path) -> Any:
    """The file's record; an empty one when it is missing or torn (the fallback's best)."""
    try:
        return ev.read_record(kind, path)
    except (OSError, ValueError):
        return kind()


def _last_error_line(log: Path) -> str | None:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [ln.strip() for ln in lines if ln and not ln.startswith((" ", "[", "Traceback"))]
    return errors[-1] if errors else None


def _count_steps(run_dir: Path) -> int:
    try:
        with open(ev.rank_jsonl(run_dir, 0), "rb") as fh:
            return sum(1 for _ in fh)
    except OSError:
        return 0


def fallback_verdict(run_dir: Path) -> Verdict:
    """Minimal classification: hang / crash (A, B by signature) / wrong-output / ok."""
    launcher = _read_record(ev.LauncherRecord, run_dir / ev.LAUNCHER)
    manifest = _read_record(ev.Manifest, run_dir / ev.MANIFEST)
    ranks = [RankState(r.rank, r.pp, r.tp, r.pid, r.state) for r in launcher.ranks]
    v = Verdict(Outcome.OK, ranks=ranks, seed=manifest.seed, steps=_count_steps(run_dir))
    v.device = manifest.ran_on
    if launcher.first_failure:
        rank = launcher.first_failure.rank
        sig = _last_error_line(ev.rank_log(run_dir, rank))
        v.outcome, v.failed_rank, v.culprit_rank, v.signature = Outcome.CRASH, rank, rank, sig
        # The rule book (rules.signatures); our runtime is always a PP pipeline with HiCache.
        form = crash_form(sig, (), Context(pp=True, hicache=True)) if sig else None
        v.form = CrashForm(form) if form else None
        v.evidence.append(f"rank {rank} failed first: {sig}")
    elif launcher.hang:
        v.outcome, v.form = Outcome.HANG, CrashForm.C
        v.evidence.append(f"no rank progressed; stalled: {launcher.hang.stalled_ranks}")
    else:
        outputs = _read_json(run_dir / ev.OUTPUTS, {})
        problems = compare_outputs(outputs, _read_json(run_dir / ev.REFERENCE, {}))
        if problems:
            v.outcome = Outcome.WRONG_OUTPUT
            v.evidence.extend(problems[:10])
    return v
