"""Undo what carriers do to log lines before we read them: collector prefixes, partial lines,
prefixes glued onto the previous line, tracebacks flattened onto one line.

Real SGLang logs reach an engineer through Kubernetes (CRI `<ts> stdout F `), `kubectl logs
--timestamps`, docker compose (`sglang-1  | `), journald, Loki / Grafana exports (an epoch or
time column, `{labels}`), dashboard table pastes (`| time | line |`), Ray, torchrun or mpirun
prefixes, and issue threads where a traceback was pasted as one line.
"""

from __future__ import annotations

import re

_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# Kubernetes CRI log format: `<RFC3339Nano> <stream> <P|F> <text>`; P = a partial line.
_CRI = re.compile(rf"^{_TS}\s+(?:stdout|stderr)\s+(?P<tag>[FP])(?: |$)")
_CARRIERS = (
    # `kubectl logs --timestamps`, `docker logs -t`: an RFC 3339 stamp and one space.
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),
    # Loki / Grafana exports: an epoch column (s, ms, us or ns), a tab- or space-separated time
    # column, a `{label="v"}` column.
    re.compile(r"^\d{10}(?:\d{3}){0,3}(?:\t|\s+(?=\S))"),
    re.compile(rf"^{_TS}\t"),
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
    re.compile(r"^\((?:[A-Za-z_][\w:.-]* )?(?:[\w.]+=[\w.:-]+(?:,? )?)+\)\s"),
    # torchrun `--tee` / `--log-dir` (`[rank0]: `, `[default0]:`) and mpirun `[1,0]<stderr>:`.
    re.compile(r"^\[(?:rank|default)\d+\]:\s?"),
    re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:\s?"),
    # vLLM / Python logging headers in front of a message.
    re.compile(
        r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
        r"\[[^\]]+\] "
    ),
)
# A dashboard table row: `| 2024-07-01 18:00:57.123 | <line> |` (cells that are only a time,
# an epoch or a level are dropped).
_TABLE_CELL = re.compile(
    rf"^\|?\s*(?:{_TS}|\d{{10,19}}|INFO|WARN(?:ING)?|ERROR|DEBUG|stdout|stderr)\s*\|\s?"
)
# An SGLang prefix glued onto the end of the previous line (two writers on one stream).
_GLUED = re.compile(
    r"(?<=\S)(?=\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*\] )"
)
_TRACEBACK = "Traceback (most recent call last):"
_FLAT_FRAME = re.compile(r'\s*(?=File "[^"]+", line \d+)')
_FLAT_HEAD = re.compile(
    r'^File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\s*(?P<rest>.*)$'
)
_FLAT_EXC = re.compile(
    r"(?:^|\s)(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)(?::\s.*)?)$"
)


def strip_carrier(line: str) -> str:
    """Remove collector prefixes from one line (several may stack: CRI around docker)."""
    for _ in range(4):
        before = line
        if line.startswith("|"):
            line = line.rstrip().removesuffix("|").rstrip() if line.rstrip().endswith("|") else line
        line = _TABLE_CELL.sub("", line, count=1) if _TABLE_CELL.match(line) else line
        for carrier in _CARRIERS:
            line = carrier.sub("", line, count=1)
        if line == before:
            break
    return line


def unflatten_traceback(line: str) -> list[str]:
    """`... Traceback (most recent call last): File "a.py", line 3, in f  x() ValueError: y` on
    one line -> the lines Python printed."""
    head, sep, rest = line.partition(_TRACEBACK)
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


def normalise(raw: list[str]) -> list[str]:
    """Every carrier undone, partial CRI lines joined, glued and flattened lines split."""
    out: list[str] = []
    partial = ""
    for line in raw:
        line = line.rstrip("\r\n")
        if m := _CRI.match(line):
            text = line[m.end() :]
            if m["tag"] == "P":
                partial += text
                continue
            line, partial = partial + text, ""
        line = strip_carrier(line)
        for piece in _GLUED.split(line):
            out.extend(unflatten_traceback(piece))
    if partial:
        out.append(strip_carrier(partial))
    return out
