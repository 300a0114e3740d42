"""Which per-rank mechanism a run's own evidence names: the dynamic source probes in its step
lines (`sources`: a probe whose outcome `d` fired on one rank and not on its peer at that
step), the recorder's per-rank counters (`sessions_closed`), and SGLang's own per-rank log
lines (a deferred flush that one rank ran and another gave up). An export picks its recipe by
these, not by the run directory's name or by where the failing rank crashed (a form A crash in
the model's forward says nothing about what made the stages part)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hicache_diag.diagnosis.probe_records import WAITING as WAITING_PROBE
from hicache_diag.diagnosis.probe_records import first_drops, lone_drops, outcomes
from hicache_diag.evidence import files

SESSION = "session-clock"
FLUSH = "flush-deadline"
WAITING = "waiting-timeout"
SHORTAGE = "host-shortage"
_WAITING_ABORT = "Request waiting timeout reached"
_FLUSH_LINES = (
    ("Cache flushed successfully", "flushed"),
    ("Deferred flush_cache timed out", "timed out"),
)
_LOG_TIME = re.compile(r"^\[(?P<t>[\d-]+ [\d:]+) ")


@dataclass(frozen=True, slots=True)
class Tag:
    name: str  # a `sources` probe name (hicache_diag/evidence/probes.py)
    says: str  # one line, quoted from the run directory
    step: int | None = None
    values: dict[str, int | str] = field(default_factory=dict)  # what a test template takes


def _log(path: Path) -> str:
    try:
        return files.read_text(path)
    except (OSError, ValueError):
        return ""


def _steps(run_dir: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for path in sorted(run_dir.glob("rank*.jsonl")):
        if not path.stem.removeprefix("rank").isdigit():
            continue
        rank = int(path.stem.removeprefix("rank"))
        rows = []
        try:  # a regular file, bounded (evidence/files.py): a run dir is input
            text = files.read_bytes(path, files.MAX_STEPS_BYTES).decode("utf-8", "replace")
        except (OSError, ValueError):
            continue
        for line in text.splitlines():
            try:
                row = files.loads(line)
            except ValueError:
                continue  # a torn last line of a killed rank
            if isinstance(row, dict):
                rows.append(row)
        out[rank] = rows
    return out


def _fired(rows: list[dict], probe: str, counter: str) -> list[int]:
    """Steps at which this rank's probe outcome fired, or its counter counted."""
    hits = []
    for row in rows:
        if outcomes(row.get("sources"), probe) or row.get(counter):
            hits.append(int(row.get("step", -1)))
    return hits


def _session(steps: dict[int, list[dict]]) -> Tag | None:
    fired = {r: _fired(rows, SESSION, "sessions_closed") for r, rows in steps.items()}
    if len(fired) < 2 or len({tuple(v) for v in fired.values()}) == 1:
        return None
    parts = [
        f"rank {r} at step(s) {', '.join(map(str, v))}" if v else f"rank {r} none"
        for r, v in fired.items()
    ]
    first = min((s for v in fired.values() for s in v), default=None)
    return Tag(
        SESSION,
        "the reap tick closed a session on one rank only (`sessions_closed` / "
        f"`sources.session-clock`): {'; '.join(parts)}",
        first,
    )


def _flush_outcomes(log: str) -> list[tuple[str, str]]:
    out = []
    for line in log.splitlines():
        for text, outcome in _FLUSH_LINES:
            if text in line:
                m = _LOG_TIME.match(line)
                out.append((outcome, m["t"] if m else "?"))
    return out


def _flush(run_dir: Path, steps: dict[int, list[dict]]) -> Tag | None:
    fired = {r: _fired(rows, FLUSH, "") for r, rows in steps.items()}
    if len(fired) >= 2 and len({tuple(v) for v in fired.values()}) > 1:
        return Tag(FLUSH, f"`sources.flush-deadline` ended the flush at steps {fired}")
    logs = {
        int(p.stem.removeprefix("rank")): _flush_outcomes(_log(p))
        for p in sorted(run_dir.glob("rank*.log"))
        if p.stem.removeprefix("rank").isdigit()
    }
    if len(logs) < 2:
        return None
    ranks = sorted(logs)
    for i in range(max(len(v) for v in logs.values())):
        seen = {r: logs[r][i] if i < len(logs[r]) else ("no outcome", "-") for r in ranks}
        if len({o for o, _ in seen.values()}) > 1:
            said = ", ".join(f"rank {r} {o} ({t})" for r, (o, t) in seen.items())
            return Tag(
                FLUSH, f"deferred flush #{i + 1} ended differently per rank (rank<r>.log): {said}"
            )
    return None


def _waiting_probe(steps: dict[int, list[dict]]) -> Tag | None:
    """The plugin's `waiting-clock` probe (0.5.1x): the rids each rank's own waiting timeout
    dropped differ across ranks; the tag's step is the first lone drop."""
    rows = (
        (rank, int(row.get("step", -1)), row.get("sources"))
        for rank, rank_rows in steps.items()
        for row in rank_rows
    )
    dropped = first_drops(steps, rows)
    lone = lone_drops(dropped)
    if len(dropped) < 2 or not lone:
        return None
    step, rank, rid = lone[0]
    return Tag(
        WAITING,
        f"the waiting timeout dropped {rid} on rank {rank} at step {step} and not on every "
        f"rank (`sources.{WAITING_PROBE}`; {len(lone)} such drops in the run)",
        step,
    )


def _waiting(run_dir: Path) -> Tag | None:
    """The stages ran different requests at the first divergence, and one of them is a request
    the server answered with its own waiting-timeout abort (runs recorded before the plugin
    probed that clock: `_waiting_probe`)."""
    try:
        fd = files.read_json(run_dir / "verdict.json").get("first_divergence") or {}
        aborted = files.read_json(run_dir / "requests.json").get("aborted") or {}
        if not isinstance(fd, dict):
            return None
    except (OSError, ValueError, AttributeError):
        return None
    values = fd.get("values") or {}
    if not isinstance(aborted, dict) or not all(isinstance(v, dict) for v in values.values()):
        return None
    timed_out = {rid for rid, why in aborted.items() if _WAITING_ABORT in str(why)}
    ran = {rank: set(v) for rank, v in values.items()}
    apart = set().union(*ran.values()) - set.intersection(*ran.values()) if ran else set()
    named = sorted(apart & timed_out)
    if not named:
        return None
    per_rank = "; ".join(f"rank {r} ran {sorted(v)}" for r, v in sorted(ran.items()))
    return Tag(
        WAITING,
        f"at step {fd.get('step')} {per_rank}; the server answered "
        f"{', '.join(named)} with '{_WAITING_ABORT}' ({len(timed_out)} requests so "
        "answered in the run)",
        fd.get("step"),
    )


def _shortage_at(steps: dict[int, list[dict]]) -> tuple[int, dict] | None:
    """The first step line in which a rank recorded SGLang's own write-through shortage branch
    (`host_shortages`: host room short, `evict_host` freed too little, the backup skipped)."""
    hits = [
        (int(row.get("step", -1)), rank, row)
        for rank, rows in steps.items()
        for row in rows
        if row.get("host_shortages")
    ]
    return min(hits, key=lambda h: (h[0], h[1]))[1:] if hits else None


def _host_shortage(steps: dict[int, list[dict]]) -> Tag | None:
    """One rank skipped a write-through backup a peer took at the same step."""
    found = _shortage_at(steps)
    if found is None:
        return None
    short, row = found
    step, need = int(row["step"]), int(row["host_shortages"][0].get("need", 0))
    peers = [
        (rank, r)
        for rank, rows in steps.items()
        if rank != short
        for r in rows
        if r.get("step") == step and (r.get("write_backs") or 0) > 0
    ]
    if not peers or need <= 0:
        return None
    peer, prow = peers[0]
    topology = "pp" if prow.get("pp") != row.get("pp") else "tp"
    room = int(prow.get("host_free") or 0) + int(prow["write_backs"])
    word = "PP" if topology == "pp" else "TP"
    says = (
        f"at step {step} rank {short} ({word}{row.get(topology)}) skipped a write-through "
        f"backup of {need} tokens (`host_shortages` {row['host_shortages'][0]}), rank {peer} "
        f"({word}{prow.get(topology)}) backed up {prow['write_backs']} tokens"
    )
    values = {
        "topology": topology,
        "short_rank": int(row.get(topology) or 0),
        "kv_tokens": need,
        "roomy_host_free": room,
    }
    return Tag(SHORTAGE, says, step, values)


def run_tags(run_dir: Path) -> dict[str, Tag]:
    """The mechanisms the run's evidence names, by probe name."""
    steps = _steps(run_dir)
    found = [
        _session(steps),
        _flush(run_dir, steps),
        _waiting_probe(steps) or _waiting(run_dir),
        _host_shortage(steps),
    ]
    found = [t for t in found if t is not None]
    return {t.name: t for t in found}
