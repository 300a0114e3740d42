"""outputs.json vs reference.json: wrong tokens beyond the tolerance the reference records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hicache_diag.options.run_options import RunOptions

_TOKEN_KEYS = ("tokens", "outputs", "output_ids")
_GAP_KEYS = ("gaps", "logit_gaps", "top2_gap", "top2_gaps")
# reference.json records each token's top-2 logit gap; when the file does not record a
# tolerance, the run's engine gives it (its options' `tie_tolerance`): whoever reads the run
# passes the engine's (the trial loop its engine's, report and hunt the registry's by the
# manifest's engine), else this one.
DEFAULT_TIE_TOLERANCE = RunOptions.tie_tolerance
# The tie tolerance of a run by its manifest's engine name (None: the manifest names none).
TieTolerance = Callable[[str | None], float]


@dataclass(frozen=True, slots=True)
class Mismatch:
    rid: str
    position: int
    got: Any
    want: Any


def _tokens(data: Any) -> dict[str, list[int]]:
    if not isinstance(data, dict):
        return {}
    for key in _TOKEN_KEYS:
        if isinstance(data.get(key), dict):
            data = data[key]
            break
    out = {}
    for rid, value in data.items():
        if isinstance(value, dict):
            value = next((value[k] for k in _TOKEN_KEYS if k in value), None)
        if isinstance(value, list):
            out[str(rid)] = value
    return out


def _gaps(reference: Any) -> dict[str, list[float]]:
    if not isinstance(reference, dict):
        return {}
    for key in _GAP_KEYS:
        if isinstance(reference.get(key), dict):
            return {str(k): v for k, v in reference[key].items() if isinstance(v, list)}
    nested = {}
    for rid, value in reference.get("tokens", reference).items():
        if isinstance(value, dict):
            gap = next((value[k] for k in _GAP_KEYS if k in value), None)
            if isinstance(gap, list):
                nested[str(rid)] = gap
    return nested


def tolerance(reference: Any, fallback: float = DEFAULT_TIE_TOLERANCE) -> float:
    """The tolerance the reference records, else `fallback` (the run's engine's)."""
    if isinstance(reference, dict):
        for key in ("tolerance", "tie_tolerance", "logit_tolerance"):
            if isinstance(reference.get(key), int | float):
                return float(reference[key])
    return fallback


def _compare(rid: str, got: list, want: list, gaps: list[float], tol: float) -> Mismatch | None:
    for i, expected in enumerate(want):
        actual = got[i] if i < len(got) else None
        if actual == expected:
            continue
        # A near-tie in the reference logits lets greedy decoding pick either token; after that
        # the sequences legitimately differ, so stop comparing this request.
        if actual is not None and i < len(gaps) and gaps[i] is not None and gaps[i] < tol:
            return None
        return Mismatch(rid, i, actual, expected)
    if len(got) > len(want):
        return Mismatch(rid, len(want), got[len(want)], None)
    return None


def compare_outputs(
    outputs: Any, reference: Any, fallback: float = DEFAULT_TIE_TOLERANCE
) -> list[Mismatch] | None:
    """Mismatches per request; None when either side is absent (nothing to compare).
    `fallback`: the tie tolerance when the reference records none (the run's engine's)."""
    got, want = _tokens(outputs), _tokens(reference)
    if outputs is None or reference is None or not want:
        return None
    gaps, tol = _gaps(reference), tolerance(reference, fallback)
    found = []
    for rid in sorted(want):
        m = _compare(rid, got.get(rid, []), want[rid], gaps.get(rid, []), tol)
        if m:
            found.append(m)
    return found
