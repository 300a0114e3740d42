"""Records glued onto one physical line, split again: two writers on one stream lose the
newline between their records (a stats line glued to the next, a watchdog line glued to a tqdm
bar), a paste flattens a traceback onto one line. A record starts with its own stamp or level
marker (SGLang's label, torchrun's `[rank5]:`, an RFC 3339 or Python logging stamp, vLLM's
`ERROR 01-31 10:15:44`, a process prefix `(Worker_TP1 pid=9)`, glog's `[E602 11:17:52.1 `):
where one starts right after text, a new line starts. A traceback's frames glued together
(with or without its header) are split into the lines Python printed."""

from __future__ import annotations

import re

from hicache_diag.logs.carriers import TRACEBACK, unflatten_traceback
from hicache_diag.rules.rank_labels import split_prefix

# A record's start right after a non-blank (a blank before it is a message's own text); a bare
# stamp or level only after what ends a record or a progress bar (never inside a bracket, a
# `key=value` or a longer figure).
_RECORD_MID = re.compile(
    r"(?<=\S)(?="
    r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"
    r"|\[(?:[A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5} ?){1,8}\] "
    r"|\[rank\d{1,6}\]:"
    r"|\[[EWIF]\d{4} \d\d:\d\d:\d\d"
    r"|\([A-Za-z_][\w.-]{0,40} pid=\d{1,9}[,)]"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d) "
    r")"
    r"|(?<=[\])|>%.!?A-Za-z])(?="
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
    r")"
)
# Characters a record start begins with: a line with none after its first is never split.
_STARTS = ("[", "(", "INFO", "WARN", "ERROR", "DEBUG", "CRIT", "20", "19")
_FRAME = 'File "'


def record_starts(line: str) -> list[int]:
    """Where records glued onto this line start (never 0)."""
    if not any(line.find(s, 1) > 0 for s in _STARTS):
        return []
    return [m.start() for m in _RECORD_MID.finditer(line, 1)]


def split_records(line: str) -> list[str]:
    """The line cut where glued records start."""
    cuts = record_starts(line)
    if not cuts:
        return [line]
    return [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)], strict=True)]


def flattened(line: str) -> bool:
    """A traceback (or its frames) flattened onto this line (a rank label before a frame is
    the line's own)."""
    if TRACEBACK in line:
        return True
    at = line.find(_FRAME)
    if at < 0:
        return False
    head = line[:at]
    if head[:1] == "[" and (parts := split_prefix(head)) is not None and not parts[2].strip():
        head = ""
    return bool(head.strip()) or line.find(_FRAME, at + 1) > 0


def unflatten(line: str) -> list[str]:
    """The lines Python printed, from a traceback (or a run of its frames) on one line."""
    if TRACEBACK in line:
        return unflatten_traceback(line)
    at = line.find(_FRAME)
    head = line[:at]
    lines = unflatten_traceback(TRACEBACK + " " + line[at:])[1:]
    if len(lines) < 1:
        return [line]
    return ([head.rstrip()] if head.strip() else []) + lines
