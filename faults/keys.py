"""Value types of fault keys: each parser turns the spec's text into a typed value or says why not.

A parser raises ValueError whose message is the expectation ("a number >= 0"), so the caller can
name the fault, the key and the bad text in one line. Every type is bounded by what the tool can
act on (a sleep of at most a day, a step or count a record holds), and its message names the
largest value accepted: a key past it is refused before any process starts, never found by a rank
whose sleep overflowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

Parser = Callable[[str], Any]

ALL_RANKS = "*"
# limits.MAX_SECONDS and limits.SEED_MAX (a test keeps them equal), not imported: this module
# also runs inside SGLang's environment (the plugin bundle), which has no psutil.
MAX_SECONDS = 86_400.0
SEED_MAX = 2**32 - 1
MAX_MS = int(MAX_SECONDS * 1000)  # a delay or offset the tool waits out: one day
MAX_US = MAX_MS * 1000
MAX_PPM = 1_000_000  # a clock rate error of 100%: past it the skewed clock runs backwards
MAX_INT = 2**63 - 1  # a step, count or token number: what a recorded int64 column holds
_MAX_DIGITS = len(str(MAX_INT))  # longer text is refused before int() (it caps at 4300 digits)


def _number(text: str, lo: float, hi: float, what: str) -> float:
    """A finite number in [lo, hi]; `what` is the expectation, naming both bounds."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(what) from None
    if not lo <= value <= hi:  # NaN and the infinities fail this too
        raise ValueError(what)
    return value


def millis(text: str) -> float:
    """A delay in milliseconds: the tool sleeps it, so at most a day."""
    return _number(text, 0, MAX_MS, f"a number of milliseconds from 0 to {MAX_MS} (one day)")


def micros(text: str) -> float:
    return _number(text, 0, MAX_US, f"a number of microseconds from 0 to {MAX_US} (one day)")


def offset_millis(text: str) -> float:
    """A clock offset in milliseconds, either sign, at most a day."""
    what = f"a number of milliseconds from -{MAX_MS} to {MAX_MS} (one day either way)"
    return _number(text, -MAX_MS, MAX_MS, what)


def ppm(text: str) -> float:
    what = f"parts per million from -{MAX_PPM} to {MAX_PPM} (a clock rate error of 100%)"
    return _number(text, -MAX_PPM, MAX_PPM, what)


def seconds(text: str) -> float:
    what = f"a number of seconds from 0 to {MAX_SECONDS:.0f} (one day)"
    return _number(text, 0, MAX_SECONDS, what)


def probability(text: str) -> float:
    return _number(text, 0, 1, "a probability between 0 and 1")


def _integer(text: str, lo: int, hi: int, what: str) -> int:
    text = text.strip()
    if len(text.lstrip("+-")) > _MAX_DIGITS:
        raise ValueError(what)
    try:
        value = int(text)
    except ValueError:
        raise ValueError(what) from None
    if not lo <= value <= hi:
        raise ValueError(what)
    return value


def step(text: str) -> int:
    return _integer(text, 0, MAX_INT, f"a step number from 0 to {MAX_INT}")


def count(text: str) -> int:
    return _integer(text, 1, MAX_INT, f"an integer from 1 to {MAX_INT}")


def tokens(text: str) -> int:
    return _integer(text, 0, MAX_INT, f"a token count from 0 to {MAX_INT}")


def seed(text: str) -> int:
    return _integer(text, 0, SEED_MAX, f"an integer from 0 to {SEED_MAX}")


def ranks(text: str) -> tuple[int, ...] | None:
    """`1`, `1|2` or `*`; None means every rank."""
    if text.strip() == ALL_RANKS:
        return None
    expected = "a rank (e.g. 1), ranks joined by | (e.g. 1|2), or *"
    parts = [p.strip() for p in text.split("|")]
    if not all(p.isascii() and p.isdigit() and len(p) <= _MAX_DIGITS for p in parts):
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
