"""First divergence: the first step and must-agree field where ranks disagree, and its source.

The source and the culprit rank are attributed from what each rank recorded as its own inputs
(ready acks, failed host allocs, eviction victims, local L3 hits, L3 progress), never from which
fault was requested or fired (`faults_fired` is the injection, not evidence).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from hicache_diag.verdict import DivergenceSource, FirstDivergence

# How many steps before the divergence still count as "just before" for an input difference.
LOOKBACK_STEPS = 8
# A copy in flight at the divergence finishes later: its pending age shows a few steps after.
ACK_AFTER_STEPS = 3
SLOW_DMA_RATIO, SLOW_DMA_MIN_MS = 2.0, 5.0
_L3_PROGRESS_KEYS = ("l3_progress", "l3_completed", "prefetch_completed", "completed_tokens")
# Within one step, report causes before effects: what a rank consumed or allocated decides the
# tree, and the tree decides the next batch (rids, extend tokens).
CAUSAL_ORDER = (
    "acks_consumed", "host_capacity", "host_free", "l3_hit_len", "write_backs", "load_backs",
    "evicted", "device_free", "tree_digest", "host_hit_len", "prefix_len", "rids",
    "extend_num_tokens",
)  # fmt: skip


@dataclass(slots=True)
class Divergence:
    first: FirstDivergence
    culprit_rank: int | None
    evidence: list[str] = field(default_factory=list)


def _canon(value: Any) -> str:
    """Comparable form of a recorded value (dicts compare regardless of key order)."""
    if isinstance(value, float) and value != value:  # NaN: a key this rank did not record
        return "null"
    return json.dumps(value, sort_keys=True, default=str)


def _present(value: Any) -> bool:
    return not (value is None or (isinstance(value, float) and value != value))


def _must_agree_fields(rows: pd.DataFrame) -> list[str]:
    fields: list[str] = []
    if "must_agree" not in rows.columns:
        return fields
    for keys in rows["must_agree"]:
        for key in keys if isinstance(keys, list) else []:
            if key not in fields and key in rows.columns:
                fields.append(key)
    rank = {name: i for i, name in enumerate(CAUSAL_ORDER)}
    return sorted(fields, key=lambda f: rank.get(f, -1))  # unknown keys first: recorded inputs


def _plain(value: Any) -> Any:
    """A count that pandas widened to float (a column with gaps, e.g. beside a crash record)
    is reported as the int it was recorded as."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def _values(rows: pd.DataFrame, column: str) -> dict[int, Any]:
    if column not in rows.columns:
        return {}
    pairs = zip(rows["rank"], rows[column], strict=True)
    return {int(r): _plain(v) for r, v in pairs if _present(v)}


def _disagree(values: dict[int, Any]) -> bool:
    return len({_canon(v) for v in values.values()}) > 1


def _agreeable(rows: pd.DataFrame, column: str) -> dict[int, Any]:
    """The values of `column` that must agree. A host-shortage side pool (`host_held`) shrinks
    one rank's pool on purpose: free slots plus held ones is what the trees must agree on."""
    values = _values(rows, column)
    if column == "host_free" and "host_held" in rows.columns:
        held = _values(rows, "host_held")
        values = {r: v + int(held.get(r) or 0) if isinstance(v, int | float) else v
                  for r, v in values.items()}  # fmt: skip
    return values


def find_first(frames: pd.DataFrame) -> tuple[int, str, dict[int, Any]] | None:
    """(step, field, rank -> value) of the first disagreement, comparing the ranks present."""
    if frames.empty or "must_agree" not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        if rows["rank"].nunique() < 2:
            continue
        for column in _must_agree_fields(rows):
            values = _agreeable(rows, column)
            if len(values) >= 2 and _disagree(values):
                return int(step), column, values
    return None


def _odd_rank(values: dict[int, Any], prefer: str = "min") -> int | None:
    """The rank holding the minority value; on a tie the one with the smaller/larger number."""
    if not values:
        return None
    counts = Counter(_canon(v) for v in values.values())
    if len(counts) < 2:
        return None
    rare = min(counts.values())
    rare_ranks = [r for r, v in values.items() if counts[_canon(v)] == rare]
    if len(rare_ranks) == 1:
        return rare_ranks[0]

    def magnitude(r: int) -> float:
        v = values[r]
        if isinstance(v, dict):
            return float(sum(x for x in v.values() if isinstance(x, int | float)))
        return float(v) if isinstance(v, int | float) else 0.0

    pick = min if prefer == "min" else max
    return pick(rare_ranks, key=lambda r: (magnitude(r), -r if prefer == "min" else r))


def _window(frames: pd.DataFrame, step: int) -> pd.DataFrame:
    return frames[(frames["step"] <= step) & (frames["step"] > step - LOOKBACK_STEPS)]


def _sub(frames: pd.DataFrame, column: str, key: str) -> pd.Series:
    return frames[column].map(lambda d: d.get(key) if isinstance(d, dict) else None)


def _with_sub(frames: pd.DataFrame, column: str, key: str) -> pd.DataFrame | None:
    if column not in frames.columns:
        return None
    out = frames.assign(_v=_sub(frames, column, key))
    out = out[out["_v"].map(_present)]
    return None if out.empty else out


def _step_disagreement(frames: pd.DataFrame, column: str) -> tuple[int, dict[int, Any]] | None:
    """The first step at which `column` differs across the ranks that recorded it."""
    if column not in frames.columns:
        return None
    for step, rows in frames.groupby("step", sort=True):
        values = _values(rows, column)
        if len(values) >= 2 and _disagree(values):
            return int(step), values
    return None


Attribution = tuple[DivergenceSource, int | None, str]


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
    if consumed and not _disagree(ready):
        # Ready counts read after the drain (real SGLang's line) are equal again: what each
        # rank drained is then its own ready count (0.5.12.post1: PP0 drained 1, PP1 0).
        return _odd_rank(consumed), ""
    return _odd_rank(ready), ""


def _ack_source(window: pd.DataFrame, frames: pd.DataFrame, step: int, column: str,
                values: dict) -> Attribution | None:  # fmt: skip
    sync = _with_sub(window, "sync_received", "ack_count")
    if sync is not None:
        hit = _step_disagreement(sync.assign(ack_sync=sync["_v"]), "ack_sync")
        if hit:
            return (
                DivergenceSource.DMA_ACK_COUNT,
                _odd_rank(hit[1]),
                f"the relayed ack count differs at step {hit[0]}: {hit[1]}",
            )
    if column == "acks_consumed":
        ready = _values(frames[frames["step"] == step], "acks_ready")
        why = "each rank drained its own ready acks" if sync is None else "despite the ack sync"
        culprit, slow = _ack_culprit(frames, step, ready or values, values)
        return (
            DivergenceSource.DMA_ACK_COUNT,
            culprit,
            f"acks_consumed differ at step {step} ({why}; acks_ready {ready}{slow})",
        )
    if sync is None:
        hit = _step_disagreement(window, "acks_ready")
        if hit:
            culprit, slow = _ack_culprit(frames, hit[0], hit[1])
            return (
                DivergenceSource.DMA_ACK_COUNT,
                culprit,
                f"ranks saw different ready DMA acks at step {hit[0]} with no ack sync: "
                f"{hit[1]}{slow}",
            )
    return None


def _per_rank_sum(window: pd.DataFrame, column: str) -> dict[int, int]:
    if column not in window.columns:
        return {}
    sums = window.groupby("rank")[column].sum(min_count=1).fillna(0)
    return {int(r): int(n) for r, n in sums.items()}


def _only_some(counts: dict[int, int]) -> dict[int, int]:
    """The ranks with a non-zero count, when not every rank has one."""
    bad = {r: n for r, n in counts.items() if n > 0}
    return bad if bad and len(bad) < len(counts) else {}


def _first_shortage(window: pd.DataFrame, rank: int) -> str:
    """What the rank read at its first skipped backup (`host_shortages`), as evidence text."""
    if "host_shortages" not in window.columns:
        return ""
    mine = window[window["rank"] == rank].sort_values("step", kind="stable")
    for step, found in zip(mine["step"], mine["host_shortages"], strict=True):
        if isinstance(found, list) and found:
            first = found[0]
            return (
                f"; first at step {int(step)}: needed {first.get('need')} tokens with "
                f"{first.get('free')} free; evict_host ran {first.get('evict_calls', '?')} time(s) "
                f"and freed {first.get('evicted')}"
            )
    return ""


def _host_shortage_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """SGLang's own shortage branch skipped backups on some ranks only (`host_shortage`)."""
    counts = _only_some(_per_rank_sum(window, "host_shortage"))
    if not counts:
        return None
    culprit = max(sorted(counts), key=lambda r: counts[r])
    return (
        DivergenceSource.HOST_ALLOC,
        culprit,
        f"the host pool was short for write-through backups only on rank(s) {sorted(counts)} "
        f"before step {step} (backups skipped: {counts}){_first_shortage(window, culprit)}",
    )


def _host_eviction_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """A backup that found the pool short made room with SGLang's own `evict_host` on some
    ranks only: their host trees dropped nodes their peers kept (`host_evicted`)."""
    counts = _only_some(_per_rank_sum(window, "host_evicted"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"evict_host freed host tokens only on rank(s) {sorted(counts)} before step {step} "
        f"({counts}): a backup found that rank's host pool short and evicted host nodes its "
        "peers kept",
    )


def _host_alloc_source(window: pd.DataFrame, step: int) -> Attribution | None:
    counts = _only_some(_per_rank_sum(window, "host_alloc_failed"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"host alloc failed only on rank(s) {sorted(counts)} before step {step}: {counts}",
    )


def _voted(frames: pd.DataFrame) -> bool:
    """Whether host allocs were decided by a vote anywhere in the run (two-phase)."""
    if "sync_received" not in frames.columns:
        return False
    return any(isinstance(v, dict) and ("host_alloc" in v or "prefetch_alloc" in v)
               for v in frames["sync_received"])  # fmt: skip


def _pool_refusal_source(
    window: pd.DataFrame, frames: pd.DataFrame, step: int
) -> Attribution | None:
    """No vote decides allocs: a pool refusal that write_backup's evict_host + retry hid from
    host_alloc_failed still made this rank alone evict host nodes."""
    if _voted(frames):
        return None  # the vote absorbs a refusal; a refusal follows some other difference
    counts = _only_some(_per_rank_sum(window, "host_pool_refused"))
    if not counts:
        return None
    return (
        DivergenceSource.HOST_ALLOC,
        max(sorted(counts), key=lambda r: counts[r]),
        f"the host pool refused allocs only on rank(s) {sorted(counts)} before step {step}: "
        f"{counts}",
    )


def _l3_progress_source(window: pd.DataFrame) -> Attribution | None:
    for key in _L3_PROGRESS_KEYS:
        sub = _with_sub(window, "sync_received", key)
        hit = _step_disagreement(sub.assign(p=sub["_v"]), "p") if sub is not None else None
        hit = hit or _step_disagreement(window, key)
        if hit:
            # Each rank's own reads name the culprit; the used value may be TP-reduced.
            local = _values(window[window["step"] == hit[0]], "l3_progress_local")
            odd = _odd_rank(local) if _disagree(local) else _odd_rank(hit[1])
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
        if len(mine) < 2 or not _disagree(mine):
            continue
        if len(agreed) == len(mine) and not _disagree(agreed):
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


def _l3_hit_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    local = _step_disagreement(window, "l3_hit_len_local")
    if not local or not (_step_disagreement(window, "l3_hit_len") or "l3_hit_len" not in window):
        return None  # no difference, or a consensus (the hit MIN) absorbed it
    step, values = local
    drained = {r: frozenset(v) for r, v in values.items() if isinstance(v, dict)}
    if len(set(drained.values())) < 2:
        return (
            DivergenceSource.L3_HIT,
            _odd_rank(values),
            f"local L3 hit lengths differ at step {step}: {values}",
        )
    # Each stage drained its own prefetch_hit_queue: a hit one stage consumed, another had not
    # yet. Matched by request, a length difference names the rank; else the stage that left
    # PP0's drain (the count the fix relays) did.
    why = f"the stages drained different L3 hit queries at step {step}: {values}"
    matched = _l3_hit_by_request(frames, sorted({str(k) for d in drained.values() for k in d}))
    if matched:
        rid, per_rank = matched
        return DivergenceSource.L3_HIT, _odd_rank(per_rank), f"{why}; {rid} hit per rank {per_rank}"
    leader = _leader_rank(frames)
    off = {r: v for r, v in values.items() if r in drained and drained[r] != drained.get(leader)}
    culprit = _odd_rank(off) if len(off) > 1 and _disagree(off) else min(off, default=None)
    return DivergenceSource.L3_HIT, culprit, f"{why}; off PP0's (rank {leader}): {sorted(off)}"


def _lru_source(window: pd.DataFrame, frames: pd.DataFrame) -> Attribution | None:
    hit = _step_disagreement(window, "evict_victims")
    if not hit or "tree_digest" not in frames.columns:
        return None
    before = frames[frames["step"] == hit[0] - 1]
    if _disagree(_values(before, "tree_digest")):
        return None  # trees already differed: the victims follow from that, not from the clock
    # A monotonic clock never goes back: the rank whose stamps regressed has the odd clock.
    regressed = _only_some(_per_rank_sum(frames[frames["step"] <= hit[0]], "clock_regressions"))
    clocks = _values(frames[frames["step"] == hit[0]], "clock")
    if regressed:
        culprit = max(sorted(regressed), key=lambda r: regressed[r])
        why = f"clock stamps went back on rank(s) {sorted(regressed)}: {regressed}"
    else:
        culprit = _odd_rank(clocks, "max") if clocks else _odd_rank(hit[1])
        why = f"clocks {clocks}"
    return (
        DivergenceSource.LRU_CLOCK,
        culprit,
        f"identical trees chose different eviction victims at step {hit[0]} ({why})",
    )


def _device_hold_source(window: pd.DataFrame, step: int) -> Attribution | None:
    """Device slots were held during load-backs on some ranks only (`device_held`, recorded by
    the load-back hook): that rank's `_load_back_transfers` found its device pool short and its
    own `evict_for_alloc` evicted (or it declined) what its peers kept. Not a classic source,
    so the source stays `unknown`; the rank is named from its own record, not from a 1-1 tie
    over the diverging field (docs/evidence.md)."""
    counts = _only_some(_per_rank_sum(window, "device_held"))
    if not counts:
        return None
    declined = {r: n for r, n in _per_rank_sum(window, "load_back_declined").items() if n}
    return (
        DivergenceSource.UNKNOWN,
        max(sorted(counts), key=lambda r: counts[r]),
        f"device slots were held during load-backs only on rank(s) {sorted(counts)} before "
        f"step {step} (tokens held: {counts}; load-backs declined: {declined or 'none'}): "
        "that rank's load-back found its device pool short and evicted or declined alone",
    )


def attribute(frames: pd.DataFrame, step: int, column: str, values: dict) -> Attribution:
    """Name the divergence source from the recorded per-rank inputs: first those of the
    LOOKBACK_STEPS up to `step`, then, when none explains it, the whole history before it (an
    L3 read or an LRU stamp can decide a batch long after it happened)."""
    for window in (_window(frames, step), frames[frames["step"] <= step]):
        found = (
            _host_shortage_source(window, step)
            or _host_alloc_source(window, step)
            or _host_eviction_source(window, step)
            or _ack_source(window, frames, step, column, values)
            or _l3_progress_source(window)
            or _l3_hit_source(window, frames)
            or _pool_refusal_source(window, frames, step)
            or _lru_source(window, frames)
            or _device_hold_source(window, step)
        )
        if found:
            return found
    return DivergenceSource.UNKNOWN, _odd_rank(values), "no recorded per-rank input explains it"


def first_divergence(frames: pd.DataFrame) -> Divergence | None:
    found = find_first(frames)
    if found is None:
        return None
    step, column, values = found
    source, culprit, why = attribute(frames, step, column, values)
    first = FirstDivergence(
        step=step, field=column, values={str(r): v for r, v in values.items()}, source=source
    )
    lines = [
        f"first divergence at step {step} in {column}: {values}",
        f"source {source.value}: {why}",
    ]
    return Divergence(first=first, culprit_rank=culprit, evidence=lines)


# Per-rank inputs that a rank alone can see, each counted per step in rank{r}.jsonl.
_LOCAL_INPUTS = (
    ("host_shortage", "write-through backups skipped for a short host pool",
     DivergenceSource.HOST_ALLOC),
    ("host_alloc_failed", "host allocs failed", DivergenceSource.HOST_ALLOC),
    ("host_evicted", "host evictions (evict_host)", DivergenceSource.HOST_ALLOC),
    ("host_pool_refused", "the host pool refused allocs", DivergenceSource.HOST_ALLOC),
    ("clock_regressions", "clock stamps went back", DivergenceSource.LRU_CLOCK),
)


def lone_local_input(frames: pd.DataFrame) -> tuple[int, DivergenceSource, str] | None:
    """With no recorded step differing (the failure came inside the step the ranks parted in,
    e.g. a TP rank skipping a collective its peer entered), the one rank whose own inputs went
    wrong in its last LOOKBACK_STEPS recorded steps, when exactly one did."""
    if frames.empty:
        return None
    last = frames.groupby("rank", group_keys=False).tail(LOOKBACK_STEPS)
    for column, what, source in _LOCAL_INPUTS:
        counts = _only_some(_per_rank_sum(last, column))
        if len(counts) != 1:
            continue
        rank, n = next(iter(counts.items()))
        hit = last[(last["rank"] == rank) & (last[column].fillna(0) > 0)]
        why = (
            f"no recorded step differs before the failure, but only rank {rank}'s {what} in its "
            f"last {LOOKBACK_STEPS} recorded steps ({n}, the last at step {int(hit['step'].max())})"
            f"; source {source.value}"
        )
        return rank, source, why
    return None
