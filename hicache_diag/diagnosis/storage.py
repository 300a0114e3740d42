"""L3 storage faults a run survived (truncated or unreadable page files, failed writes): the
ranks record them per step as `storage_faults`; the verdict lists them as evidence lines."""

from __future__ import annotations

from typing import Any

import pandas as pd

MAX_LINES = 5  # one line per fault up to this many, then a count


def storage_faults(frames: pd.DataFrame) -> list[tuple[int, int, dict[str, Any]]]:
    """(rank, step, fault) for every recorded storage fault, in step order."""
    if frames.empty or "storage_faults" not in frames.columns:
        return []
    found = []
    for rank, step, faults in zip(
        frames["rank"], frames["step"], frames["storage_faults"], strict=True
    ):
        for fault in faults if isinstance(faults, list) else []:
            if isinstance(fault, dict):
                found.append((int(rank), int(step), fault))
    return found


def storage_fault_lines(frames: pd.DataFrame) -> list[str]:
    """Evidence lines: which rank met which storage fault at which step."""
    found = storage_faults(frames)
    lines = [
        f"storage fault on rank {rank} at step {step}: {f.get('op', '?')} {f.get('key', '?')}: "
        f"{f.get('reason', '?')} (served as a miss; the run went on)"
        for rank, step, f in found[:MAX_LINES]
    ]
    if len(found) > MAX_LINES:
        lines.append(f"... {len(found) - MAX_LINES} more storage faults")
    return lines
