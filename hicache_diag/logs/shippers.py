"""Log shippers that write each line as a JSON object: docker's and containerd's json-file
(`{"log": "...\\n", "stream": "stderr", "time": ...}`), Kubernetes records of fluentd / Fluent
Bit (`"kubernetes": {...}`), Fluent Bit's `{"date": ..., "log": ...}`, GCP Cloud Logging
(`textPayload`, `jsonPayload.message`), Loki exports (`line`), journald's JSON export
(`MESSAGE`), JSON loggers (`message` / `msg`). The first lines tell whether a file is one and
which field holds the text; each line is then decoded field by field (escaped ANSI colours
come out as escapes, which logs/paste.py strips), a record that holds several lines (a
traceback logged at once) gives them all, and docker's records of a line split at 16 KB (no
newline at their end) are joined back."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hicache_diag.logs.chunks import Blank
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.texts import Text, expand

_PROBE = 50  # first non-blank lines looked at
_FIELDS = ("log", "textPayload", "line", "MESSAGE", "message", "msg")


@dataclass(frozen=True, slots=True)
class Shipper:
    name: str
    field: str  # the record's field that holds the text (`jsonPayload.message`: nested)
    newline_ended: bool  # each record's text ends with its newline (docker): one without is partial


def _record(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _text_field(record: dict) -> str | None:
    for name in _FIELDS:
        if isinstance(record.get(name), str):
            return name
    payload = record.get("jsonPayload")
    if isinstance(payload, dict) and isinstance(payload.get("message"), str):
        return "jsonPayload.message"
    return None


def _name(record: dict, field: str) -> str:
    if "kubernetes" in record:
        return "Kubernetes (fluentd / Fluent Bit)"
    if field == "log" and "date" in record:
        return "Fluent Bit"
    if field == "log":
        return "docker / containerd json-file"
    if field in ("textPayload", "jsonPayload.message"):
        return "GCP Cloud Logging"
    if field == "line":
        return "Loki export"
    if field == "MESSAGE":
        return "journald JSON export"
    return "JSON logger"


def detect(head: list[str]) -> Shipper | None:
    """The shipper the first lines were written by, or None when they are not JSON lines."""
    lines = [s for s in head if s.strip()][:_PROBE]
    records = [r for r in map(_record, (s.strip() for s in lines)) if r is not None]
    fields = [f for f in map(_text_field, records) if f]
    if not lines or len(fields) * 10 < len(lines) * 6:
        return None
    field = max(set(fields), key=fields.count)
    first = next(r for r in records if _text_field(r) == field)
    texts = [_value(r, field) for r in records]
    ended = sum(1 for t in texts if t and t.endswith("\n"))
    return Shipper(_name(first, field), field, ended * 10 >= len(texts) * 8)


def _value(record: dict, field: str) -> str | None:
    if field == "jsonPayload.message":
        payload = record.get("jsonPayload")
        value = payload.get("message") if isinstance(payload, dict) else None
    else:
        value = record.get(field)
    return value if isinstance(value, str) else None


def decode(
    raw: Iterable[str | Blank | Text], shipper: Shipper, notes: FramingNotes
) -> Iterator[str | Blank]:
    """The lines the records hold; a line that is no record of the shipper passes as it is."""
    notes.json_shipper = shipper.name
    partial = ""
    for item in expand(raw):  # a Text's lines are records each
        if type(item) is Blank:
            yield item
            continue
        record = _record(item.strip())  # type: ignore[union-attr]
        text = _value(record, shipper.field) if record is not None else None
        if text is None:
            if partial:
                yield from partial.split("\n")
                partial = ""
            yield item.rstrip("\r\n")  # type: ignore[union-attr]
            continue
        notes.json_lines += 1
        text = partial + text
        if shipper.newline_ended and not text.endswith("\n"):
            partial = text  # docker split a long line: the rest comes in the next record
            continue
        partial = ""
        yield from text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    if partial:
        yield from partial.split("\n")


def unship(raw: Iterator[str | Blank | Text], notes: FramingNotes) -> Iterator[str | Blank | Text]:
    """`raw` decoded when its first lines are a shipper's JSON lines, else as it is."""
    head = list(itertools.islice(raw, _PROBE * 2))
    shipper = detect([x for x in head if type(x) is str])
    stream = itertools.chain(head, raw)
    return decode(stream, shipper, notes) if shipper is not None else stream
