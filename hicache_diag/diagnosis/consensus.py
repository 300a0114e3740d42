"""What SGLang's own rank consensus checker reported (`--sglang-consensus-checker`).

With SGLANG_ENABLE_RANK_CONSENSUS_CHECKER set (0.5.23's `utils/rank_consensus_checker.py`),
every rank hashes the `@rank_consensus` events of its tree (match_prefix, insert, evict, ...)
and a background thread MIN/MAX-reduces the hashes; on a mismatch each rank logs one CRITICAL
line `Found rank divergence for N events(s)! local hash: H, events = [...]` and `os._exit(1)`s.
Those lines become verdict evidence; SGLang's verdict, not ours, but beside ours.
"""

from __future__ import annotations

import re

MARK = "Found rank divergence for"
ENABLED = "Rank consensus checker is enabled"  # each rank's warning at configure()
_LINE = re.compile(r"Found rank divergence for (\d+) events?\(s\)! local hash: ([0-9a-f]+)")
MAX_EVENTS_CHARS = 300


def consensus_lines(logs: dict[int, str]) -> list[str]:
    """One evidence line per rank whose log holds the checker's divergence report."""
    out = []
    for rank, text in sorted(logs.items()):
        for line in text.splitlines():
            if MARK not in line:
                continue
            found = _LINE.search(line)
            events = line.split("events = ", 1)[1] if "events = " in line else ""
            if len(events) > MAX_EVENTS_CHARS:
                events = events[:MAX_EVENTS_CHARS] + "..."
            what = f"{found.group(1)} event(s), local hash {found.group(2)[:12]}" if found else ""
            out.append(
                f"SGLang's rank consensus checker found rank divergence on rank {rank} "
                f"({what}; the scheduler exits 1): events {events}"
            )
            break
    return out


def first_event_difference(events: dict[int, list[str]]) -> tuple[int, dict[int, str]] | None:
    """The first position where the ranks' consensus events differ, with each rank's event
    there ("<none>" past a rank's last); None when all agree or fewer than two ranks wrote."""
    if len(events) < 2:
        return None
    longest = max(len(e) for e in events.values())
    for i in range(longest):
        at = {r: e[i] if i < len(e) else "<none>" for r, e in sorted(events.items())}
        if len(set(at.values())) > 1:
            return i, at
    return None


def checker_silent(logs: dict[int, str], blocks: dict) -> str | None:
    """A note when SGLang's checker ran and reported nothing: its checks cover the tree's
    `@rank_consensus` calls only, made on every rank (docs/evidence.md), so a divergence that
    one rank acts on alone, or a crash in the same slot, ends the run before it can report."""
    if blocks or not any(ENABLED in text for text in logs.values()):
        return None
    if consensus_lines(logs):
        return "SGLang's rank consensus checker fired, but no rank wrote a first-divergence block"
    return (
        "SGLang's rank consensus checker was on and reported no divergence before the run "
        "ended: it compares the tree's @rank_consensus calls every rank makes, so a call one "
        "rank makes alone, or a crash in the slot the ranks part in, ends the run first"
    )
