"""The hang's culprit, one rule for `run` (diagnosis/checks.py) and `triage` (triage/hang.py).

Input: per rank, where its main thread waits (the wait-site table, rules/wait_sites.py) and
what its process did (alive, exited, stopped). Order (docs/design.md §5):
1. a rank the kernel showed stopped (SIGSTOP, a debugger) holds up its peers;
2. a rank that exited while its peers live is the one they lost;
3. the stacks: progress between samples is work, not a hang; a rank outside any wait on a peer
   (asleep, computing, on a lock) while the others wait on one is a straggler; a rank at a
   HiCache wait the others are not at (its own DMA or storage thread first) is a protocol
   deadlock; ranks in different communication calls, or one call reached from different
   callers, are one too (the rarest site names the culprit); every rank inside the same call,
   symmetric, is a network suspect with no culprit.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.rules.wait_sites import (
    COMM_KINDS,
    HICACHE_KINDS,
    WaitKind,
    classify_thread,
    is_exiting,
)


class Reason(str, enum.Enum):
    """Why the culprit is the culprit."""

    STOPPED = "stopped"
    EXITED = "exited"
    OUTSIDE = "outside-any-wait"  # not waiting on a peer while the others wait on it
    OWN_WAIT = "own-wait"  # at a HiCache-local wait (its own DMA or storage thread)
    HICACHE = "hicache-wait"  # at a HiCache sync point its peers are not at
    MISMATCH = "comm-mismatch"  # a different call, caller or micro-batch slot than its peers
    # Not at the CUDA host sync where its TP peers wait for the collective they launched
    NCCL_ABSENT = "absent-from-collective"
    NONE = "none"  # no rank stands out (symmetric, idle, every rank computing, progress)


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank as the rule sees it. `site` is None when no live stack was read."""

    rank: RankId
    site: str | None = None  # the wait site of its main thread at the last sample
    kind: WaitKind | None = None
    path: tuple[str, ...] = ()  # function names from the site's frame outwards
    frame: str | None = None  # the frame that named the site, `func (file)`
    fate: RankFate = RankFate.ALIVE
    progressed: bool | None = None  # its stack moved between samples; None: one sample
    sample_kinds: tuple[WaitKind, ...] = ()  # the site kind of every sample, oldest first

    @property
    def in_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def idle(self) -> bool:
        return self.kind in _IDLE


@dataclass(frozen=True, slots=True)
class Judgement:
    kind: str  # hang|busy|healthy|crash (a rank exited)
    cause: str | None  # protocol-deadlock|network-suspect|straggler
    culprits: tuple[RankId, ...]  # the culprit first; more at the same site
    evidence: tuple[str, ...]
    reason: Reason = Reason.NONE

    @property
    def culprit(self) -> RankId | None:
        return self.culprits[0] if self.culprits else None

    @property
    def by_process_fact(self) -> bool:
        """Named by what a process did or where it sits, not by a site the others lack: a
        stopped or exited rank, or one outside any wait on a peer while peers wait on it."""
        return self.reason in (Reason.STOPPED, Reason.EXITED, Reason.OUTSIDE, Reason.OWN_WAIT)


_IDLE = frozenset({WaitKind.IDLE, WaitKind.REQUEST})
# asleep, on a lock, on its device
_OUTSIDE = frozenset({WaitKind.OTHER, WaitKind.DEVICE, WaitKind.CUDA_SYNC})
_SEND_SITES = frozenset({"pp-send", "p2p-send"})
_KIND_RANK = {WaitKind.HICACHE_LOCAL: 0, WaitKind.HICACHE_COMM: 1}
# A rank using at least this share of one CPU between samples is going round, not stuck.
BUSY_CPU_FRACTION = 0.2


def view_of(
    rank: RankId,
    dumps: Sequence[RankDump],
    fate: RankFate = RankFate.ALIVE,
    cpu_fraction: float | None = None,
) -> RankView:
    """A rank's samples (oldest first) and process fate -> its view. A main thread inside
    interpreter shutdown or SGLang's exit path is a post-mortem picture: exited, no site."""
    if not dumps:
        return RankView(rank, fate=fate)
    if is_exiting(dumps[-1].main_thread()):
        return RankView(rank, fate=RankFate.EXITED)
    sites = [classify_thread(d.main_thread()) for d in dumps]
    progressed = None
    if len(dumps) > 1:
        sigs = {m.signature if (m := d.main_thread()) else () for d in dumps}
        # Spinning between idle-poll lines is not progress; anything else that moved is.
        progressed = len(sigs) > 1 and not all(s.kind in _IDLE for s in sites)
        # A CUDA host sync spin-waits by default (a core at 100% while the stream is stuck):
        # its CPU is no sign of progress.
        spinning = sites[-1].kind is WaitKind.CUDA_SYNC
        if not progressed and not spinning and (cpu_fraction or 0.0) >= BUSY_CPU_FRACTION:
            # Same stack in every sample, yet burning CPU: a loop that goes round (an idle PP0
            # sending empty request lists to PP1 every slot), not a wait that never returns
            # (a blocked gloo wait sleeps on a condition variable and uses no CPU).
            progressed = True
    site = sites[-1]
    frame = site.frame.short if site.frame else None
    kinds = tuple(s.kind for s in sites)
    return RankView(rank, site.site, site.kind, site.path, frame, fate, progressed, kinds)


def judge(views: Sequence[RankView], hang_hint: bool) -> Judgement | None:
    """The culprit and why; None when no rank has a stack and no process fact names one.
    `hang_hint`: evidence besides the stacks says it hangs (a run's hang watch, a logged
    watchdog timeout), so one snapshot is enough to blame a rank outside any wait."""
    stopped = [v.rank for v in views if v.fate is RankFate.STOPPED]
    if stopped:
        ev = [f"{r.label} is stopped (kernel state T: SIGSTOP or a debugger)" for r in stopped]
        return Judgement("hang", "straggler", tuple(stopped), tuple(ev), Reason.STOPPED)
    gone = [v.rank for v in views if v.fate is RankFate.EXITED]
    if gone and len(gone) < len(views):
        ev = tuple(f"{r.label} has exited; its peers are still alive" for r in gone)
        return Judgement("crash", None, tuple(gone), ev, Reason.EXITED)
    return _judge_stacks([v for v in views if v.site is not None], hang_hint)


def _judge_stacks(live: list[RankView], hang_hint: bool) -> Judgement | None:
    if not live:
        return None
    multi = any(v.progressed is not None for v in live)
    # A rank computing in every sample is working even if py-spy caught the same line twice.
    moving = [v for v in live if v.progressed or (multi and v.kind is WaitKind.COMPUTE)]
    stuck = [v for v in live if not v.progressed]
    hicache = [v for v in stuck if v.kind in HICACHE_KINDS]
    if moving and not hang_hint:
        return _busy(live, moving)
    absent = _nccl_absent(stuck, multi or hang_hint)
    if absent is not None:
        return absent
    holding = _holding_up(stuck, multi or hang_hint)
    if holding is not None:
        return holding
    if hicache:
        return _hicache_hang(live, hicache)
    if all(v.kind is WaitKind.CUDA_SYNC for v in live):
        return _cuda_wait_hang(live, multi or hang_hint)
    if all(v.idle for v in live):
        if hang_hint:
            return _found("hang", None, [], ["every rank waits for requests, yet logs time out"])
        return _found("healthy", None, [], ["every rank is idle, waiting for requests"])
    outside = [v for v in live if not v.in_comm and not v.idle]
    if outside and len(outside) < len(live):
        ev = [f"{v.rank.label} is outside communication ({v.site}); peers wait" for v in outside]
        if multi or hang_hint:
            ev.append("it made no progress")
            return _found("hang", "straggler", outside, ev, Reason.OUTSIDE)
        return _found("busy", None, [], ["one snapshot: a stage computes while peers wait"])
    if outside and hang_hint:
        ev = "every rank is outside communication, yet the logs report a timeout (device/kernel?)"
        return _found("hang", None, [], [ev])
    if outside:
        return _found("busy", None, [], ["every rank is computing"])
    return _comm_hang(live, multi or hang_hint)


def _found(
    kind: str,
    cause: str | None,
    culprits: list[RankView],
    evidence: list[str],
    reason: Reason = Reason.NONE,
) -> Judgement:
    return Judgement(kind, cause, tuple(v.rank for v in culprits), tuple(evidence), reason)


def _pick_minority(views: list[RankView]) -> list[RankView]:
    """The rank group at the rarest site (HiCache-local first): the odd one out is the culprit."""
    counts = Counter(v.site for v in views)
    site = min(
        counts,
        key=lambda s: (
            min(_KIND_RANK.get(v.kind, 2) for v in views if v.site == s),
            counts[s],
            min(v.rank.key for v in views if v.site == s),
        ),
    )
    return sorted((v for v in views if v.site == site), key=lambda v: v.rank.key)


def _pick_minority_path(views: list[RankView]) -> list[RankView]:
    counts = Counter(v.path for v in views)
    path = min(counts, key=lambda p: (counts[p], min(v.rank.key for v in views if v.path == p)))
    return sorted((v for v in views if v.path == path), key=lambda v: v.rank.key)


def _symmetric(live: list[RankView]) -> bool:
    """Same site reached by the same call path on every rank: one call, all inside it. The
    same site from different callers (writing_check vs can_terminate_prefetch) is a mismatch."""
    return len({v.site for v in live}) == 1 and len({v.path for v in live}) == 1


def _hicache_hang(live: list[RankView], hicache: list[RankView]) -> Judgement:
    if _symmetric(live) and all(v.kind is WaitKind.HICACHE_COMM for v in live):
        msg = f"every rank is inside the same HiCache sync ({live[0].site}), symmetric"
        return _found("hang", "network-suspect", [], [msg])
    culprits = _pick_minority(hicache)
    if len({v.site for v in hicache}) == 1 and len({v.path for v in hicache}) > 1:
        culprits = _pick_minority_path(hicache)
    others = sorted({v.site or "?" for v in live if v not in culprits})
    lead = culprits[0]
    ev = [
        f"{lead.rank.label} is blocked at HiCache wait site {lead.site} in its scheduler "
        f"thread ({lead.frame or '?'})",
        f"peers wait elsewhere: {', '.join(others)}" if others else "no peer shares its site",
    ]
    # Its own DMA or storage thread, not a peer, keeps it there while peers wait on it.
    own = lead.kind is WaitKind.HICACHE_LOCAL and any(v.in_comm for v in live)
    reason = Reason.OWN_WAIT if own else Reason.HICACHE
    return _found("hang", "protocol-deadlock", culprits, ev, reason)


def _comm_hang(live: list[RankView], multi: bool) -> Judgement:
    sites = {v.site for v in live}
    busy_sites = {v.site for v in live if not v.idle}
    if not multi and busy_sites <= _SEND_SITES and busy_sites != sites:
        # one snapshot: peers wait for requests while a stage flushes its sends (idle PP)
        return _found("healthy", None, [], ["ranks wait for requests; a send completes"])
    senders = [v for v in live if v.site in _SEND_SITES]
    askers = [v for v in live if v.kind is WaitKind.REQUEST]
    if senders and askers:
        # A send only blocks until its receiver posts the matching recv: a peer waiting for
        # *requests* instead means the stages disagree on the micro-batch slot (#34568).
        culprits = _pick_minority(askers)
        ev = (
            f"{', '.join(v.rank.label for v in senders)} blocked sending while "
            f"{', '.join(v.rank.label for v in culprits)} waits for requests: the stages are in "
            "different micro-batch slots"
        )
        return _found("hang", "protocol-deadlock", culprits, [ev], Reason.MISMATCH)
    if len(sites) == 1 and len({v.path for v in live}) > 1:
        culprits = _pick_minority_path(live)
        ev = f"every rank is in {live[0].site}, but reached from different callers"
        return _found("hang", "protocol-deadlock", culprits, [ev], Reason.MISMATCH)
    if len(sites) == 1 or sites & _SEND_SITES:
        ev = f"every rank is inside communication ({', '.join(sorted(map(str, sites)))}), "
        ev += "symmetric, no rank outside it"
        return _found("hang", "network-suspect", [], [ev])
    waiting = [v for v in live if v.kind is not WaitKind.REQUEST] or live
    culprits = _pick_minority(waiting)
    ev = f"ranks sit in different communication calls: {', '.join(sorted(map(str, sites)))}"
    return _found("hang", "protocol-deadlock", culprits, [ev], Reason.MISMATCH)


def _holding_up(stuck: list[RankView], confirmed: bool) -> Judgement | None:
    """A rank outside any wait on a peer (asleep, computing, stuck in other code) while the
    others wait on a peer, e.g. PP0 draining its pp_sync sends that PP1 never receives: the
    rank they wait for is the culprit, not the one at the HiCache wait. Needs two samples or
    a logged timeout, since one snapshot of a computing stage is normal. A rank at a
    HiCache-local wait is named by the HiCache step (it waits on its own thread there)."""
    outside = [
        v for v in stuck if not v.in_comm and not v.idle and v.kind is not WaitKind.HICACHE_LOCAL
    ]
    waiting = [v for v in stuck if v.in_comm and v.kind is not WaitKind.REQUEST]
    if not (confirmed and outside and waiting):
        return None
    ev = [
        f"{v.rank.label} is outside any wait on a peer ({v.site}) while "
        f"{', '.join(w.rank.label for w in waiting)} wait(s) on a peer ({waiting[0].site})"
        for v in outside
    ]
    ev.append("the others wait for it")
    return _found("hang", "straggler", outside, ev, Reason.OUTSIDE)


def _busy(live: list[RankView], moving: list[RankView]) -> Judgement:
    ev = [f"{len(moving)}/{len(live)} ranks progressed between samples"]
    # A stage computing while its peers wait is a pipeline at work; a rank that sleeps, waits
    # on a lock or the device in every sample while everyone else sits still in a wait (for it
    # or for work) is a straggler. A peer that moved between samples is not held up, and a
    # working stage caught once off-CPU in code the table does not name is where it was.
    outside = [v for v in live if all(k in _OUTSIDE for k in v.sample_kinds or (v.kind,))]
    waiting = [v for v in live if (v.in_comm or v.idle) and not v.progressed]
    if len(outside) == 1 and len(waiting) == len(live) - 1:
        ev.append(f"{outside[0].rank.label} is the only rank outside communication")
        return _found("busy", "straggler", outside, ev, Reason.OUTSIDE)
    return _found("busy", None, [], ev)


# -- NCCL: a collective only enqueues a kernel; the rank blocks later, at a CUDA host sync -------


def _labels(views: list[RankView]) -> str:
    return ", ".join(v.rank.label for v in views)


def _tp_groups(views: list[RankView]) -> list[list[RankView]]:
    """Ranks that share a TP group (same DP, PP and node), each group in rank order."""
    groups: dict[tuple, list[RankView]] = {}
    for v in sorted(views, key=lambda v: v.rank.key):
        if v.rank.known:
            groups.setdefault((v.rank.dp, v.rank.attn_dp, v.rank.pp, v.rank.node), []).append(v)
    return list(groups.values())


def _nccl_absent(stuck: list[RankView], confirmed: bool) -> Judgement | None:
    """TP ranks waiting at a CUDA host sync wait for the TP collectives their step launched,
    which need every rank of the group: a TP peer stuck anywhere else is the one missing from
    them (gloo-shaped rules would call the syncing ranks stragglers instead)."""
    if not confirmed:
        return None
    for group in _tp_groups(stuck):
        syncing = [v for v in group if v.kind is WaitKind.CUDA_SYNC]
        absent = [v for v in group if v.kind is not WaitKind.CUDA_SYNC]
        if not (syncing and absent):
            continue
        where = ", ".join(sorted({f"{v.rank.label} at {v.site}" for v in absent}))
        ev = [
            f"{_labels(syncing)} wait(s) on the CUDA stream ({syncing[0].site}): under NCCL a "
            "rank launches its collectives and blocks at its next host sync",
            f"their TP group's collective needs {_labels(absent)}, which sit(s) elsewhere: {where}",
        ]
        lone = all(not v.in_comm and not v.idle for v in absent)
        cause = "straggler" if lone else "protocol-deadlock"
        return _found("hang", cause, absent, ev, Reason.NCCL_ABSENT)
    return None


def _cuda_wait_hang(live: list[RankView], confirmed: bool) -> Judgement:
    """Every rank waits on its CUDA stream: the collective that hangs is not on a host stack."""
    sites = ", ".join(sorted({str(v.site) for v in live}))
    if not confirmed:
        return _found("busy", None, [], [f"one snapshot: every rank waits on its GPU ({sites})"])
    if len({v.path for v in live}) > 1:
        culprits = _pick_minority_path(live)
        ev = f"every rank waits on its CUDA stream ({sites}), reached from different callers"
        return _found("hang", "protocol-deadlock", culprits, [ev], Reason.MISMATCH)
    ev = [
        f"every rank waits on its CUDA stream ({sites}), symmetric and without progress",
        "NCCL collectives are asynchronous, so the one that hangs is on no host stack; NCCL's "
        "Flight Recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) names it",
    ]
    return _found("hang", None, [], ev)
