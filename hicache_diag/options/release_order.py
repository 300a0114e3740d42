"""SGLang release versions as pip writes them (`0.5.12.post1`), in release order: one key for
every table and list of releases (bisect's release rows, export's affected-range table)."""

from __future__ import annotations


def release_key(version: str) -> tuple[int, ...]:
    """`0.5.12.post1` -> (0, 5, 12, 1), after `0.5.12` and before `0.5.13`; a piece that is not
    a number sorts first (-1)."""
    return tuple(int(p) if p.isdigit() else -1 for p in version.replace(".post", ".").split("."))
