"""first_divergence/rank{r}.json's record (docs/evidence.md, "The first-divergence block"): what
one rank held when SGLang's rank consensus checker found the ranks disagreeing, written by the
plugin (engines/sglang/plugin/consensus_block.py) in the checker's own thread just before SGLang's
`os._exit(1)`, and read by `report` and `export` through `read_blocks`. Standard library only
(the plugin imports it inside SGLang).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.evidence.layout import FIRST_DIVERGENCE, divergence_json, rank_files
from hicache_diag.evidence.record import Record, json_text, read_record
from hicache_diag.evidence.recording_dump import ThreadDump
from hicache_diag.evidence.step import StepRecord

DETECTED_BY = "sglang-rank-consensus-checker"
LAST_STEPS = 16  # the step lines kept: enough to see the ranks part, small enough to read
TAIL_BYTES = 1 << 18  # how far back in rank{r}.jsonl the last steps are looked for


@dataclass(frozen=True, slots=True)
class DivergenceBlock(Record):
    """One rank's state at the mismatch. `events` is this rank's share of the batch the checker
    hashed (its `@rank_consensus` calls, as SGLang formatted them); `steps` the rank's last
    recorded step lines; `errors` what could not be read (never a guessed value)."""

    nested = {"steps": StepRecord, "stacks": ThreadDump}

    rank: int = 0
    pp: int = 0
    tp: int = 0
    pid: int | None = None
    t: float | None = None
    detected_by: str = DETECTED_BY
    thread: str | None = None  # the thread that saw the mismatch (SGLang's checker worker)
    n_events: int | None = None
    local_hash: str | None = None
    events: list[str] = field(default_factory=list)
    checker_line: str = ""  # SGLang's CRITICAL line, capped
    step: int | None = None  # the recorder's step counter at the mismatch
    steps: list[StepRecord] = field(default_factory=list)
    queues: dict[str, int] = field(default_factory=dict)
    device_free: int | None = None
    host_free: int | None = None
    tree_digest: str | None = None
    stacks: list[ThreadDump] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    took_ms: float | None = None  # building the block, from SGLang's line to the write

    @property
    def last_step(self) -> StepRecord | None:
        busy = [s for s in self.steps if not s.idle]
        return busy[-1] if busy else (self.steps[-1] if self.steps else None)


def write_block(run_dir: Path | str, block: DivergenceBlock) -> Path:
    """The one writer: atomically (a rank killed mid-write leaves no half block)."""
    path = divergence_json(run_dir, block.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json_text(block))
    os.replace(tmp, path)
    return path


def read_blocks(run_dir: Path | str) -> dict[int, DivergenceBlock]:
    """rank -> block, for every rank that wrote one ({} when none did); a file that is not a
    block raises ValueError naming it."""
    found = {}
    for rank, path in rank_files(Path(run_dir) / FIRST_DIVERGENCE, "rank*.json").items():
        try:
            found[rank] = read_record(DivergenceBlock, path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return found


def tail_steps(path: Path | str, n: int = LAST_STEPS) -> list[StepRecord]:
    """The last `n` whole step lines of a rank{r}.jsonl being written (a torn last line is
    skipped), reading at most TAIL_BYTES from its end."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            raw = fh.read()
    except OSError:
        return []
    lines = raw.decode(errors="replace").splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first is cut
    out = []
    for text in reversed(lines):
        rec = StepRecord.parse(text) if text.strip() else None
        if rec is not None:
            out.append(rec)
        if len(out) == n:
            break
    return out[::-1]


def events_of(message: str) -> list[str]:
    """The `events = [...]` list of the checker's line, as SGLang wrote it (repr of a list of
    str); [] when it is not one."""
    import ast

    text = message.split("events = ", 1)[1] if "events = " in message else ""
    try:
        value: Any = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
