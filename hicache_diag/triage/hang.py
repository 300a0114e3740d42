"""Hang vs busy vs healthy from stack samples, and the hang's cause and culprit.

Seed troubleshooting order, step 3: a protocol deadlock is one rank blocked in its scheduler
thread at a HiCache wait site while its peers wait for it in p2p or collectives (or ranks sit in
*different* collectives); a network suspect is every rank inside the same communication call,
symmetric, nobody outside; a straggler is one rank outside communication that the others wait for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hicache_diag.rules.wait_sites import (
    COMM_KINDS,
    HICACHE_KINDS,
    WaitKind,
    classify_thread,
    is_exiting,
)
from hicache_diag.triage.discover import RankId
from hicache_diag.triage.dumps import RankDump
from hicache_diag.triage.report import RankReport

_IDLE_KINDS = frozenset({WaitKind.IDLE.value, WaitKind.REQUEST.value})
_SEND_SITES = frozenset({"pp-send", "p2p-send"})
_KIND_RANK = {WaitKind.HICACHE_LOCAL.value: 0, WaitKind.HICACHE_COMM.value: 1}


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


@dataclass(frozen=True, slots=True)
class HangFinding:
    kind: str  # hang|busy|healthy
    cause: str | None
    culprits: list[RankReport]
    evidence: list[str]


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


# A rank using at least this share of one CPU between samples is going round, not stuck.
BUSY_CPU_FRACTION = 0.2


def analyse_rank(rs: RankSamples, pp_size: int, tp_size: int) -> RankReport:
    role = stage_role(rs.rank, pp_size, tp_size)
    if not rs.dumps:
        exited = rs.error is not None and "no such process" in rs.error
        state = "exited" if exited else "unknown"
        return RankReport(rs.rank, rs.pid, rs.title, role, state, None, error=rs.error)
    last = rs.dumps[-1].main_thread()
    frames = [f.short for f in last.frames] if last else []
    if is_exiting(last):
        # A dump taken while the process exits (interpreter shutdown, SIGQUIT handler): a
        # post-mortem picture, never a live sample (never busy, never a wait site).
        note = "post-mortem: the dump was taken while the process was exiting"
        return RankReport(rs.rank, rs.pid, rs.title, role, "exited", None, frames, error=note)
    sites = [classify_thread(d.main_thread()) for d in rs.dumps]
    progressed = None
    if len(rs.dumps) > 1:
        sigs = {d.main_thread().signature if d.main_thread() else () for d in rs.dumps}
        # Spinning between idle-poll lines is not progress; anything else that moved is.
        progressed = len(sigs) > 1 and not all(s.kind.value in _IDLE_KINDS for s in sites)
        if not progressed and (rs.cpu_fraction or 0.0) >= BUSY_CPU_FRACTION:
            # Same stack in every sample, yet burning CPU: a loop that goes round (an idle PP0
            # sending empty request lists to PP1 every slot), not a wait that never returns
            # (a blocked gloo wait sleeps on a condition variable and uses no CPU).
            progressed = True
    site = sites[-1]
    if rs.error and "no such process" in rs.error:
        state = "exited"  # it died between samples: its last stack is kept as evidence
    elif progressed or site.kind is WaitKind.COMPUTE:
        state = "running"
    else:
        state = "idle" if site.kind.value in _IDLE_KINDS else "blocked"
    return RankReport(
        rs.rank,
        rs.pid,
        rs.title,
        role,
        state,
        site.site,
        frames,
        error=rs.error,
        wait_kind=site.kind.value,
        progressed=progressed,
        site_frame=site.frame.short if site.frame else None,
        call_path=site.path,
    )


def _in_comm(r: RankReport) -> bool:
    return r.wait_kind in {k.value for k in COMM_KINDS}


def _pick_minority(ranks: list[RankReport]) -> list[RankReport]:
    """The rank group at the rarest site (HiCache-local first): the odd one out is the culprit."""
    counts = Counter(r.wait_site for r in ranks)
    site = min(
        counts,
        key=lambda s: (
            min(_KIND_RANK.get(r.wait_kind or "", 2) for r in ranks if r.wait_site == s),
            counts[s],
            min(r.rank.key for r in ranks if r.wait_site == s),
        ),
    )
    return sorted((r for r in ranks if r.wait_site == site), key=lambda r: r.rank.key)


def _symmetric(live: list[RankReport]) -> bool:
    """Same site reached by the same call path on every rank: one call, all inside it. The
    same site from different callers (writing_check vs can_terminate_prefetch) is a mismatch."""
    return len({r.wait_site for r in live}) == 1 and len({r.call_path for r in live}) == 1


def _hicache_hang(live: list[RankReport], hicache: list[RankReport]) -> HangFinding:
    if _symmetric(live) and all(r.wait_kind == WaitKind.HICACHE_COMM.value for r in live):
        msg = f"every rank is inside the same HiCache sync ({live[0].wait_site}), symmetric"
        return HangFinding("hang", "network-suspect", [], [msg])
    culprits = _pick_minority(hicache)
    if len({r.wait_site for r in hicache}) == 1 and len({r.call_path for r in hicache}) > 1:
        culprits = _pick_minority_path(hicache)
    others = sorted({r.wait_site or "?" for r in live if r not in culprits})
    lead = culprits[0]
    ev = [
        f"{lead.rank.label} is blocked at HiCache wait site {lead.wait_site} in its scheduler "
        f"thread ({lead.site_frame or '?'})",
        f"peers wait elsewhere: {', '.join(others)}" if others else "no peer shares its site",
    ]
    return HangFinding("hang", "protocol-deadlock", culprits, ev)


def _pick_minority_path(ranks: list[RankReport]) -> list[RankReport]:
    counts = Counter(r.call_path for r in ranks)
    path = min(
        counts, key=lambda p: (counts[p], min(r.rank.key for r in ranks if r.call_path == p))
    )
    return sorted((r for r in ranks if r.call_path == path), key=lambda r: r.rank.key)


def _comm_hang(live: list[RankReport], multi: bool) -> HangFinding:
    sites = {r.wait_site for r in live}
    busy_sites = {r.wait_site for r in live if r.wait_kind not in _IDLE_KINDS}
    if not multi and busy_sites <= _SEND_SITES and busy_sites != sites:
        # one snapshot: peers wait for requests while a stage flushes its sends (idle PP)
        return HangFinding("healthy", None, [], ["ranks wait for requests; a send completes"])
    senders = [r for r in live if r.wait_site in _SEND_SITES]
    askers = [r for r in live if r.wait_kind == WaitKind.REQUEST.value]
    if senders and askers:
        # A send only blocks until its receiver posts the matching recv: a peer waiting for
        # *requests* instead means the stages disagree on the micro-batch slot (#34568).
        culprits = _pick_minority(askers)
        ev = (
            f"{', '.join(r.rank.label for r in senders)} blocked sending while "
            f"{', '.join(r.rank.label for r in culprits)} waits for requests: the stages are in "
            "different micro-batch slots"
        )
        return HangFinding("hang", "protocol-deadlock", culprits, [ev])
    if len(sites) == 1 and len({r.call_path for r in live}) > 1:
        culprits = _pick_minority_path(live)
        ev = f"every rank is in {live[0].wait_site}, but reached from different callers"
        return HangFinding("hang", "protocol-deadlock", culprits, [ev])
    if len(sites) == 1 or sites & _SEND_SITES:
        ev = f"every rank is inside communication ({', '.join(sorted(map(str, sites)))}), "
        ev += "symmetric, no rank outside it"
        return HangFinding("hang", "network-suspect", [], [ev])
    waiting = [r for r in live if r.wait_kind != WaitKind.REQUEST.value] or live
    culprits = _pick_minority(waiting)
    ev = f"ranks sit in different communication calls: {', '.join(sorted(map(str, sites)))}"
    return HangFinding("hang", "protocol-deadlock", culprits, [ev])


def _holding_up(stuck: list[RankReport], confirmed: bool) -> HangFinding | None:
    """A rank outside any wait on a peer (asleep, computing, stuck in other code) while the
    others wait on a peer, e.g. PP0 draining its pp_sync sends that PP1 never receives: the
    rank they wait for is the culprit, not the one at the HiCache wait. Needs two samples or
    a logged timeout, since one snapshot of a computing stage is normal."""
    outside = [
        r for r in stuck
        if not _in_comm(r) and r.wait_kind not in _IDLE_KINDS
        and r.wait_kind != WaitKind.HICACHE_LOCAL.value
    ]  # fmt: skip
    waiting = [r for r in stuck if _in_comm(r) and r.wait_kind != WaitKind.REQUEST.value]
    if not (confirmed and outside and waiting):
        return None
    ev = [
        f"{r.rank.label} is outside any wait on a peer ({r.wait_site}) while "
        f"{', '.join(w.rank.label for w in waiting)} wait(s) on a peer ({waiting[0].wait_site})"
        for r in outside
    ]
    return HangFinding("hang", "straggler", outside, ev + ["the others wait for it"])


def classify_stacks(reports: list[RankReport], hang_hint: bool) -> HangFinding | None:
    """None when no rank has a stack. `hang_hint`: the logs already report a watchdog timeout."""
    live = [r for r in reports if r.wait_site is not None]
    if not live:
        return None
    multi = any(r.progressed is not None for r in live)
    # A rank computing in every sample is working even if py-spy caught the same line twice.
    moving = [r for r in live if r.progressed or (multi and r.wait_kind == "compute")]
    stuck = [r for r in live if not r.progressed]
    hicache = [r for r in stuck if r.wait_kind in {k.value for k in HICACHE_KINDS}]
    if moving and not hang_hint:
        return _busy(live, moving)
    holding = _holding_up(stuck, multi or hang_hint)
    if holding is not None:
        return holding
    if hicache:
        return _hicache_hang(live, hicache)
    if all(r.wait_kind in _IDLE_KINDS for r in live):
        if hang_hint:
            return HangFinding(
                "hang", None, [], ["every rank waits for requests, yet logs time out"]
            )
        return HangFinding("healthy", None, [], ["every rank is idle, waiting for requests"])
    outside = [r for r in live if not _in_comm(r) and r.wait_kind not in _IDLE_KINDS]
    if outside and len(outside) < len(live):
        ev = [
            f"{r.rank.label} is outside communication ({r.wait_site}); peers wait" for r in outside
        ]
        if multi or hang_hint:
            return HangFinding("hang", "straggler", outside, ev + ["it made no progress"])
        return HangFinding("busy", None, [], ["one snapshot: a stage computes while peers wait"])
    if outside and hang_hint:
        ev = "every rank is outside communication, yet the logs report a timeout (device/kernel?)"
        return HangFinding("hang", None, [], [ev])
    if outside:
        return HangFinding("busy", None, [], ["every rank is computing"])
    return _comm_hang(live, multi or hang_hint)


def _busy(live: list[RankReport], moving: list[RankReport]) -> HangFinding:
    ev = [f"{len(moving)}/{len(live)} ranks progressed between samples"]
    # A stage computing while its peers wait is a pipeline at work; a rank that sleeps, waits
    # on a lock or the device while everyone else waits (for it or for work) is a straggler.
    outside = [r for r in live if not _in_comm(r) and r.wait_kind in ("other", "device")]
    waiting = [r for r in live if _in_comm(r) or r.wait_kind in _IDLE_KINDS]
    if len(outside) == 1 and len(waiting) == len(live) - 1:
        ev.append(f"{outside[0].rank.label} is the only rank outside communication")
        return HangFinding("busy", "straggler", outside, ev)
    return HangFinding("busy", None, [], ev)
