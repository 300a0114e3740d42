"""What each fault models, as `run --list-faults` prints it and docs/faults.md states it.

One home: the text comes from each fault class's EVENT, WHEN, ACTS_IN, CANNOT and UNREACHABLE,
so the CLI and the doc (checked by tests/unit/faults/test_fault_catalog.py) cannot drift apart.
"""

from __future__ import annotations

import textwrap
from collections.abc import Collection

from hicache_diag.faults.base import Fault
from hicache_diag.faults.registry import FAULTS

WIDTH = 96


def reachable(cls: type[Fault]) -> str:
    if cls.UNREACHABLE:
        return f"NO, it can make a state SGLang cannot reach: {cls.UNREACHABLE}"
    return "yes: every state it makes, SGLang can reach"


def entry(cls: type[Fault]) -> list[tuple[str, str]]:
    """(label, text) pairs of one fault, in print order."""
    rows = [
        ("models", cls.EVENT or cls.SUMMARY),
        ("in production", cls.WHEN or "(not stated)"),
    ]
    rows += [(f"acts in ({releases})", where) for releases, where in cls.ACTS_IN]
    rows += [("cannot model", cls.CANNOT or "(not stated)"), ("reachable", reachable(cls))]
    return rows


def catalog_text(names: Collection[str] | None = None, width: int = WIDTH) -> str:
    """Every registered fault (or those `names` keeps), one block each, plain text (stdout of
    `run --list-faults`)."""
    blocks = []
    for name, cls in FAULTS.items():
        if names is not None and name not in names:
            continue
        lines = [f"{name}  (keys: {', '.join(cls.key_names())})"]
        for label, text in entry(cls):
            lines += textwrap.wrap(
                f"{label}: {text}",
                width,
                initial_indent="  ",
                subsequent_indent="      ",
                break_on_hyphens=False,
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def catalog_markdown() -> str:
    """The same, as the doc's "What each fault models" section body."""
    out = []
    for name, cls in FAULTS.items():
        out.append(f"### `{name}`\n")
        out += [f"- {label}: {text}" for label, text in entry(cls)]
        out.append("")
    return "\n".join(out)
