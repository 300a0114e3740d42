"""How a log reaches triage: each delivery re-sends a case's files the way a carrier, a terminal
or an operator would (collector prefixes: CRI, compose, journald, Loki, kubectl / docker -t,
a viewer's bracketed ISO stamp; colours, CRLF, editor numbers, terminal wrap, the
operator's own stop appended, per-node files, a head cut off, gzip). A verdict must not depend
on which one brought the text: tests/unit/triage/test_metamorphic.py and
bench/triage_accuracy.py run every corpus case through every delivery.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.rules.rank_labels import split_prefix
from hicache_diag.triage.report import TriageReport
from hicache_diag.triage.session import TriageRequest, run_triage

File = tuple[str, bytes]  # (file name, content as written to disk)
Delivery = Callable[[list[File]], list[File]]

_STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# Lines that carry evidence: a head cut never reaches past the first of them.
_EVIDENCE = re.compile(
    r"Traceback|Error|Exception|[Ww]atchdog|Timeout|Timed out|Pyspy|^Thread |^Process \d|Fatal"
    r"|SIG[A-Z]{3,4}|terminate called|^\s+File \"|debug info|cur_batch|Current thread"
    r"|[Bb]atch[,.]|#running-req|fired up|HTTP/1|throughput: "
)


def _text(content: bytes) -> str:
    return content.decode("utf-8", errors="replace")


def per_line(fn: Callable[[int, str], str]) -> Delivery:
    """A delivery that rewrites every line of every file on its own."""

    def deliver(files: list[File]) -> list[File]:
        out = []
        for name, content in files:
            lines = _text(content).split("\n")
            tail = lines.pop() if lines and lines[-1] == "" else None
            new = [fn(i, line) for i, line in enumerate(lines)]
            out.append((name, ("\n".join(new) + ("\n" if tail is not None else "")).encode()))
        return out

    return deliver


def _ansi(_: int, line: str) -> str:
    """Colours as a terminal logger paints them: the prefix green, error lines red."""
    parts = split_prefix(line)
    if parts is not None and line.startswith("["):
        head, _, rest = line.partition("]")
        line = f"\x1b[32m{head}]\x1b[0m{rest}"
    if "Error" in line or "Traceback" in line:
        line = f"\x1b[1;31m{line}\x1b[0m"
    return line


def _wrap(width: int) -> Delivery:
    def deliver(files: list[File]) -> list[File]:
        out = []
        for name, content in files:
            pieces = []
            for line in _text(content).split("\n"):
                while len(line) > width:
                    pieces.append(line[:width])
                    line = line[width:]
                pieces.append(line)
            out.append((name, "\n".join(pieces).encode()))
        return out

    return deliver


def _crlf(files: list[File]) -> list[File]:
    return [(n, _text(c).replace("\n", "\r\n").encode()) for n, c in files]


def _gzip(files: list[File]) -> list[File]:
    return [(f"{n}.gz", gzip.compress(c, mtime=0)) for n, c in files]


TEARDOWN = (
    "[{ts}] SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
    "[{ts}] Gracefully exiting... Remaining number of requests 0. Remaining requests "
    "remaining_rids=[].",
    "[{ts}] Subprocess scheduler_0 (pid=4242) crashed with exit code -15. Triggering SIGQUIT "
    "for cleanup...",
    "[{ts}] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    "[{ts}] kill_process_tree called: parent_pid=4200, include_parent=True, pid=4200",
)


def operator_teardown(files: list[File]) -> list[File]:
    """SGLang's own teardown after the operator's SIGTERM, appended to the last file, stamped
    with the last time the case shows."""
    stamps = [m.group(0) for _, c in files for m in _STAMP.finditer(_text(c))]
    ts = max(stamps).replace("T", " ") if stamps else "2026-01-01 00:00:00"
    name, content = files[-1]
    text = _text(content)
    text += ("" if text.endswith("\n") or not text else "\n") + "\n".join(
        t.format(ts=ts) for t in TEARDOWN
    )
    return [*files[:-1], (name, (text + "\n").encode())]


def split_nodes(files: list[File]) -> list[File]:
    """Each file split in two per-node files: a line goes where its rank lives (PP stages
    alternate between the nodes), unprefixed lines follow the line before them."""
    out: list[File] = []
    for name, content in files:
        nodes: list[list[str]] = [[], []]
        node = 0
        for line in _text(content).split("\n"):
            parts = split_prefix(line)
            if parts is not None:
                tokens = parts[1] or ""
                m = re.search(r"PP(\d+)", tokens) or re.search(r"TP(\d+)", tokens)
                node = int(m.group(1)) % 2 if m else 0
            nodes[node].append(line)
        for k, lines in enumerate(nodes):
            if any(s.strip() for s in lines):
                out.append((f"node{k}-{name}", "\n".join(lines).encode()))
    return out


def cut_head(files: list[File]) -> list[File]:
    """The paste starts late: the first fifth of the first file is gone, up to (not into) the
    first line that carries evidence."""
    name, content = files[0]
    lines = _text(content).split("\n")
    first = next((i for i, s in enumerate(lines) if _EVIDENCE.search(s)), len(lines))
    cut = min(len(lines) // 5, first)
    return [(name, "\n".join(lines[cut:]).encode()), *files[1:]]


@dataclass(frozen=True, slots=True)
class DeliveryKind:
    name: str
    deliver: Delivery
    kinds: frozenset[str] | None = None  # only cases of these verdicts (None: every case)


_STOPPABLE = frozenset({"hang", "busy", "healthy"})
_CRI = "2026-06-24T17:38:{s:02d}.{i:09d}Z stderr F "
_JOURNALD = "Jun 24 17:38:03 gpu-node-3 python3[4242]: "
DELIVERIES: tuple[DeliveryKind, ...] = (
    DeliveryKind("cri", per_line(lambda i, s: _CRI.format(s=i % 60, i=i) + s)),
    DeliveryKind("compose", per_line(lambda _i, s: f"sglang-1  | {s}")),
    DeliveryKind("journald", per_line(lambda _i, s: _JOURNALD + s)),
    DeliveryKind("loki", per_line(lambda i, s: f"{1719250683000000000 + i}\t{s}")),
    DeliveryKind("kubectl", per_line(lambda i, s: f"2026-06-24T17:38:03.{i:09d}Z {s}")),
    DeliveryKind("iso-bracket", per_line(lambda i, s: f"[2026-06-24T17:38:03.{i:03d}Z] {s}")),
    DeliveryKind("ansi", per_line(_ansi)),
    DeliveryKind("crlf", _crlf),
    DeliveryKind("numbered", per_line(lambda i, s: f"{i + 1:>6}\t{s}")),
    DeliveryKind("numbered-bar", per_line(lambda i, s: f"{i + 1:>4} | {s}")),
    DeliveryKind("wrap80", _wrap(80)),
    DeliveryKind("wrap100", _wrap(100)),
    DeliveryKind("wrap120", _wrap(120)),
    DeliveryKind("teardown", operator_teardown, _STOPPABLE),
    DeliveryKind("nodes", split_nodes),
    DeliveryKind("head-cut", cut_head),
    DeliveryKind("gzip", _gzip),
)


def case_files(path: Path, mode: str) -> list[File]:
    """The log files of a corpus case (`mode` as in samples/corpus/expected.json)."""
    if mode == "logs+dumps":
        paths = sorted(path.glob("*.log"))
    elif path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.is_file())
    else:
        paths = [path]
    return [(p.name, p.read_bytes()) for p in paths]


def triage_case(
    path: Path, mode: str, delivery: DeliveryKind | None, workdir: Path
) -> TriageReport:
    """Triage one corpus case as `hicache-diag triage` would, its logs re-delivered first
    (written under `workdir`). A dumps-only case is triaged as it is."""
    if mode == "dumps":
        return run_triage(TriageRequest(dumps=(path,)))
    files = case_files(path, mode)
    if delivery is not None:
        files = delivery.deliver(files)
    workdir.mkdir(parents=True, exist_ok=True)
    logs = []
    for name, content in files:
        (workdir / name).write_bytes(content)
        logs.append(workdir / name)
    dumps = (path / "dumps",) if mode == "logs+dumps" else ()
    return run_triage(TriageRequest(logs=tuple(logs), dumps=dumps))


def verdict(report: TriageReport) -> tuple[str, str | None, str | None]:
    """What a delivery must not change: kind, form and culprit."""
    culprit = report.culprit.rank.label if report.culprit else None
    return report.kind, report.form, culprit
