"""Collector prefixes (carriers) a log line may sit behind, peeled off one line at a time, and
tracebacks flattened onto one line, split back into the lines Python printed (triage.lines runs
both before the log reader sees a line).

Real SGLang logs reach an engineer through Kubernetes (CRI `<ts> stdout F `), `kubectl logs
--timestamps`, docker compose (`sglang-1  | `), journald, Loki / Grafana exports (an epoch or
time column, `{labels}`), dashboard table pastes (`| time | line |`), Ray, torchrun or mpirun
prefixes; wrappers nobody listed here are found by triage.framing.
"""

from __future__ import annotations

import re

from hicache_diag.logs.speakers import speaker_label
from hicache_diag.rules.rank_labels import split_prefix

TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# Kubernetes CRI log format: `<RFC3339Nano> <stream> <P|F> <text>`; P = a partial line.
_CRI = re.compile(rf"^{TS}\s+(?:stdout|stderr)\s+(?P<tag>[FP])(?: |$)")
_CARRIERS = (
    # `kubectl logs --timestamps`, `docker logs -t`: an RFC 3339 stamp and one space.
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),
    # Loki / Grafana exports: an epoch column (s, ms, us or ns), a tab- or space-separated time
    # column, a `{label="v"}` column.
    re.compile(r"^\d{10}(?:\d{3}){0,3}(?:\t|\s+(?=\S))"),
    re.compile(rf"^{TS}\t"),
    re.compile(r"^\{[^{}]*=[^{}]*\}\s+"),
    # log viewers that bracket their own stamp: `[2025-11-06T02:08:27.278Z] `.
    re.compile(r"^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\] ?"),
    # Python logging in a wrapper: `2025-03-07 23:50:27,531 - __main__ - INFO - `.
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - \S+ - [A-Z]+ - "),
    # journald / syslog: `Jul 01 18:00:57 host python3[123]: `.
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^:\s]+(?:\[\d+\])?: "),
    # docker compose: `sglang-1  | `.
    re.compile(r"^[\w.-]+\s+\|(?: |$)"),
    # Ray / vLLM workers: `(SchedulerActor pid=1234, ip=10.0.0.1) `, `(VllmWorker rank=0 pid=9) `.
    # The key=value pairs are bounded and comma/space-separated, so no pair can split another.
    re.compile(
        r"^\((?:[A-Za-z_][\w:.-]{0,80} )?[\w.]{1,40}=[\w.:-]{1,80}(?:,? [\w.]{1,40}="
        r"[\w.:-]{1,80}){0,8}\)\s"
    ),
    # torchrun `--tee` / `--log-dir` (`[rank0]: `, `[default0]:`) and mpirun `[1,0]<stderr>:`.
    re.compile(r"^\[(?:rank|default)\d+\]:\s?"),
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:\s?"),
    # vLLM / Python logging headers in front of a message.
    re.compile(
        r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
        r"\[[^\]]{0,200}\] "
    ),
)
# What each carrier above is, for the report's framing line.
CARRIER_NAMES = (
    "kubectl / docker timestamps",
    "Loki epoch column",
    "Loki time column",
    "Loki labels",
    "a viewer's bracketed ISO stamp",
    "Python logging header",
    "journald",
    "docker compose",
    "Ray / vLLM process prefix",
    "torchrun rank prefix",
    "mpirun rank prefix",
    "vLLM / Python logging header",
)
# A dashboard table row: `| 2024-07-01 18:00:57.123 | <line> |` (cells that are only a time,
# an epoch or a level are dropped).
_TABLE_CELL = re.compile(
    rf"^\|?\s*(?:{TS}|\d{{10,19}}|INFO|WARN(?:ING)?|ERROR|DEBUG|stdout|stderr)\s*\|\s?"
)
# Does any carrier start this line? One match instead of a dozen on a plain SGLang log.
ANY_CARRIER = re.compile(
    "|".join(f"(?:{p.pattern})" for p in (_CRI, *_CARRIERS, _TABLE_CELL)) + r"|\|"
)

TRACEBACK = "Traceback (most recent call last):"
# Anchored on what precedes the frame (start or a non-space), so a run of blanks is scanned once.
_FLAT_FRAME = re.compile(r'(?:(?<=\S)|^)\s*(?=File "[^"\n]{1,2000}", line \d)')
_FLAT_HEAD = re.compile(
    r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\s*(?P<rest>.*)$'
)
_FLAT_EXC = re.compile(
    r"(?:^|\s)(?P<exc>(?:[A-Za-z_]\w{0,80}\.){0,16}[A-Z]\w{0,120}(?:Error|Exception|Interrupt|Exit)"
    r"(?::\s.*)?)$"
)


def _strip_once(line: str) -> tuple[str, str | None]:
    """One pass of every carrier; the worker rank a layer named (logs/speakers.py), if any."""
    speaker = None
    if line.startswith("|"):
        line = line.rstrip().removesuffix("|").rstrip() if line.rstrip().endswith("|") else line
    line = _TABLE_CELL.sub("", line, count=1) if _TABLE_CELL.match(line) else line
    for carrier in _CARRIERS:
        if line[:1] == "(" and speaker is None:
            speaker = speaker_label(line)
        line = carrier.sub("", line, count=1)
    return line, speaker


def peel(line: str) -> tuple[str, bool]:
    """Remove collector prefixes from one line, several stacked in any order (CRI around
    docker around Loki); True when a CRI layer marked it partial (`P`: continued next line).
    A layer that names a worker rank (logs/speakers.py) leaves that rank as a label."""
    if line[:1] != "(" and not ANY_CARRIER.match(line):
        return line, False  # no layer starts it (every carrier is anchored at the start)
    partial = False
    speaker = None
    for _ in range(6):
        if m := _CRI.match(line):
            partial = partial or m["tag"] == "P"
            line = line[m.end() :]
            continue
        before = line
        line, named = _strip_once(line)
        speaker = speaker or named
        if line == before:
            break
    if speaker and split_prefix(line) is None:
        line = f"[{speaker}] {line}"
    return line, partial


def strip_carrier(line: str) -> str:
    """Remove collector prefixes from one line (several may stack: CRI around docker)."""
    return peel(line)[0]


def unflatten_traceback(line: str) -> list[str]:
    """`... Traceback (most recent call last): File "a.py", line 3, in f  x() ValueError: y` on
    one line -> the lines Python printed."""
    head, sep, rest = line.partition(TRACEBACK)
    if not sep or 'File "' not in rest:
        return [line]
    if "\\n" in rest:  # a JSON-escaped paste keeps its newlines as `\n`
        return [head + sep, *rest.replace("\\n", "\n").splitlines()]
    chunks = [c for c in _FLAT_FRAME.split(rest.strip()) if c.strip()]
    out = [head + sep]
    for i, chunk in enumerate(chunks):
        m = _FLAT_HEAD.match(chunk.strip())
        if not m:
            continue
        out.append(f'  File "{m["file"]}", line {m["line"]}, in {m["func"]}')
        rest_text = m["rest"]
        if i == len(chunks) - 1 and (exc := _FLAT_EXC.search(rest_text)):
            code = rest_text[: exc.start("exc")].strip()
            if code:
                out.append(f"    {code}")
            out.append(exc["exc"].strip())
        elif rest_text:
            out.append(f"    {rest_text}")
    return out


def carrier_names(lines: list[str]) -> list[str]:
    """The collectors we know that start any of `lines` (the report's framing line)."""
    found: list[str] = []
    for line in lines:
        if line and ANY_CARRIER.match(line):
            if _CRI.match(line) and "Kubernetes CRI" not in found:
                found.append("Kubernetes CRI")
            for name, carrier in zip(CARRIER_NAMES, _CARRIERS, strict=True):
                if name not in found and carrier.match(peel(line)[0] if _CRI.match(line) else line):
                    found.append(name)
            if _TABLE_CELL.match(line) and "dashboard table" not in found:
                found.append("dashboard table")
    return found
