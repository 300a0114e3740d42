"""Value types of fault keys: each parser turns the spec's text into a typed value or says why not.

A parser raises ValueError whose message is the expectation ("a number >= 0"), so the caller can
name the fault, the key and the bad text in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

Parser = Callable[[str], Any]

ALL_RANKS = "*"


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("a finite number")
    return value


def real(text: str) -> float:
    """Any finite number (offsets and drifts may be negative)."""
    return _number(text)


def millis(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise ValueError("a number of milliseconds >= 0")
    return value


def probability(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("a probability between 0 and 1")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("an integer") from None


def step(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise ValueError("a step number >= 0")
    return value


def count(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise ValueError("an integer >= 1")
    return value


def tokens(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise ValueError("a token count >= 0")
    return value


def seed(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise ValueError("an integer >= 0")
    return value


def ranks(text: str) -> tuple[int, ...] | None:
    """`1`, `1|2` or `*`; None means every rank."""
    if text.strip() == ALL_RANKS:
        return None
    expected = "a rank (e.g. 1), ranks joined by | (e.g. 1|2), or *"
    parts = [p.strip() for p in text.split("|")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(expected)
    return tuple(sorted({int(p) for p in parts}))


def choice(*choices: str) -> Parser:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return text

    return parse


def key(default: Any, parser: Parser, doc: str) -> Any:
    """A fault key: a dataclass field whose metadata carries its parser and one-line doc."""
    return field(default=default, metadata={"parse": parser, "doc": doc})
