"""Renders a sources `Inventory` (one row per read), an `InventoryDiff`, and a run's dynamic
record (`RunSources`)."""

from __future__ import annotations

import json
import os
import sys

from rich.table import Table

from hicache_diag.cli.render.console import SafeConsole as Console


def _console(console: Console | None) -> Console:
    # Piped output gets a wide table instead of rich's 80-column wrap ($COLUMNS still rules).
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    return console or Console(highlight=False, width=None if wide else 200)


def _pp(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def _groups(sources, show_all: bool) -> list[list]:
    """Reads of one kind in one function that feed the same decisions the same way share a
    row (`is_fully_idle` reads nine queue lengths)."""
    groups: dict[tuple, list] = {}
    for s in sources:
        if show_all or s.known:
            a = s.alignment
            key = (s.file, s.function, s.kind, s.classic, s.decisions, a.mechanism, a.covers_pp)
            groups.setdefault(key, []).append(s)
    return list(groups.values())


def _rows(table: Table, sources, show_all: bool) -> int:
    groups = _groups(sources, show_all)
    for group in groups:
        s = group[0]
        more = f" (+{len(group) - 1})" if len(group) > 1 else ""
        a = s.alignment
        raw = sum(g.raw_uses for g in group)
        table.add_row(
            f"{s.file}:{s.line}{more}",
            s.function,
            s.kind,
            s.classic or "",
            ", ".join(s.decisions),
            a.mechanism + (" *" if s.modes else ""),
            _pp(a.covers_pp),
            str(raw) if raw else "",
        )
    return len(groups)


def _source_table(title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("file:line", "function", "kind", "classic", "decision", "alignment", "PP", "raw"):
        t.add_column(col, overflow="fold")
    return t


def render_inventory(inv, show_all: bool = False, console: Console | None = None) -> None:
    console = _console(console)
    rel = inv.release
    t = _source_table(f"Divergence sources, {rel.engine} {rel.version} (static)")
    shown = _rows(t, inv.sources, show_all)
    console.print(t)
    unknown = sum(1 for s in inv.sources if not s.known)
    console.print(
        f"{len(inv.sources)} reads reach a decision in {len(inv.files)} files; {shown} rows"
        + ("" if show_all else f" ({unknown} reads of unknown decision left out: --all)")
        + f"; {inv.reads_without_decision} reads reach none (metrics, logs)."
    )
    console.print(
        "alignment: how ranks agree on the value at its nearest aligned decision; "
        "PP: whether that covers the PP stages; raw: decisions taken on the unaligned value."
    )
    _modes(inv.sources, console)
    _logical(inv.logical, show_all, console)
    _classic_summary(inv, console)
    for note in inv.notes:
        console.print(f"note: {note}")


def _modes(sources, console: Console) -> None:
    """`*` in the table: a read aligned one way in one code branch and another way in the
    other (`if buffer_only and pp_size > 1: MIN over TP, else: MIN + PP relay`)."""
    rows = [(s, m) for s in sources if s.known for m in s.modes]
    if not rows:
        return
    t = Table(title="* Alignment per code branch", title_justify="left")
    for col in ("read", "branch at", "selected by", "then", "PP", "else", "PP"):
        t.add_column(col, overflow="fold")
    for s, m in rows:
        t.add_row(
            f"{s.file}:{s.line} {s.function}",
            f"{m.file}:{m.line}",
            m.selector,
            m.then.mechanism,
            _pp(m.then.covers_pp),
            m.orelse.mechanism,
            _pp(m.orelse.covers_pp),
        )
    console.print(t)


def _logical(logical, show_all: bool, console: Console) -> None:
    """Logical per-rank state: equal on every rank while every input is, so not a source."""
    groups = _groups(logical, show_all)
    if not groups:
        return
    t = Table(title="Logical per-rank state (not divergence sources)", title_justify="left")
    for col in ("file:line", "function", "kind", "decision"):
        t.add_column(col, overflow="fold")
    for group in groups:
        s = group[0]
        more = f" (+{len(group) - 1})" if len(group) > 1 else ""
        t.add_row(f"{s.file}:{s.line}{more}", s.function, s.kind, ", ".join(s.decisions))
    console.print(t)


def _classic_summary(inv, console: Console) -> None:
    """The four classic sources (seed 001) and where this tree reads each."""
    from hicache_diag.sources.diff import CLASSIC_ORDER

    t = Table(title="Classic sources", title_justify="left")
    for col in ("source", "read at", "alignment", "PP"):
        t.add_column(col, overflow="fold")
    for name in CLASSIC_ORDER:
        reads = [s for s in inv.sources if s.classic == name and s.known]
        if not reads:
            t.add_row(name, "not found", "", "")
        for s in reads:
            a = s.alignment
            t.add_row(name, f"{s.file}:{s.line} {s.function}", a.text, _pp(a.covers_pp))
    console.print(t)


def render_diff(diff, show_all: bool = False, console: Console | None = None) -> None:
    from hicache_diag.sources.diff import label

    console = _console(console)
    a, b = f"{diff.a.engine} {diff.a.version}", f"{diff.b.engine} {diff.b.version}"
    t = Table(title=f"Classic sources, {a} -> {b}", title_justify="left")
    for col in ("source", a, b, "changed"):
        t.add_column(col, overflow="fold")
    for c in diff.classic:
        t.add_row(c.classic, _mechs(c.a), _mechs(c.b), "yes" if c.changed else "")
    console.print(t)
    console.print(
        f"PP relays: {', '.join(diff.relays_a) or 'none'} -> {', '.join(diff.relays_b) or 'none'}"
    )
    if diff.realigned:
        r = Table(title="Re-aligned (same read, other alignment)", title_justify="left")
        for col in ("read", a, b):
            r.add_column(col, overflow="fold")
        for item in diff.realigned:
            r.add_row(
                f"{item.b.file}:{item.b.line} {item.b.function} {item.b.kind}",
                _full(label(item.a), item.a.alignment.text),
                _full(label(item.b), item.b.alignment.text),
            )
        console.print(r)
    for title, items in (("Added", diff.added), ("Removed", diff.removed)):
        table = _source_table(f"{title} ({len(items)})")
        if _rows(table, items, show_all):
            console.print(table)
    if not show_all:
        console.print("reads of unknown decision are left out: --all")


def _full(label: str, text: str) -> str:
    return label if text in label else f"{label}: {text}"


def _mechs(counts: dict[str, int]) -> str:
    return ", ".join(f"{m} x{n}" for m, n in counts.items()) or "-"


def _short(values) -> str:
    text = json.dumps(values, separators=(",", ":"))
    return text if len(text) <= 40 else text[:37] + "..."


def _per_rank(view) -> str:
    """`rank: values -> outcome` for each rank at a step ('-' no read, '.' decided nothing)."""
    parts = []
    for r, v in view.values.items():
        d = view.outcomes.get(r) or []
        parts.append(f"r{r}: {'-' if v is None else _short(v)}" + (f" -> {_short(d)}" if d else ""))
    return "; ".join(parts)


_RUN_COLUMNS = ("source", "kind", "decision", "ranks", "steps read", "differed", "decided")
_RUN_COLUMNS += ("marked", "apart", "first differed", "decided there")


def render_run_sources(result, console: Console | None = None) -> None:
    """`sources --run`: one row per probed source, then the first marked step of each."""
    console = _console(console)
    t = Table(title=f"Divergence sources in {result.run_dir} (dynamic)", title_justify="left")
    for col in _RUN_COLUMNS:
        t.add_column(col, overflow="fold")
    for s in result.sources:
        first = s.first_differed
        t.add_row(
            s.name,
            s.kind,
            s.decision,
            ",".join(map(str, s.ranks_read)) or "-",
            str(s.steps_read),
            str(s.steps_differed),
            str(s.steps_decided),
            str(s.steps_marked),
            str(s.steps_apart),
            f"step {first.step}" if first else "-",
            ("yes" if first.decided else "no") if first else "",
        )
    console.print(t)
    console.print(
        "differed: steps where the ranks that read it read different values; decided: steps "
        "where the decision it feeds acted; apart: the decision's outcome differed across the "
        "ranks at the step; marked: the decision acted and the values or its outcomes differed."
    )
    for s in result.sources:
        for label, view in (
            ("first differed", s.first_differed),
            ("first marked", s.first_marked),
            ("first apart", s.first_apart),
        ):
            if view is not None:
                console.print(f"{s.name}, {label} at step {view.step}: {_per_rank(view)}")
    if result.release is not None:
        console.print(_static_table(result))
    armed = sorted({a for names in result.armed.values() for a in names})
    console.print(
        f"armed on this release: {', '.join(armed) or 'none'}; "
        f"last step per rank: {result.last_step}"
    )
    for note in result.notes:
        console.print(f"note: {note}")


def _static_table(result) -> Table:
    """`--run` with a tree named: where the release reads each probed source."""
    rel = result.release
    r = Table(
        title=f"Where {rel['engine']} {rel['version']} reads them (static)", title_justify="left"
    )
    for col in ("source", "file:line", "function", "decision", "alignment", "PP"):
        r.add_column(col, overflow="fold")
    for s in result.sources:
        groups: dict[tuple, list[dict]] = {}  # reads of one function that agree: one row
        for row in s.static:
            decisions = tuple(row["decisions"])
            key = (row["file"], row["function"], decisions, row["alignment"], row["covers_pp"])
            groups.setdefault(key, []).append(row)
        if not groups:
            r.add_row(s.name, "not found", "", "", "", "")
        for (file, function, decisions, alignment, covers_pp), rows in groups.items():
            more = f" (+{len(rows) - 1})" if len(rows) > 1 else ""
            where = f"{file}:{rows[0]['line']}{more}"
            r.add_row(s.name, where, function, ", ".join(decisions), alignment, _pp(covers_pp))
    return r
