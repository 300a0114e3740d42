"""A production recording's ranks aligned by step: the first step and field where they part.

Three reaches, the oldest steps last kept: the full lines still held, searched and attributed
by diagnosis' own first-divergence code (the one `run` uses on a run's rank{r}.jsonl); the step
digests before them (the step, and its field from the block crcs when the ranks' blocks are
comparable); the block crcs before the digests (a range of steps). A step held by one rank
only is never compared (a rank idle there folds it; a heartbeat is written on its own clock),
and a blind rank's files are never read here (triage/recorded.py leaves them out).
"""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from hicache_diag.diagnosis.divergence import CAUSAL_ORDER, first_divergence
from hicache_diag.diagnosis.idle_slots import ran_past_last_line
from hicache_diag.evidence.recording_scan import RankRead
from hicache_diag.evidence.stacks import RankDump
from hicache_diag.evidence.verdict import DivergenceSource
from hicache_diag.triage.parting import Parting

DEFAULT_BLOCK_STEPS = 256  # recording.Limits' default, when a meta does not say
ROTATED = "rotated out of the full lines"


def frames_of(ranks: dict[int, RankRead]) -> pd.DataFrame:
    """The held lines as diagnosis' run loader builds them: a row per (rank, step)."""
    rows = [{**ln, "rank": ln.get("rank", r)} for r, rr in ranks.items() for ln in rr.lines]
    rows = [row for row in rows if isinstance(row.get("step"), int)]
    if not rows:
        return pd.DataFrame(columns=["rank", "step"])
    frames = pd.DataFrame(rows)
    return frames.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)


def _crc(value: int) -> str:
    return f"crc32:{int(value):08x}"


def digest_parting(ranks: dict[int, RankRead]) -> tuple[int, dict] | None:
    """(step, rank -> crc) of the first step that two ranks both wrote with different
    digests."""
    arrays = {}
    for r, rr in ranks.items():
        steps = np.frombuffer(rr.steps, dtype=np.uint32) if len(rr.steps) else None
        if steps is not None:
            arrays[r] = (steps, np.frombuffer(rr.crcs, dtype=np.uint32))
    best: tuple[int, dict] | None = None
    for a, b in combinations(sorted(arrays), 2):
        (sa, ca), (sb, cb) = arrays[a], arrays[b]
        common, ia, ib = np.intersect1d(sa, sb, return_indices=True)
        apart = np.nonzero(ca[ia] != cb[ib])[0]
        if not len(apart):
            continue
        step = int(common[apart[0]])
        if best is None or step < best[0]:
            best = (step, {a: int(ca[ia[apart[0]]]), b: int(cb[ib[apart[0]]])})
    if best is not None:  # every rank that wrote that step, not only the pair
        step = best[0]
        for r, (s, c) in arrays.items():
            hit = np.nonzero(s == step)[0]
            if len(hit):
                best[1][r] = int(c[hit[0]])
    return best


def _blocks(rr: RankRead) -> dict[int, dict[str, Any]]:
    return {int(b["block"]): b for b in rr.blocks if isinstance(b.get("block"), int)}


def _comparable(blocks: list[dict[str, Any]]) -> bool:
    """Blocks that cover the same written steps: a fold or heartbeat written on one rank only
    changes every field's crc, and says nothing of which field parted them."""
    return len({(b.get("first"), b.get("last"), b.get("n")) for b in blocks}) == 1


def _fields_apart(blocks: dict[int, dict[str, Any]]) -> list[str]:
    keys = sorted({k for b in blocks.values() for k in (b.get("f") or {})})
    apart = [k for k in keys if len({(b.get("f") or {}).get(k) for b in blocks.values()}) > 1]
    order = {name: i for i, name in enumerate(CAUSAL_ORDER)}
    return sorted(apart, key=lambda k: (order.get(k, -1), k))  # causes before effects


def block_fields(ranks: dict[int, RankRead], index: int) -> list[str] | None:
    """The fields whose crcs differ in block `index`; None when its blocks are not
    comparable (not flushed yet on some rank, or written over different steps)."""
    found = {r: b for r, rr in ranks.items() if (b := _blocks(rr).get(index)) is not None}
    if len(found) < 2 or not _comparable(list(found.values())):
        return None
    return _fields_apart(found)


def block_parting(ranks: dict[int, RankRead], before: int | None) -> Parting | None:
    """The first comparable block ending before step `before` whose field crcs differ."""
    by_rank = {r: _blocks(rr) for r, rr in ranks.items()}
    indexes = sorted({i for blocks in by_rank.values() for i in blocks})
    for index in indexes:
        found = {r: blocks[index] for r, blocks in by_rank.items() if index in blocks}
        block = next(iter(found.values()))
        if before is not None and int(block.get("last") or 0) >= before:
            break
        if len(found) < 2 or not _comparable(list(found.values())):
            continue
        if apart := _fields_apart(found):
            name = apart[0]
            values = {str(r): _crc((b.get("f") or {}).get(name, 0)) for r, b in found.items()}
            first, last = int(block.get("first") or 0), int(block.get("last") or 0)
            ev = [
                f"first divergence within steps {first}-{last} (block {index}) in {name}: the "
                f"block crcs differ ({', '.join(apart)}); the steps' values and digests {ROTATED}"
            ]
            src = DivergenceSource.UNKNOWN.value
            return Parting(first, name, values, src, "blocks", None, last, apart, ev)
    return None


def _block_steps(ranks: dict[int, RankRead]) -> int:
    for rr in ranks.values():
        if rr.meta and isinstance(rr.meta.limits.get("block_steps"), int):
            return int(rr.meta.limits["block_steps"]) or DEFAULT_BLOCK_STEPS
    return DEFAULT_BLOCK_STEPS


def _digest_finding(ranks: dict[int, RankRead], step: int, crcs: dict) -> Parting:
    apart = block_fields(ranks, step // _block_steps(ranks))
    name = apart[0] if apart else None
    values = {str(r): _crc(c) for r, c in sorted(crcs.items())}
    what = (
        f"its block's crcs differ in {', '.join(apart)}"
        if apart
        else "which field is not known: its block's crcs are not comparable (not yet written, "
        "or written over different steps)"
    )
    ev = [f"first divergence at step {step}: the step digests differ ({values}); {what}"]
    ev.append(f"the step's values {ROTATED}; only its digests are left")
    src = DivergenceSource.UNKNOWN.value
    return Parting(step, name, values, src, "digests", None, None, apart or [], ev)


def suspect_steps(ranks: dict[int, RankRead]) -> set[int]:
    """The held steps diagnosis has to look at: those not written once by every rank with the
    same must-agree values (a day's recording is mostly neither; diagnosis walks step by
    step). A step one rank folded or wrote twice (a crash record) stays in."""
    keys: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for r, rr in ranks.items():
        for line in rr.lines:
            if isinstance(step := line.get("step"), int):
                agree = line.get("must_agree") or []
                held = [agree, [line.get(k) for k in agree], line.get("host_held")]
                keys[step].append((r, json.dumps(held, sort_keys=True, default=str)))
    n, known = len(ranks), _known_from(ranks)
    return {
        step
        for step, got in keys.items()
        if step >= known
        and (len(got) != n or len({r for r, _ in got}) != n or len({k for _, k in got}) > 1)
    }


def _known_from(ranks: dict[int, RankRead]) -> int:
    """The first step every rank's held lines speak for: its oldest line, or the idle slots
    that line says it folded just before (older steps: one rank's lines rotated out)."""
    firsts = [rr.lines[0] for rr in ranks.values() if rr.lines]
    if len(firsts) < len(ranks):
        return 0
    return max(int(ln.get("step") or 0) - int(ln.get("idle_polls") or 0) for ln in firsts)


def _line_finding(
    frames: pd.DataFrame, stacks: dict[int, RankDump], steps: set[int]
) -> Parting | None:
    found = first_divergence(frames, ran_past_last_line(frames, stacks), steps)
    if found is None:
        return None
    first = found.first
    source = first.source.value
    return Parting(
        first.step, first.field, first.values, source, "lines", found.culprit_rank,
        fields=[first.field], evidence=list(found.evidence),
    )  # fmt: skip


def align(ranks: dict[int, RankRead], stacks: dict[int, RankDump] | None = None) -> Parting | None:
    """The first divergence among `ranks` (the ones that may be compared): blocks before the
    digests every rank still holds, digests before the lines every rank still holds, then the
    lines. `stacks`: flat rank -> its live stack, so that a follower waiting for a request list
    counts the slots it ran past its last line (diagnosis.idle_slots)."""
    if len(ranks) < 2:
        return None
    held = [rr.first_held for rr in ranks.values() if rr.lines]
    window = max(held) if len(held) == len(ranks) else None
    starts = [int(rr.steps[0]) for rr in ranks.values() if len(rr.steps)]
    digests_from = max(starts) if len(starts) == len(ranks) else None
    if (found := block_parting(ranks, digests_from or window)) is not None:
        return found
    early = digest_parting(ranks)
    if early is not None and (window is None or early[0] < window):
        return _digest_finding(ranks, *early)
    frames = frames_of(ranks)
    if frames.empty:
        return None
    return _line_finding(frames, stacks or {}, suspect_steps(ranks))
