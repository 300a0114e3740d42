"""Hang vs busy vs healthy from stack samples, and the hang's cause and culprit.

Seed troubleshooting order, step 3: a protocol deadlock is one rank blocked in its scheduler
thread at a HiCache wait site while its peers wait for it in p2p or collectives (or ranks sit in
*different* collectives); a network suspect is every rank inside the same communication call,
symmetric, nobody outside; a straggler is one rank outside communication that the others wait for.
The rule itself is the rule book's (rules/culprit.py), which `run` applies to a run's stacks too;
this module turns samples into its inputs and its answer into rank reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.rules.culprit import (
    Judgement,
    RankView,
    Reason,
    judge,
    view_of,
)
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.rules.wait_sites import WaitKind
from hicache_diag.triage.report import RankReport

__all__ = ["HangFinding", "RankSamples", "analyse_rank", "classify_stacks"]

_IDLE_KINDS = frozenset({WaitKind.IDLE, WaitKind.REQUEST})


@dataclass(slots=True)
class RankSamples:
    """Everything collected for one rank: its dumps in time order, or why there are none."""

    rank: RankId
    pid: int | None = None
    title: str | None = None
    dumps: list[RankDump] = field(default_factory=list)
    error: str | None = None
    raw: list[list[dict[str, Any]]] = field(default_factory=list)  # py-spy JSON per sample
    native: RankDump | None = None  # the optional --native pass (stack tree only)
    cpu_fraction: float | None = None  # CPU seconds / wall seconds across the live samples
    fate: RankFate = RankFate.ALIVE  # a process fact from a run directory's launcher.json


@dataclass(frozen=True, slots=True)
class HangFinding:
    kind: str  # hang|busy|healthy|crash (a rank exited while its peers live)
    cause: str | None
    culprits: list[RankReport]
    evidence: list[str]
    reason: Reason = Reason.NONE


def stage_role(rank: RankId, pp_size: int, tp_size: int) -> str:
    if pp_size <= 1:
        role = "single stage"
    elif rank.pp == 0:
        role = "first stage (receives requests)"
    else:
        role = "last stage" if rank.pp == pp_size - 1 else "middle stage"
    if tp_size > 1:
        role += ", TP leader" if rank.tp == 0 else ", TP peer"
    return role


def _gone(rs: RankSamples) -> bool:
    return rs.error is not None and "no such process" in rs.error


def analyse_rank(rs: RankSamples, pp_size: int, tp_size: int) -> RankReport:
    role = stage_role(rs.rank, pp_size, tp_size)
    fate = RankFate.EXITED if _gone(rs) else rs.fate
    view = view_of(rs.rank, rs.dumps, fate, rs.cpu_fraction)
    if not rs.dumps:
        state = "exited" if view.fate is RankFate.EXITED else "unknown"
        report = RankReport(rs.rank, rs.pid, rs.title, role, state, None, error=rs.error)
        report.fate = view.fate
        return report
    last = rs.dumps[-1].main_thread()
    frames = [f.short for f in last.frames] if last else []
    if view.site is None:
        # A dump taken while the process exits (interpreter shutdown, SIGQUIT handler): a
        # post-mortem picture, never a live sample (never busy, never a wait site).
        note = "post-mortem: the dump was taken while the process was exiting"
        report = RankReport(rs.rank, rs.pid, rs.title, role, "exited", None, frames, error=note)
        report.fate = RankFate.EXITED
        return report
    if view.fate is RankFate.EXITED:
        state = "exited"  # it died between samples: its last stack is kept as evidence
    elif view.progressed or view.kind is WaitKind.COMPUTE:
        state = "running"
    else:
        state = "idle" if view.kind in _IDLE_KINDS else "blocked"
    return RankReport(
        rs.rank,
        rs.pid,
        rs.title,
        role,
        state,
        view.site,
        frames,
        error=rs.error,
        wait_kind=view.kind.value if view.kind else None,
        progressed=view.progressed,
        site_frame=view.frame,
        call_path=view.path,
        fate=view.fate,
        sample_kinds=tuple(k.value for k in view.sample_kinds),
    )


def _view(r: RankReport) -> RankView:
    """A report back into the rule's input (analyse_rank built it from one)."""
    fate = RankFate.EXITED if r.state == "exited" else r.fate
    kind = WaitKind(r.wait_kind) if r.wait_kind else None
    kinds = tuple(WaitKind(k) for k in r.sample_kinds)
    return RankView(r.rank, r.wait_site, kind, r.call_path, r.site_frame, fate, r.progressed, kinds)


def classify_stacks(reports: list[RankReport], hang_hint: bool) -> HangFinding | None:
    """The rule book's judgement (rules/culprit.py) of these ranks; None when no rank has a
    stack or a fate that names one. `hang_hint`: the logs already report a watchdog timeout."""
    found = judge([_view(r) for r in reports], hang_hint)
    return None if found is None else _finding(found, reports)


def _finding(found: Judgement, reports: list[RankReport]) -> HangFinding:
    by_rank = {r.rank: r for r in reports}
    culprits = [by_rank[rank] for rank in found.culprits]
    evidence = list(found.evidence)
    if found.reason is Reason.EXITED:  # the pid says which process is gone
        evidence = [
            f"{r.rank.label} (pid {r.pid}) has exited; its peers are still alive" for r in culprits
        ]
    return HangFinding(found.kind, found.cause, culprits, evidence, found.reason)
