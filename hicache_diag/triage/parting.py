"""The first divergence a production recording shows (triage/recorded_align.py finds it): a
record of its own, so that reading the report needs neither pandas nor diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Parting:
    """The first divergence the recording shows. `reach`: which files showed it (lines: the
    values are the recorded ones; digests, blocks: the values rotated out, each rank's crc is
    given instead). `last_step`: blocks only, the last step of the block that differs."""

    step: int
    field: str | None
    values: dict[str, Any]
    source: str
    reach: str
    culprit_rank: int | None = None
    last_step: int | None = None
    fields: list[str] = field(default_factory=list)  # every field seen differing there
    evidence: list[str] = field(default_factory=list)
