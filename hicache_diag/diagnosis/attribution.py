"""The divergence source and culprit rank, from each rank's recorded inputs: DMA acks, L3
progress and hits, LRU clocks (here) and the rank's own pools (host_attribution.py).

Never from which fault was requested or fired: that is the injection, not evidence.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from hicache_diag.diagnosis.divergence_values import (
    LOOKBACK_STEPS,
    disagree,
    lookback,
    odd_rank,
    only_some,
    per_rank_sum,
    rank_values,
    step_disagreement,
    with_sub,
)
from hicache_diag.diagnosis.host_attribution import (
    Attribution,
    device_hold_source,
    host_alloc_source,
    host_eviction_source,
    host_shortage_source,
    pool_refusal_source,
)
from hicache_diag.diagnosis.probe_records import (
    FLUSH,
    L3_DRAIN,
    first_drops,
    lone_drops,
    outcomes,
)
from hicache_diag.evidence.verdict import DivergenceSource

MAX_RIDS_SAID = 4  # per rank, in the evidence line: an overload drops dozens

# A copy in flight at the divergence finishes later: its pending age shows a few steps after.
ACK_AFTER_STEPS = 3
SLOW_DMA_RATIO, SLOW_DMA_MIN_MS = 2.0, 5.0
_L3_PROGRESS_KEYS = ("l3_progress", "l3_completed", "prefetch_completed", "completed_tokens")


def _slow_dma_rank(frames: pd.DataFrame, step: int) -> tuple[int, dict[int, float]] | None:
    """The rank whose oldest not-ready ack was clearly the oldest around `step`
    (`ack_pending_ms`): its copy engine is the slow one, wherever its stage polls in the loop."""
    if "ack_pending_ms" not in frames.columns:
        return None
    near = frames[
        (frames["step"] > step - LOOKBACK_STEPS) & (frames["step"] <= step + ACK_AFTER_STEPS)
    ]
    ages: dict[int, float] = {}
    for rank, pending in zip(near["rank"], near["ack_pending_ms"], strict=True):
        ages.setdefault(int(rank), 0.0)
        if isinstance(pending, dict) and pending:
            ages[int(rank)] = max(ages[int(rank)], *map(float, pending.values()))
    if len(ages) < 2:
        return None
    (top, a), (_, b) = sorted(ages.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
    if a >= SLOW_DMA_RATIO * b and a - b >= SLOW_DMA_MIN_MS:
        return top, {r: round(v, 1) for r, v in sorted(ages.items())}
    return None


def _ack_culprit(
    frames: pd.DataFrame, step: int, ready: dict, consumed: dict | None = None
) -> tuple[int | None, str]:
    slow = _slow_dma_rank(frames, step)
    if slow:
        return slow[0], f"; oldest pending ack per rank, ms: {slow[1]}"
    if consumed and not disagree(ready):
        # Ready counts read after the drain (real SGLang's line) are equal again: what each
        # rank drained is then its own ready count (0.5.12.post1: PP0 drained 1, PP1 0).
        return odd_rank(consumed), ""
    return odd_rank(ready), ""


def _ack_source(
    window: pd.DataFrame, frames: pd.DataFrame, step: int, column: str, values: dict
) -> Attribution | None:
    sync = with_sub(window, "sync_received", "ack_count")
    if sync is not None:
        hit = step_disagreement(sync.assign(ack_sync=sync["_v"]), "ack_sync")
        if hit:
            return (
                DivergenceSource.DMA_ACK_COUNT,
                odd_rank(hit[1]),
                f"the relayed ack count differs at step {hit[0]}: {hit[1]}",
            )
    if column == "acks_consumed":
        ready = rank_values(frames[frames["step"] == step], "acks_ready")
        why = "each rank drained its own ready acks" if sync is None else "despite the ack sync"
        culprit, slow = _ack_culprit(frames, step, ready or values, values)
        return (
            DivergenceSource.DMA_ACK_COUNT,
            culprit,
            f"acks_consumed differ at step {step} ({why}; acks_ready {ready}{slow})",
        )
    if sync is None:
        hit = step_disagreement(window, "acks_ready")
        if hit:
            culprit, slow = _ack_culprit(frames, hit[0], hit[1])
            return (
                DivergenceSource.DMA_ACK_COUNT,
                culprit,
                f"ranks saw different ready DMA acks at step {hit[0]} with no ack sync: "
                f"{hit[1]}{slow}",
            )
    return None


def _l3_progress_source(window: pd.DataFrame) -> Attribution | None:
    for key in _L3_PROGRESS_KEYS:
        sub = with_sub(window, "sync_received", key)
        hit = step_disagreement(sub.assign(p=sub["_v"]), "p") if sub is not None else None
        hit = hit or step_disagreement(window, key)
        if hit:
            # Each rank's own reads name the culprit; the used value may be TP-reduced.
            local = rank_values(window[window["step"] == hit[0]], "l3_progress_local")
            odd = odd_rank(local) if disagree(local) else odd_rank(hit[1])
            return (
                DivergenceSource.L3_PROGRESS,
                odd,
                f"L3 progress ({key}) differs at step {hit[0]}: {hit[1]} (own reads {local})",
            )
    return None


def _first_per_request(frames: pd.DataFrame, column: str) -> dict[str, dict[int, Any]]:
    """request id -> rank -> the value that rank first recorded for it in `column`."""
    out: dict[str, dict[int, Any]] = {}
    if column not in frames.columns:
        return out
    ordered = frames.sort_values("step", kind="stable")
    for rank, per_rid in zip(ordered["rank"], ordered[column], strict=True):
        for rid, value in per_rid.items() if isinstance(per_rid, dict) else ():
            out.setdefault(str(rid), {}).setdefault(int(rank), value)
    return out


def _l3_hit_by_request(frames: pd.DataFrame, rids: list[str]) -> tuple[str, dict] | None:
    """The first of `rids` whose own L3 hit lengths differ across ranks when each rank's
    lookup is matched by request, not by step: legacy stages look a request up at their own
    step (seen: PP1 at step 100, PP0 at 101), so a step-aligned compare sets a hit against
    "no lookup yet" and would blame the rank that had not looked yet."""
    local = _first_per_request(frames, "l3_hit_len_local")
    used = _first_per_request(frames, "l3_hit_len")
    for rid in rids:
        mine = local.get(rid, {})
        agreed = used.get(rid, {})
        if len(mine) < 2 or not disagree(mine):
            continue
        if len(agreed) == len(mine) and not disagree(agreed):
            continue  # a consensus (the hit MIN) absorbed the difference
        return rid, mine
    return None


def _leader_rank(frames: pd.DataFrame) -> int:
    """PP0's first rank: the stage whose decisions the fixed protocol relays."""
    if "pp" in frames.columns:
        leaders = frames.loc[frames["pp"] == 0, "rank"]
        if not leaders.empty:
            return int(leaders.min())
    return int(frames["rank"].min())


def _culprit_off_leader(off: dict[int, Any]) -> int | None:
    """Of the ranks whose value is off PP0's (the decision the fix relays): the odd one when
    they differ among themselves, else the lowest."""
    return odd_rank(off) if len(off) > 1 and disagree(off) else min(off, default=None)


def _l3_hit_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    local = step_disagreement(window, "l3_hit_len_local")
    if not local or not (step_disagreement(window, "l3_hit_len") or "l3_hit_len" not in window):
        return None  # no difference, or a consensus (the hit MIN) absorbed it
    step, values = local
    drained = {r: frozenset(v) for r, v in values.items() if isinstance(v, dict)}
    if len(set(drained.values())) < 2:
        return (
            DivergenceSource.L3_HIT,
            odd_rank(values),
            f"local L3 hit lengths differ at step {step}: {values}",
        )
    # Each stage drained its own prefetch_hit_queue: a hit one stage consumed, another had not
    # yet. Matched by request, a length difference names the rank; else the stage that left
    # PP0's drain (the count the fix relays) did.
    why = f"the stages drained different L3 hit queries at step {step}: {values}"
    matched = _l3_hit_by_request(frames, sorted({str(k) for d in drained.values() for k in d}))
    if matched:
        rid, per_rank = matched
        return DivergenceSource.L3_HIT, odd_rank(per_rank), f"{why}; {rid} hit per rank {per_rank}"
    leader = _leader_rank(frames)
    off = {r: v for r, v in values.items() if r in drained and drained[r] != drained.get(leader)}
    culprit = _culprit_off_leader(off)
    return DivergenceSource.L3_HIT, culprit, f"{why}; off PP0's (rank {leader}): {sorted(off)}"


def _drained(cell: Any) -> list[int] | None:
    """What one step's `sources.l3-control-queues` record says the rank drained, summed:
    [storage hits, backups, host-memory releases] (probe_table.py), None when it drained none."""
    drained = outcomes(cell, L3_DRAIN)
    if not drained:
        return None
    total = [0, 0, 0]
    for counts in drained:
        for i, n in enumerate(counts[:3] if isinstance(counts, list) else ()):
            total[i] += int(n or 0)
    return total


def _l3_drain_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    """The stages drained their L3 control queues by different amounts: each applied the
    storage hits, backups and host-memory releases its own storage threads had finished by
    then (0.5.18 agrees on the counts within a stage's TP group only), so their trees took
    different hits or kept different host copies."""
    if "sources" not in window.columns:
        return None
    totals: dict[int, list[int]] = {}
    steps: dict[int, list[int]] = {}
    for rank, step, cell in zip(window["rank"], window["step"], window["sources"], strict=True):
        drained = _drained(cell)
        if drained is None:
            continue
        mine = totals.setdefault(int(rank), [0, 0, 0])
        totals[int(rank)] = [a + b for a, b in zip(mine, drained, strict=True)]
        steps.setdefault(int(rank), []).append(int(step))
    ranks = {int(r) for r in frames["rank"].unique()}
    values = {r: tuple(totals.get(r, (0, 0, 0))) for r in sorted(ranks)}
    if len(values) < 2 or not totals or not disagree(values):
        return None
    leader = _leader_rank(frames)
    off = {r: v for r, v in values.items() if v != values.get(leader)}
    culprit = _culprit_off_leader(off)
    at = {r: steps.get(r, []) for r in sorted(ranks)}
    return (
        DivergenceSource.L3_PROGRESS,
        culprit,
        f"the stages drained their L3 control queues differently (storage hits, backups, "
        f"host-memory releases per rank {values}, drained at steps {at}); each stage drains "
        f"what its own storage threads finished, off PP0's (rank {leader}): {sorted(off)}",
    )


def _lru_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    hit = step_disagreement(window, "evict_victims")
    if not hit or "tree_digest" not in frames.columns:
        return None
    before = frames[frames["step"] == hit[0] - 1]
    if disagree(rank_values(before, "tree_digest")):
        return None  # trees already differed: the victims follow from that, not from the clock
    # A monotonic clock never goes back: the rank whose stamps regressed has the odd clock.
    regressed = only_some(per_rank_sum(frames[frames["step"] <= hit[0]], "clock_regressions"))
    clocks = rank_values(frames[frames["step"] == hit[0]], "clock")
    if regressed:
        culprit = max(sorted(regressed), key=lambda r: regressed[r])
        why = f"clock stamps went back on rank(s) {sorted(regressed)}: {regressed}"
    else:
        culprit = odd_rank(clocks, "max") if clocks else odd_rank(hit[1])
        why = f"clocks {clocks}"
    return (
        DivergenceSource.LRU_CLOCK,
        culprit,
        f"identical trees chose different eviction victims at step {hit[0]} ({why})",
    )


def _session_source(window: pd.DataFrame) -> Attribution | None:
    """A session reap tick that closed sessions on some ranks only (`sessions_closed`, the
    recorder's count of what each rank's own `maybe_reap` closed): the closed session's nodes
    were released on those ranks alone. The rank whose tick closed first is named."""
    closed = only_some(per_rank_sum(window, "sessions_closed"))
    if not closed:
        return None
    hits = window[window["sessions_closed"].fillna(0) > 0]
    first = {int(r): int(s) for r, s in hits.groupby("rank")["step"].min().items()}
    culprit = min(first, key=lambda r: (first[r], r))
    return (
        DivergenceSource.SESSION_CLOCK,
        culprit,
        f"the session reap tick closed sessions on rank(s) {sorted(closed)} only (per rank "
        f"{closed}, first at step {first[culprit]} on rank {culprit}); each rank reaps on its own "
        "monotonic clock (SessionController.maybe_reap), and the closed session's tree nodes "
        "were released there alone",
    )


def _drop_list(rank: int, drops: list[tuple[int, str]]) -> str:
    if not drops:
        return f"rank {rank} none"
    named = ", ".join(f"{rid} (step {step})" for step, rid in drops[:MAX_RIDS_SAID])
    more = f" and {len(drops) - MAX_RIDS_SAID} more" if len(drops) > MAX_RIDS_SAID else ""
    return f"rank {rank} dropped {named}{more}"


def _waiting_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    """A waiting timeout that dropped a request on some ranks only, in the window: each rank
    drops from its own waiting queue what its own clock says is due, so a request at the
    deadline is dropped on one stage and admitted on another. Named: the rank that dropped
    first what another had not dropped by the window's end."""
    if window.empty or "waiting_timeouts" not in window.columns:
        return None
    last, start = int(window["step"].max()), int(window["step"].min())
    upto = frames[frames["step"] <= last]
    cells = upto["sources"] if "sources" in upto.columns else [None] * len(upto)
    rows = zip(upto["rank"], upto["step"], cells, strict=True)
    drops = first_drops(upto["rank"].unique(), rows)
    lone = [d for d in lone_drops(drops) if d[0] >= start]
    if not lone:
        if any(drops.values()):
            return None  # the ranks dropped the same requests (the rids say so)
        counts = only_some(per_rank_sum(window, "waiting_timeouts"))  # counts without rids
        if not counts:
            return None
        culprit = min(counts)
        said = f"dropped {counts} requests per rank, on rank(s) {sorted(counts)} only"
    else:
        step, culprit, rid = lone[0]
        per_rank = {r: sorted((s, x) for s, rr, x in lone if rr == r) for r in sorted(drops)}
        said = "; ".join(_drop_list(r, v) for r, v in per_rank.items())
        said = f"dropped on some ranks only: {said}; first {rid} on rank {culprit} at step {step}"
    return (
        DivergenceSource.WAITING_CLOCK,
        culprit,
        f"the waiting timeout {said}; each rank drops from its own waiting queue what its own "
        "perf_counter says is past SGLANG_REQ_WAITING_TIMEOUT "
        "(Scheduler._abort_on_waiting_timeout), so another rank admitted what this one dropped",
    )


def _flush_endings(window: pd.DataFrame) -> dict[int, list[tuple[str, int]]]:
    """rank -> how each of its deferred flushes ended in the window, in order: (outcome, step)."""
    out: dict[int, list[tuple[str, int]]] = {int(r): [] for r in window["rank"].unique()}
    ordered = window.sort_values("step", kind="stable")
    for rank, step, cell in zip(ordered["rank"], ordered["step"], ordered["sources"], strict=True):
        out[int(rank)] += [(str(o), int(step)) for o in outcomes(cell, FLUSH)]
    return out


def _flush_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    """A deferred flush that ended differently per rank (one reset its tree, another timed out,
    or they reset at different steps): each rank waits for idle until its own monotonic
    deadline. Named: the rank(s) whose ending is off PP0's, the ending the fix would relay."""
    if "sources" not in window.columns:
        return None
    endings = _flush_endings(window)
    if len(endings) < 2 or not any(endings.values()):
        return None
    leader = _leader_rank(frames)
    mine = endings.get(leader, [])
    off = {r: tuple(v) for r, v in endings.items() if v != mine}
    if not off:
        return None
    culprit = _culprit_off_leader(off)
    said = "; ".join(
        f"rank {r} " + (", ".join(f"{o} at step {s}" for o, s in v) or "no ending")
        for r, v in sorted(endings.items())
    )
    return (
        DivergenceSource.FLUSH_DEADLINE,
        culprit,
        f"the deferred flush ended differently per rank ({said}); each rank waits for idle until "
        "its own time.monotonic() deadline (SchedulerFlushWrapper.check_pending), so one stage "
        f"reset its tree where another did not; off PP0's (rank {leader}): {sorted(off)}",
    )


def attribute(frames: pd.DataFrame, step: int, column: str, values: dict) -> Attribution:
    """Name the divergence source from the recorded per-rank inputs: first those of the
    LOOKBACK_STEPS up to `step`, then, when none explains it, the whole history before it (an
    L3 read or an LRU stamp can decide a batch long after it happened)."""
    for window in (lookback(frames, step), frames[frames["step"] <= step]):
        found = (
            host_shortage_source(window, step)
            or host_alloc_source(window, step)
            or host_eviction_source(window, step)
            or _ack_source(window, frames, step, column, values)
            or _session_source(window)
            or _waiting_source(window, frames)
            or _flush_source(window, frames)
            or _l3_progress_source(window)
            or _l3_hit_source(window, frames)
            or _l3_drain_source(window, frames)
            or pool_refusal_source(window, frames, step)
            or _lru_source(window, frames)
            or device_hold_source(window, step)
        )
        if found:
            return found
    return DivergenceSource.UNKNOWN, odd_rank(values), "no recorded per-rank input explains it"
