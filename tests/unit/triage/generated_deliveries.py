"""Deliveries nobody listed: wrappers made up from a seed (a logging agent's fields, JSON-ish
keys, a host and a counter, a syslog priority) put in front of every line, and SGLang's stamp
cut short at the front of some lines. triage.framing must peel what triage.carriers does not
know; tests/unit/triage/test_metamorphic.py runs every corpus case through several seeds."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from tests.unit.triage.deliveries import Delivery, DeliveryKind, File, per_line

_LEVELS = ("ERROR", "INFO", "WARNING", "DEBUG", "E", "I", "err", "info")
_SEPARATORS = ("] ", "} ", " | ", ": ", "> ", " ")
# SGLang's label at the start of a line: `[2025-06-24 15:38:03(.123)? PP1 TP0]`.
_LABEL = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?P<tokens>(?: [A-Z_]+\d+)*)\]")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))


def _field(rng: random.Random) -> Callable[[int], str]:
    """One made-up field; `i` (the line number) makes its figures vary line to line."""
    word, key, level = _word(rng), _word(rng), rng.choice(_LEVELS)
    base = rng.randint(10**9, 2 * 10**9)
    shapes: list[Callable[[int], str]] = [
        lambda i: f"[{word}: {level}",
        lambda i: f'{{"{key}": {base + i}, "{word}": "{level}"',
        lambda i: f"{word}-{base % 97} {i:06d}",
        lambda i: f"<{base % 191}>{word}[{base % 9999}]",
        lambda i: f"@{base + 3 * i} {level}",
        lambda i: f"{key}={word} {key}_n={i}",
    ]
    return rng.choice(shapes)


def random_wrapper(seed: int) -> Callable[[int], str]:
    """A wrapper of one to three made-up fields, each closed by a separator; ends in a blank."""
    rng = random.Random(seed)
    fields = [(_field(rng), rng.choice(_SEPARATORS)) for _ in range(rng.randint(1, 3))]

    def wrap(i: int) -> str:
        return "".join(f(i) + sep for f, sep in fields).rstrip(" ") + " "

    return wrap


def cut_stamp(line: str, rng: random.Random) -> str:
    """SGLang's label with its first characters cut (1 up to the whole stamp; a label with no
    rank tokens keeps its `:SS`, the sign that it was a stamp)."""
    m = _LABEL.match(line)
    if m is None:
        return line
    most = m.start("tokens") if m["tokens"] else m.start("tokens") - 3
    return line[rng.randint(1, max(1, most)) :]


def _per_file(fn: Callable[[list[str], random.Random], list[str]], seed: int) -> Delivery:
    def deliver(files: list[File]) -> list[File]:
        out = []
        for k, (name, content) in enumerate(files):
            rng = random.Random(seed * 1000 + k)
            lines = content.decode("utf-8", errors="replace").split("\n")
            tail = lines.pop() if lines and lines[-1] == "" else None
            new = fn(lines, rng)
            out.append((name, ("\n".join(new) + ("\n" if tail is not None else "")).encode()))
        return out

    return deliver


def _wrapped(seed: int) -> Delivery:
    wrap = random_wrapper(seed)
    return _per_file(lambda lines, _rng: [wrap(i) + s for i, s in enumerate(lines)], seed)


def _cut(seed: int) -> Delivery:
    def cut(lines: list[str], rng: random.Random) -> list[str]:
        return [cut_stamp(s, rng) if rng.random() < 0.5 else s for s in lines]

    return _per_file(cut, seed)


def _wrapped_and_cut(seed: int) -> Delivery:
    wrap = random_wrapper(seed)

    def both(lines: list[str], rng: random.Random) -> list[str]:
        cut = [cut_stamp(s, rng) if rng.random() < 0.3 else s for s in lines]
        return [wrap(i) + s for i, s in enumerate(cut)]

    return _per_file(both, seed)


# Editor line numbers in shapes triage.lines' own stage does not list alone: `  12| ` and
# `12:` glued to the text, and numbers in front of a collector's prefix.
EDITOR_NUMBERS = (
    DeliveryKind("numbered-bar-tight", per_line(lambda i, s: f"{i + 1:>4}| {s}")),
    DeliveryKind("numbered-colon", per_line(lambda i, s: f"{i + 1}:{s}")),
    DeliveryKind(
        "numbered-cri",
        per_line(lambda i, s: f"{i + 1:>4}| 2026-06-24T17:38:03.{i:09d}Z stdout F {s}"),
    ),
)


def generated(seeds: range) -> tuple[DeliveryKind, ...]:
    """For each seed: an unknown wrapper, stamps cut at the front, and both together."""
    out: list[DeliveryKind] = []
    for seed in seeds:
        out += [
            DeliveryKind(f"wrapper{seed}", _wrapped(seed)),
            DeliveryKind(f"stamp-cut{seed}", _cut(seed)),
            DeliveryKind(f"wrapper+cut{seed}", _wrapped_and_cut(seed)),
        ]
    return tuple(out)
