"""The base of every run-dir record (ours): one `to_json` writer and one `from_json` reader,
lossless both ways, and the one JSON text a run-dir file is written as. Standard library only.

Lossless: a record read from a file writes back exactly what the file held. Keys the record
does not know are kept in `extra` (a newer writer's, an engine's own); the record's own keys the
file did not have (an older writer's) are listed in `absent` and stay out when written back, so
an old run's files are never rewritten with keys their writer did not know. A record built by
a writer has nothing absent: every key is written (a key is never dropped).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hicache_diag.evidence import files

R = TypeVar("R", bound="Record")
_BOOKKEEPING = ("extra", "absent")


@dataclass(frozen=True, slots=True)
class Record:
    """`nested` maps a key to the record type its value is read as (a list of them when the
    value is a list); every other value is kept as JSON gave it."""

    nested: ClassVar[dict[str, type[Record]]] = {}
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    absent: frozenset[str] = field(default=frozenset(), kw_only=True, repr=False)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The JSON keys this record knows, in field order."""
        return _keys(cls)

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any] | None) -> R:
        """Every key of `data` kept: known ones typed, the rest in `extra`."""
        known, nested, types = _key_set(cls), cls.nested, _types(cls)
        kwargs, extra = {}, {}
        for k, v in (data or {}).items():
            if k not in known:
                extra[k] = v
                continue
            if not isinstance(v, types[k]):  # a file is input: a wrong type is damage, said
                raise ValueError(f"{k!r} is a JSON {_json_kind(v)}, not {_expected(types[k])}")
            kwargs[k] = _read(nested[k], v) if k in nested else v
        return cls(**kwargs, extra=extra, absent=known.difference(kwargs))

    def to_json(self) -> dict[str, Any]:
        nested, absent = self.nested, self.absent
        out = {
            k: _write(getattr(self, k)) if k in nested else getattr(self, k)
            for k in _keys(type(self))
            if k not in absent
        }
        out.update(self.extra)
        return out


# A field's annotation (a string: `from __future__ import annotations`) -> the JSON values it
# takes. A record nested in another is a JSON object; a name not listed is not checked.
# Scalars are read leniently (a time as epoch seconds or ISO text, a null for "not known"): what
# must hold is that a container is the container its readers walk, and a number a number.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int, float, type(None)),
    "float": (int, float, type(None)),
    "str": (str, int, float, type(None)),
    "bool": (bool, int, type(None)),
    "list": (list,),
    "dict": (dict,),
    "Counts": (dict,),
    "None": (type(None),),
}


@functools.cache
def _types(cls: type[Record]) -> dict[str, tuple[type, ...]]:
    out = {}
    for f in fields(cls):
        if f.name in _BOOKKEEPING:
            continue
        allowed: tuple[type, ...] = ()
        for alternative in str(f.type).split("|"):
            head = alternative.strip().split("[", 1)[0]
            if head in _JSON_TYPES:
                allowed += _JSON_TYPES[head]
            elif f.name in cls.nested:
                allowed += (dict,)  # a record (a list of them: `list[...]` above)
            else:
                allowed = (object,)  # Any, or a type this table does not know: unchecked
                break
        out[f.name] = allowed
    return out


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _expected(allowed: tuple[type, ...]) -> str:
    names = dict.fromkeys(_json_kind(t()) if t is not type(None) else "null" for t in allowed)
    return " or ".join(names)


@functools.cache
def _keys(cls: type[Record]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name not in _BOOKKEEPING)


@functools.cache
def _key_set(cls: type[Record]) -> frozenset[str]:
    return frozenset(_keys(cls))


def _read(kind: type[Record] | None, value: Any) -> Any:
    if kind is None or value is None:
        return value
    if isinstance(value, list):
        if not all(isinstance(v, dict) for v in value):
            raise ValueError(f"a list of {kind.__name__} holds a value that is not an object")
        return [kind.from_json(v) for v in value]
    return kind.from_json(value) if isinstance(value, dict) else value


def _write(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [v.to_json() if isinstance(v, Record) else v for v in value]
    return value


def json_text(data: Any) -> str:
    """A run-dir JSON file (a record or plain JSON) as every writer writes it."""
    data = data.to_json() if isinstance(data, Record) else data
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Atomically (evidence/files.py): a reader never sees half a file, a full disk leaves the
    old one (or none) whole."""
    files.write_atomic(path, json_text(data))


def read_json(path: Path) -> Any:
    """The parsed file, read as hostile input (files.py: a regular file, bounded in size and
    nesting); OSError / ValueError are the caller's to word."""
    return files.read_json(path)


def read_record(kind: type[R], path: Path) -> R:
    """A run-dir file read as its record; ValueError when it holds no JSON object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not an object")
    return kind.from_json(data)
