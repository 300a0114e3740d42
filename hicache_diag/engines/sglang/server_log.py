"""What SGLang's own log says about how a run ended: its scheduler watchdog, and the py-spy
dumps it took of its schedulers (`Pyspy dump for PID N (...)`), harvested into stacks/.

SGLang's watchdog fires in the scheduler that *waits* for a batch to finish (often PP0 in a PP
send or recv), dumps stacks, and then the launcher tears every process down (SIGQUIT, then
kill_process_tree): the deaths that follow are SGLang's reaction to a hang, not the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.evidence.ranks import RankId, parse_rank_tokens

_WATCHDOG_RE = re.compile(
    r"^\[(?P<ts>[\d-]+ [\d:]+)(?P<tokens>(?: [A-Z_]+\d+)*)\] Scheduler watchdog timeout "
    r"\(self\.watchdog_timeout=(?P<timeout>[\d.]+), self\.soft=(?P<soft>True|False)\)"
)
_DUMP_RE = re.compile(r"Pyspy dump for PID (?P<pid>\d+)\b")
_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d ")


@dataclass(frozen=True, slots=True)
class WatchdogFiring:
    rank: int
    timeout_s: float
    line: str


def watchdog_firing(text: str, tp_size: int) -> WatchdogFiring | None:
    """The first hard (soft=False) scheduler watchdog timeout SGLang logged, if any."""
    for line in text.splitlines():
        m = _WATCHDOG_RE.match(line)
        if m and m["soft"] == "False":
            rank = (parse_rank_tokens(m["tokens"]) or RankId()).flat(tp_size)
            return WatchdogFiring(rank, float(m["timeout"]), line.strip())
    return None


def harvest_pyspy_dumps(text: str, ranks_by_pid: dict[int, int], stacks_dir: Path) -> list[int]:
    """Write SGLang's first py-spy dump of each scheduler to stacks/rank{r}.txt (py-spy text, as
    triage reads it); returns the ranks written. Ours, when we took one, is never overwritten."""
    blocks: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _DUMP_RE.search(line) if _PREFIX.match(line) else None
        if m:
            pid = int(m["pid"])
            current = None if pid in blocks else blocks.setdefault(pid, [])
            continue
        if _PREFIX.match(line):
            current = None
        elif current is not None:
            current.append(line)
    written = []
    for pid, lines in blocks.items():
        rank = ranks_by_pid.get(pid)
        if rank is None or not any(ln.strip() for ln in lines):
            continue
        path = ev.stack_txt(stacks_dir.parent, rank)
        if path.exists() or ev.stack_json(stacks_dir.parent, rank).exists():
            continue
        stacks_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines).strip() + "\n")
        written.append(rank)
    return sorted(written)
