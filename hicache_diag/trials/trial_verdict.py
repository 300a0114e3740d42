"""The end of the one trial loop (trials/trial.py): the verdict judged from the run dir and
written last, whatever ended the run. A stop signal while judging gives the quick reading
(`fallback_verdict`) marked interrupted; verdict.json is written with the stop signals held
back, in the room `VerdictReserve` kept, and on a disk that has none left even then, as the
smallest verdict that still says why (`undecided`, the cause, no rank)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.evidence import files
from hicache_diag.evidence.verdict import CrashForm, Outcome, RankState, Verdict
from hicache_diag.rules.signatures import Context, crash_form
from hicache_diag.trials.engine import Engine, TrialWatch
from hicache_diag.trials.reference import compare_outputs
from hicache_diag.trials.signals import last_signal
from hicache_diag.trials.trial_guard import VerdictReserve, signals_deferred


def judge(run_dir: Path, engine: Engine, watch: TrialWatch, t0: float) -> Verdict:
    """The classifier's verdict, amended by the engine; interrupted when a stop signal comes
    while it reads (the ranks are reaped already: only the judging is cut short)."""
    try:
        verdict = engine.amend(_classify(run_dir, engine.tie_tolerance), watch)
    except KeyboardInterrupt:
        verdict = fallback_verdict(run_dir)
        by = last_signal() or "SIGINT"
        verdict.outcome, verdict.form = Outcome.INTERRUPTED, None
        verdict.failed_rank = verdict.culprit_rank = None
        verdict.signature = f"interrupted by {by} while the verdict was judged"
        verdict.evidence.insert(0, f"{verdict.signature}; every rank was reaped before")
    if watch.environment_error and verdict.outcome is not Outcome.UNDECIDED:
        # launcher.json may be what the full disk refused: the loop's own record decides
        _undecided(verdict, watch.environment_error)
    verdict.evidence += [f"note: {n}" for n in watch.notes if f"note: {n}" not in verdict.evidence]
    verdict.duration_s = round(time.time() - t0, 3)
    verdict.run_dir = str(run_dir)
    return verdict


def _undecided(verdict: Verdict, cause: str) -> None:
    """The environment failed the run: `undecided`, the cause, no rank and no form."""
    seen = verdict.outcome.value
    verdict.outcome, verdict.form = Outcome.UNDECIDED, None
    verdict.failed_rank = verdict.culprit_rank = None
    verdict.first_divergence = None
    verdict.signature = cause
    verdict.evidence.insert(
        0, f"{cause}: the tool's environment failed, not a rank; no rank is judged (read: {seen})"
    )


def write_verdict(run_dir: Path, verdict: Verdict, reserve: VerdictReserve) -> None:
    """verdict.json, last and whole: the reserve's room given back first; a disk with no room
    even then gets the smallest undecided verdict; failing that, the CLI still prints it."""
    path = run_dir / ev.VERDICT
    with signals_deferred(drop=True):  # the run is over: a late signal changes nothing
        reserve.release()
        try:
            verdict.write(path)
            return
        except OSError as exc:
            cause = f"could not write verdict.json: [Errno {exc.errno}] {exc.strerror}"
        small = Verdict(Outcome.UNDECIDED, signature=cause, evidence=[cause], seed=verdict.seed)
        small.run_dir = verdict.run_dir
        try:
            small.write(path)
        except OSError:
            pass
    _undecided(verdict, cause)


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
        lines = files.read_text(log, limit=1 << 20).splitlines()
    except (OSError, ValueError):
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
    if launcher.environment_error:
        v.outcome, v.signature = Outcome.UNDECIDED, launcher.environment_error
        v.evidence.append(f"{launcher.environment_error}: the environment failed, not a rank")
    elif launcher.first_failure:
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
