"""Pure checks over a loaded run: each returns a Finding or None; classify composes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from hicache_diag import evidence as ev
from hicache_diag.diagnosis import rank_facts as facts
from hicache_diag.diagnosis import stacks as stk
from hicache_diag.diagnosis.divergence import Divergence, first_divergence
from hicache_diag.diagnosis.idle_slots import ran_past_last_line
from hicache_diag.diagnosis.load import RunData
from hicache_diag.diagnosis.outputs import compare_outputs
from hicache_diag.diagnosis.tracebacks import RankCrash, parse_crash
from hicache_diag.evidence.verdict import CrashForm, Outcome
from hicache_diag.rules.culprit import Reason, judge
from hicache_diag.rules.signatures import SHAPE_RE

LEAK_MIN_STEPS = 8
LEAK_MIN_FINAL = 8  # bounded sends stay at a handful; below this nothing is "without bound"


@dataclass(slots=True)
class Finding:
    outcome: Outcome
    form: CrashForm | None = None
    failed_rank: int | None = None
    culprit_rank: int | None = None
    signature: str | None = None
    evidence: list[str] = field(default_factory=list)
    # Named by a process fact (a signal death, a stopped rank, a rank the others wait on):
    # the divergence's culprit does not replace it.
    by_process_fact: bool = False


def _exited_cleanly(run: RunData) -> set[int]:
    ranks = run.launcher.ranks if run.launcher is not None else []
    # "finished": a real SGLang scheduler still serving when the workload completed (the
    # harness stops it then; it never exits by itself).
    return {
        int(r.rank)
        for r in ranks
        if (r.state == "exited" and r.exitcode == 0) or r.state == "finished"
    }


def rank_crashes(run: RunData) -> dict[int, RankCrash]:
    """Tracebacks in the logs of ranks that did not exit cleanly. A logged, handled exception on
    a rank that went on to exit 0 is not a crash; one its scheduler loop died of is, exit 0 or
    not: logged as `Scheduler hit an exception`, or the step it raised in recorded as crashed."""
    crashes = {}
    clean = _exited_cleanly(run)
    for rank, log in run.logs.items():
        crash = parse_crash(rank, log)
        if crash and rank in clean and not (crash.fatal or crash_record(run, rank)):
            crash = None
        if crash:
            crashes[rank] = crash
    return crashes


def _stage(run: RunData, rank: int) -> int | None:
    rows = run.rank_frames(rank)
    if not rows.empty and "pp" in rows.columns:
        return int(rows["pp"].iloc[0])
    for entry in run.manifest.topology_ranks:
        if int(entry.rank) == rank:
            return int(entry.pp)
    return None


def crash_record(run: RunData, rank: int) -> ev.StepRecord | None:
    """The partial line a rank wrote for the step that raised (`crashed: true`), if any."""
    rows = run.rank_frames(rank)
    if rows.empty or "crashed" not in rows.columns:
        return None
    hit = rows[rows["crashed"].map(lambda v: v is True)]
    if hit.empty:
        return None
    row = hit.iloc[-1].to_dict()  # the frame's NaN: a key this line did not have
    return ev.StepRecord.from_json({k: v for k, v in row.items() if not _nan(v)})


def _nan(value: object) -> bool:
    return isinstance(value, float) and value != value


def received_other_count(run: RunData, rank: int) -> tuple[int, int] | None:
    """(own extend tokens, tokens received from upstream) when they differ at the crash step."""
    rec = crash_record(run, rank)
    if rec is None or not _present_int(rec.proxy_tokens):
        return None
    mine, got = int(rec.extend_num_tokens or 0), int(rec.proxy_tokens)
    return (mine, got) if mine != got else None


def _present_int(value: object) -> bool:
    return isinstance(value, int | float) and value == value


def _tokens_disagree_with_upstream(run: RunData, rank: int) -> bool:
    """A downstream stage's own extend_num_tokens differ from its upstream stage's at its last
    step: the shape mismatch of form A, even when the op that noticed raised another text."""
    pp = _stage(run, rank)
    rows = run.rank_frames(rank)
    if not pp or rows.empty or "extend_num_tokens" not in rows.columns:
        return False
    last = int(rows["step"].max())
    frames = run.frames
    at = frames[(frames["step"] == last) & (frames["rank"] != rank)]
    if "pp" in at.columns:
        at = at[at["pp"] == pp - 1]
    mine = rows[rows["step"] == last]["extend_num_tokens"].iloc[0]
    return any(v != mine for v in at["extend_num_tokens"])


def _crash_time(run: RunData, crash: RankCrash, order: int) -> tuple[float, int]:
    first = run.launcher.first_failure if run.launcher is not None else None
    if first is not None and first.rank == crash.rank and first.t is not None:
        return float(first.t), order
    if crash.t is not None:
        return crash.t, order
    rows = run.rank_frames(crash.rank)
    if not rows.empty and "t" in rows.columns:
        return float(rows["t"].max()), order
    return float("inf"), order


def _form_of(run: RunData, crash: RankCrash) -> CrashForm | None:
    if crash.kind == "A":
        return CrashForm.A
    if crash.kind == "B":
        return CrashForm.B
    if crash.kind == "other" and "RuntimeError" in crash.signature:
        mismatch = received_other_count(run, crash.rank)
        if mismatch or _tokens_disagree_with_upstream(run, crash.rank):
            return CrashForm.A
    return None


def check_crash(run: RunData, crashes: dict[int, RankCrash] | None = None) -> Finding | None:
    """Root cause = the first non-cascade failure in time; survivors' gloo errors are secondary.
    A rank that died by a signal (no traceback) and ended first is the root cause itself.
    `crashes`: rank_crashes(run) when the caller already parsed the logs."""
    crashes = rank_crashes(run) if crashes is None else crashes
    deaths = facts.rank_deaths(run.launcher, set(crashes))
    first = facts.first_failed_rank(run.launcher)
    if deaths and (first in deaths or not crashes):
        return _death_finding(run, deaths[first if first in deaths else min(deaths)], crashes)
    if not crashes:
        return None
    if all(c.kind == "secondary" for c in crashes.values()):
        return _lost_peer_finding(run, crashes)
    finding = _traceback_finding(run, crashes)
    for death in deaths.values():
        finding.evidence.append(f"rank {death.rank} later {death.how}")
    return finding


def _death_finding(run: RunData, death: facts.RankDeath, crashes: dict[int, RankCrash]):
    """A rank that died without a traceback ended first: a crash of another form, that rank
    failed and culprit; every traceback on the survivors is what followed."""
    steps = run.rank_frames(death.rank)
    last = " before its first step"
    if not steps.empty:
        last = f" after step {int(steps['step'].max())}"
    lines = [f"rank {death.rank} {death.how}{last}; it ended first (launcher.json)"]
    for other in sorted(crashes.values(), key=lambda c: c.rank):
        what = "secondary (cascade)" if other.kind == "secondary" else "later, after it"
        lines.append(f"rank {other.rank} {what}: {other.signature}")
    signature = f"rank {death.rank} {death.how}"
    return Finding(Outcome.CRASH, None, death.rank, death.rank, signature, lines, True)


def _lost_peer_finding(run: RunData, crashes: dict[int, RankCrash]) -> Finding:
    """Only cascades (`Connection closed by peer`) and no recorded death: the root is a peer
    that ended without a trace. Named when exactly one rank is not among the survivors."""
    quiet = [r for r in run.ranks if r not in crashes]
    rank = quiet[0] if len(quiet) == 1 else None
    lines = [f"rank {c.rank} secondary (cascade): {c.signature}" for c in crashes.values()]
    if rank is None:
        lines.insert(0, "every traceback is a cascade; the rank that ended first left no trace")
        return Finding(Outcome.CRASH, signature=lines[1], evidence=lines)
    lines.insert(0, f"rank {rank} ended without a traceback; its peers lost the connection")
    return Finding(Outcome.CRASH, None, rank, rank, lines[0], lines)


def _traceback_finding(run: RunData, crashes: dict[int, RankCrash]) -> Finding:
    ordered = sorted(crashes.values(), key=lambda c: _crash_time(run, c, c.rank))
    primary = [c for c in ordered if c.kind != "secondary"] or ordered
    root = primary[0]
    form = _form_of(run, root)
    lines = [f"rank {root.rank} raised first: {root.signature}"]
    if root.where:
        lines.append(f"rank {root.rank} stopped in {root.where}")
    if form is CrashForm.A and (m := SHAPE_RE.search(root.text)):
        lines.append(
            f"form A: rank {root.rank} reshaped {m[3]} values received from upstream with its "
            f"own token count {m[1]} (head_dim {m[2]}): the stages built different batches"
        )
    elif form is CrashForm.A and (counts := received_other_count(run, root.rank)):
        lines.append(
            f"form A: rank {root.rank} computed {counts[0]} tokens but received {counts[1]} "
            "from upstream; the reshape happened to divide, so a later op raised"
        )
    elif form is CrashForm.A:
        lines.append(f"form A: rank {root.rank}'s extend_num_tokens disagree with upstream")
    if form is CrashForm.B:
        lines.append("form B: bookkeeping consumed an ack or entry this rank never had")
    for other in ordered:
        if other is not root:
            what = "secondary (cascade)" if other.kind == "secondary" else "later"
            lines.append(f"rank {other.rank} {what}: {other.signature}")
    return Finding(Outcome.CRASH, form, root.rank, root.rank, root.signature, lines)


class HangCulprit(NamedTuple):
    rank: int | None
    site: str | None  # where it is held, as the verdict names it
    by_process_fact: bool  # a stopped or exited rank, or one outside any wait on a peer
    reason: Reason = Reason.NONE


def _tp_size(run: RunData) -> int:
    return run.manifest.tp_size


def hang_rank(run: RunData, hang: ev.HangRecord) -> HangCulprit:
    """The rank the others wait for, from evidence only: the rule book's culprit
    (rules/culprit.py, the rule triage applies to the same stacks and process facts); when it
    names none, the rank that stopped progressing first; on a tie the one blocked receiving
    (it observes the missing message); else the first stalled rank."""
    tp_size = _tp_size(run)
    views = facts.rank_views(run.launcher, hang, run.stacks, tp_size)
    found = judge(list(views.values()), hang_hint=True)
    if found is not None and found.culprit is not None:
        rank = found.culprit.flat(tp_size)
        return HangCulprit(
            rank, _held_at(run, rank, found.reason), found.by_process_fact, found.reason
        )
    progress = {int(r): float(t) for r, t in (hang.last_progress or {}).items()}
    if progress:
        first = min(progress.values())
        earliest = sorted(r for r, t in progress.items() if t == first)
        if len(earliest) == 1:
            return HangCulprit(earliest[0], None, False)
        receiving = [r for r in earliest if r in run.stacks and stk.is_receiving(run.stacks[r])]
        return HangCulprit((receiving or earliest)[0], None, False)
    stalled = hang.stalled_ranks or []
    return HangCulprit(int(stalled[0]) if stalled else None, None, False)


def _held_at(run: RunData, rank: int, reason: Reason) -> str | None:
    if reason is Reason.STOPPED:
        return "stopped (kernel state T)"
    if reason is Reason.EXITED:
        return "exited (gone while its peers waited)"
    dump = run.stacks.get(rank)
    if dump is None:
        return None
    if reason in (Reason.OUTSIDE, Reason.OWN_WAIT):
        return stk.where(dump)
    return stk.hicache_wait(dump) if reason is Reason.HICACHE else None


def _stack_tool_lines(run: RunData) -> list[str]:
    """Say how the stacks were taken, and why py-spy was not enough when it was not."""
    tool = run.launcher.stacks if run.launcher is not None else ev.StacksRecord()
    error = tool.error or "reason not recorded"
    if not run.stacks:
        return [f"no stacks were saved ({error})"]
    if tool.tool == "faulthandler":
        return [
            f"py-spy could not dump every rank ({error}); stacks/rank*.txt are the ranks' "
            "own faulthandler dumps (SIGUSR1), main thread first"
        ]
    return []


def check_hang(run: RunData) -> Finding | None:
    hang = run.launcher.hang if run.launcher is not None else None
    if hang is None:
        return None
    rank, site, by_fact, reason = hang_rank(run, hang)
    stopped = facts.stopped_ranks(hang)
    lines = [f"no progress from ranks {hang.stalled_ranks} (hang detected)"]
    lines += facts.stop_lines(hang, stopped)
    gone = reason is Reason.EXITED
    if gone:
        lines.append(f"rank {rank} had exited when the hang was declared; its peers waited on it")
    elif by_fact and not stopped:
        lines.append(f"rank {rank} is not waiting on a peer ({site}); the others wait on it")
    elif site:
        lines.append(f"rank {rank} is blocked in {site} (a HiCache protocol wait)")
    for r in sorted(run.stacks):
        lines.append(f"rank {r} waits in {stk.where(run.stacks[r]) or 'an unreadable stack'}")
    lines.extend(_stack_tool_lines(run))
    at = site or (stk.where(run.stacks[rank]) if rank in run.stacks else None)
    verb = "is" if stopped or gone else "waits"
    signature = f"hang: no progress for the hang timeout; rank {rank} {verb}" + (
        f" in {at}" if at and not (stopped or gone) else f" {at}" if at else ""
    )
    return Finding(Outcome.HANG, CrashForm.C, rank, rank, signature, lines, by_fact)


def check_divergence(run: RunData) -> Divergence | None:
    return first_divergence(run.frames, ran_past_last_line(run.frames, run.stacks))


def check_wrong_output(run: RunData) -> Finding | None:
    mismatches = compare_outputs(run.outputs, run.reference, run.tie_tolerance)
    if not mismatches:
        return None
    lines = [f"{len(mismatches)} request(s) differ from the no-cache reference"]
    for m in mismatches[:5]:
        lines.append(f"{m.rid}: token {m.position} is {m.got}, reference {m.want}")
    first = mismatches[0]
    return Finding(Outcome.WRONG_OUTPUT, signature=f"wrong output for {first.rid}", evidence=lines)


def _grows_without_bound(series: list[float], min_ratio: float = 1.0) -> bool:
    if len(series) < LEAK_MIN_STEPS or series[-1] < LEAK_MIN_FINAL:
        return False
    if series[-1] < series[0] * min_ratio:
        return False
    quarter = max(1, len(series) // 4)
    return min(series[-quarter:]) > max(series[:quarter]) and series[-1] >= max(series) * 0.9


def check_leak(run: RunData) -> Finding | None:
    frames = run.frames
    # RSS wobbles by allocator noise, so it must also grow by half before it counts.
    for column, ratio in (("inflight_sends", 1.0), ("rss", 1.5)):
        if frames.empty or column not in frames.columns:
            continue
        for rank, rows in frames.groupby("rank"):
            series = [float(v) for v in rows[column].dropna()]
            if _grows_without_bound(series, ratio):
                line = f"rank {rank}: {column} grew from {series[0]:g} to {series[-1]:g}"
                return Finding(Outcome.LEAK, None, int(rank), int(rank), line, [line])
    return None
