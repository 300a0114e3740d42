"""classify_run: compose the checks over a run directory into one Verdict (docs/design.md §4)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.diagnosis import checks, rank_facts
from hicache_diag.diagnosis import stacks as stk
from hicache_diag.diagnosis.consensus import consensus_lines
from hicache_diag.diagnosis.divergence import Divergence, lone_local_input
from hicache_diag.diagnosis.ledger import ledger_lines
from hicache_diag.diagnosis.load import RunData, load_run
from hicache_diag.diagnosis.outputs import TieTolerance
from hicache_diag.diagnosis.recorder_health import blind_recorder_reason, recorder_errors
from hicache_diag.diagnosis.storage import storage_fault_lines
from hicache_diag.evidence.verdict import CrashForm, Outcome, RankState, Verdict

_LAUNCH_STATE = {
    "hung": "blocked",
    "exited": "exited",
    "crashed": "crashed",
    "killed": "killed",
    "finished": "exited",
    "stopped": "blocked",
}


def _safe(name: str, check: Callable[[RunData], Any], run: RunData, notes: list[str]) -> Any:
    """Jepsen's check-safe: a check that breaks says 'unknown' instead of breaking the verdict."""
    try:
        return check(run)
    except Exception as exc:  # noqa: BLE001 - any failure of one check is reported, not raised
        notes.append(f"check {name}: unknown ({type(exc).__name__}: {exc})")
        return None


def _rank_entries(run: RunData) -> list[ev.RankProcess]:
    """The launched processes; without launcher.json, the manifest's topology (or one stage a
    rank), each as a process that exited."""
    if run.launcher is not None and run.launcher.ranks:
        return run.launcher.ranks
    topo = [ev.RankProcess(t.rank, t.pp, t.tp) for t in run.manifest.topology_ranks]
    return topo or [ev.RankProcess(r, r, 0) for r in run.ranks]


def _rank_states(run: RunData, crashes: dict) -> list[RankState]:
    states = []
    hang = run.launcher.hang if run.launcher is not None else None
    stopped = set(rank_facts.stopped_ranks(hang))
    for entry in _rank_entries(run):
        rank = int(entry.rank)
        state = _LAUNCH_STATE.get(entry.state or "", entry.state or "exited")
        crash = crashes.get(rank)
        where = crash.where if crash else None
        if rank in run.stacks:
            where = stk.where(run.stacks[rank]) or where
        if crash and state == "exited":
            state = "crashed"
        if rank in stopped:
            state, where = "stopped", "kernel state T (SIGSTOP or a debugger)"
        elif entry.state == "crashed" and entry.signal and not crash:
            state, where = "killed", f"by {rank_facts.signal_label(entry.signal)}"
        pp, tp = int(entry.pp), int(entry.tp)
        states.append(RankState(rank, pp, tp, entry.pid, state, where, entry.node, entry.host))
    return states


def _epoch(value: Any) -> float | None:
    """launcher.json times: epoch seconds or UTC ISO strings."""
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _duration(run: RunData) -> float:
    launcher = run.launcher or ev.LauncherRecord()
    start, end = _epoch(launcher.started_at), _epoch(launcher.ended_at)
    if start is not None and end is not None:
        return max(0.0, end - start)
    frames = run.frames
    if not frames.empty and "t" in frames.columns and frames["t"].notna().any():
        return float(frames["t"].max() - frames["t"].min())
    return 0.0


def _pick(finding: checks.Finding | None, div: Divergence | None, rest: list) -> checks.Finding:
    """Crash > hang > wrong output > latent divergence > leak > ok."""
    if finding:
        return finding
    wrong, leak = rest
    if wrong:
        return wrong
    if div:
        return checks.Finding(
            Outcome.DIVERGED,
            failed_rank=div.culprit_rank,
            culprit_rank=div.culprit_rank,
            signature=f"ranks disagree on {div.first.field} at step {div.first.step}",
        )
    return leak or checks.Finding(Outcome.OK)


_KEEP_CULPRIT = frozenset({Outcome.LEAK, Outcome.INTERRUPTED, Outcome.UNDECIDED})


def _settle(run: RunData, found: checks.Finding) -> checks.Finding:
    """An interrupted run is `interrupted` whatever it had shown so far; `ok` needs a run that
    finished: launcher.json written, steps recorded, outputs saved. Anything less cannot
    decide (a CLI killed mid-run, a run that never stepped, a torn copy of a run dir)."""
    seen = "no failure" if found.outcome is Outcome.OK else found.outcome.value
    if run.launcher is not None and run.launcher.environment_error:
        return _environment_failed(run.launcher.environment_error, seen, found)
    if run.launcher is not None and run.launcher.interrupted:
        by = run.launcher.interrupt_signal or "SIGINT/SIGTERM"
        lines = [f"interrupted by {by}; every rank reaped; so far: {seen}"]
        stalled = _stalled_at_interrupt(run)
        signature = f"interrupted by {by}" + (f"; {stalled}" if stalled else "")
        return checks.Finding(
            Outcome.INTERRUPTED,
            signature=signature,
            evidence=lines + ([stalled] if stalled else []) + found.evidence,
        )
    if run.budget is not None:
        # Whatever followed (requests without output, a stage left waiting) is our limit's doing.
        b = run.budget
        line = (
            f"step budget exhausted after {b.steps} steps (--max-steps "
            f"{b.max_steps}; {b.unfinished_requests} request(s) unfinished)"
        )
        return checks.Finding(
            Outcome.UNDECIDED,
            signature=line,
            evidence=[line, "raise --max-steps to let the run finish; nothing here is a verdict"],
        )
    if found.outcome is not Outcome.OK:
        return found
    reasons = []
    if run.launcher is None:
        reasons.append("launcher.json is missing: the run never finished (the CLI was killed?)")
    if run.frames.empty:
        reasons.append("no rank recorded a step")
    if run.outputs is None:
        reasons.append("outputs.json is missing: PP0 never finished its requests")
    errors = (run.requests or {}).get("errors") or {}
    if isinstance(errors, dict) and errors:
        rid, why = next(iter(sorted(errors.items())))
        reasons.append(f"{len(errors)} request(s) got no answer from the server ({rid}: {why})")
    blind = blind_recorder_reason(run.frames, run.ranks, run.outputs)
    if blind:
        reasons.append(blind)
    if not reasons:
        return _with_aborts(run, found)
    return checks.Finding(Outcome.UNDECIDED, signature=reasons[0], evidence=reasons)


def _environment_failed(cause: str, seen: str, found: checks.Finding) -> checks.Finding:
    """The machine failed the run (a full disk, EIO: launcher.json `environment_error`):
    `undecided`, the cause, no rank judged, whatever the ranks showed as they died of it."""
    line = f"{cause}: the tool's environment failed, not a rank; no rank is judged (so far: {seen})"
    return checks.Finding(Outcome.UNDECIDED, signature=cause, evidence=[line, *found.evidence])


def _with_aborts(run: RunData, found: checks.Finding) -> checks.Finding:
    """Requests the server answered with its own abort (a waiting timeout) are replies, not
    lost answers: said in the evidence, compared with nothing."""
    aborted = (run.requests or {}).get("aborted") or {}
    if not isinstance(aborted, dict) or not aborted:
        return found
    rid, why = next(iter(sorted(aborted.items())))
    line = f"{len(aborted)} request(s) aborted by the server itself ({rid}: {why}): no output"
    return replace(found, evidence=[*found.evidence, line])


def _stalled_at_interrupt(run: RunData) -> str | None:
    """The rank the others were waiting for when the user pressed Ctrl-C on a run that had
    stopped stepping (trials/trial.py takes the stacks then, as for a hang)."""
    stall = run.launcher.interrupt_stall if run.launcher is not None else None
    if stall is None:
        return None
    rank, site, _, _ = checks.hang_rank(run, stall)
    if rank is None:
        return None
    idle = (stall.idle_s or {}).get(str(rank))
    since = f"no step for {idle:.1f} s" if isinstance(idle, (int, float)) else "no new step"
    at = f"; it was in {site}" if site else ""
    return f"rank {rank} had stopped stepping ({since} when interrupted){at}"


def _faults_line(run: RunData) -> list[str]:
    """The faults asked for and whether each fired (the step records' `faults_fired`), beside
    the verdict for context; never used to pick a rank. A fault that never fired was asked
    for, not injected."""
    faults = [str(f) for f in run.manifest.faults or []]
    if not faults:
        return []
    if run.frames.empty or "faults_fired" not in run.frames.columns:
        return [f"faults asked for: {', '.join(faults)} (whether they fired was not recorded)"]
    fired: set[str] = set()
    for entries in run.frames["faults_fired"].dropna():
        for entry in entries if isinstance(entries, list) else []:
            fired.add(str(entry.get("fault", "?")) if isinstance(entry, dict) else str(entry))
    out = []
    if shown := [f for f in faults if f.split(":", 1)[0].strip() in fired]:
        out.append(f"faults injected: {', '.join(shown)}")
    if never := [f for f in faults if f not in shown]:
        out.append(f"faults asked for that never fired: {', '.join(never)}")
    return out


def _sum_map(values: Any) -> int:
    return sum(int(v) for m in values if isinstance(m, dict) for v in m.values() if v)


def cache_counts(run: RunData) -> dict[str, dict[str, int]]:
    """What the HiCache tiers did per rank, from the recorded steps (tokens): prefix reuse
    (device and host hits), of it from host, evicted, loaded back, written back."""
    frames, out = run.frames, {}
    if frames.empty:
        return out
    for rank, rows in frames.groupby("rank"):
        out[str(int(rank))] = {
            "prefix_hit": _sum_map(_column(rows, "prefix_len")),
            "host_hit": _sum_map(_column(rows, "host_hit_len")),
            **{k: int(sum(v for v in _column(rows, k) if v == v and v)) for k in _COUNTED},
        }
    return out


def _column(rows: Any, name: str) -> Any:
    return rows[name] if name in rows.columns else []


_COUNTED = ("evicted", "load_backs", "write_backs")


def set_aside_reaping(run: RunData, crashes: dict) -> tuple[RunData, dict, list[str]]:
    """Once our hang watch declared a hang (no rank had failed before it), the tool dumps and
    then reaps every rank: a stalled rank that dies then (our SIGKILL, or a py-spy killed at its
    deadline) and a peer that logs the lost connection are the reaping, never a rank's crash.
    Returns the run with those ranks marked hung, the tracebacks left, and what was set aside."""
    launcher = run.launcher
    if launcher is None or launcher.hang is None or launcher.first_failure is not None:
        return run, crashes, []
    lines, kept = [], {}
    for rank, crash in sorted(crashes.items()):
        if crash.kind == "secondary":
            lines.append(
                f"rank {rank} logged a lost peer while the tool reaped the hung ranks "
                f"(reaping, not a crash): {crash.signature}"
            )
        else:
            kept[rank] = crash
    entries = [_reaped(entry, launcher.hang, kept, lines) for entry in launcher.ranks]
    if not lines:
        return run, crashes, []
    return replace(run, launcher=replace(launcher, ranks=entries)), kept, lines


def _reaped(entry: ev.RankProcess, hang: ev.HangRecord, kept: dict, lines: list[str]):
    """The rank's record, marked hung when it died of the reaping after the hang."""
    detected, ended = _epoch(hang.detected_at), _epoch(entry.ended_at)
    stalled = {int(r) for r in hang.stalled_ranks or ()}
    reaped = detected is None or ended is None or ended >= detected
    if entry.state != "crashed" or entry.rank not in stalled or entry.rank in kept or not reaped:
        return entry
    how = f"signal {entry.signal}" if entry.signal else "its exit"
    lines.append(
        f"rank {entry.rank} ended ({how}) while the tool reaped the hung ranks, after the "
        "hang was declared: reaping, not a crash"
    )
    return replace(entry, state="hung")


def verdict_from(run: RunData) -> Verdict:
    notes: list[str] = []
    # Parse the rank logs once; when that failed, check_crash retries and reports it itself.
    parsed = _safe("tracebacks", checks.rank_crashes, run, notes)
    run, parsed, reaping = set_aside_reaping(run, parsed) if parsed is not None else (run, None, [])
    crashes = parsed or {}
    crash = _safe("crash", lambda r: checks.check_crash(r, parsed), run, notes)
    hang = None if crash else _safe("hang", checks.check_hang, run, notes)
    div = _safe("divergence", checks.check_divergence, run, notes)
    wrong = _safe("outputs", checks.check_wrong_output, run, notes)
    leak = _safe("leak", checks.check_leak, run, notes)
    found = _settle(run, _pick(crash or hang, div, [wrong, leak]))
    culprit = found.culprit_rank
    if div and div.culprit_rank is not None and found.outcome not in _KEEP_CULPRIT:
        if not found.by_process_fact:
            culprit = div.culprit_rank  # the rank whose local input made the decisions diverge
    evidence = list(found.evidence) + reaping + (div.evidence if div else [])
    if div is None and found.outcome in (Outcome.CRASH, Outcome.HANG):
        lone = None if found.by_process_fact else lone_local_input(run.frames)
        if lone is not None:
            culprit = lone[0]  # the waiter or the rank that raised is where it ended, not why
            evidence.append(lone[2])
    evidence += _safe("storage", lambda r: storage_fault_lines(r.frames), run, notes) or []
    evidence += _safe("consensus", lambda r: consensus_lines(r.logs), run, notes) or []
    evidence += _safe("ledger", lambda r: ledger_lines(r.frames), run, notes) or []
    if found.outcome is Outcome.CRASH and found.form is None:
        evidence.append("crash is neither form A nor B: a crash of another form")
    evidence += _faults_line(run)
    errors = _safe("recorder", lambda r: recorder_errors(r.frames), run, notes) or {}
    if errors:
        counts = ", ".join(f"rank {r}: {n}" for r, n in sorted(errors.items()))
        evidence.append(f"recorder errors (steps not recorded): {counts}")
    return Verdict(
        outcome=found.outcome,
        form=found.form,
        failed_rank=found.failed_rank,
        culprit_rank=culprit,
        signature=found.signature,
        first_divergence=div.first if div else None,
        ranks=_safe("ranks", lambda r: _rank_states(r, crashes), run, notes) or [],
        evidence=evidence + notes + [f"missing: {m}" for m in run.missing],
        seed=run.manifest.seed,
        steps=int(run.frames["step"].max()) + 1 if not run.frames.empty else 0,
        duration_s=round(_duration(run), 3),
        run_dir=str(run.run_dir),
        cache=_safe("cache", cache_counts, run, notes) or {},
        recorder_errors=errors,
        device=run.manifest.ran_on,
    )


def classify_run(run_dir: Path, tie_tolerance: TieTolerance | None = None) -> Verdict:
    """Classify a finished run from its directory alone (docs/design.md §4). Raises
    RunDirError when the directory holds nothing to classify. `tie_tolerance`: the run's
    engine's, by the manifest's engine name (else diagnosis's default)."""
    return verdict_from(load_run(run_dir, tie_tolerance))


__all__ = ["classify_run", "verdict_from", "CrashForm"]
