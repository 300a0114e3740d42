"""Render bisect: a progress bar over all trials (stderr), the per-cell table, verdict lines."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hicache_diag.diagnosis.bisect_table import BisectTable, BisectTrial, Cell, causes_text


def trial_progress(console: Console, total: int, quiet: bool = False):
    """A started Progress and a callback that advances it per finished trial; shown only on a
    terminal, and not with --json (`quiet`)."""
    progress = Progress(
        TextColumn("bisect"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    )
    task = progress.add_task("", total=total)
    failures = [0]

    def on_result(cell: Cell, res: BisectTrial) -> None:
        failures[0] += res.failed
        what = res.form or res.outcome or "error"
        desc = f"failures {failures[0]}  last: {what} {' '.join(cell.values.values())}"
        progress.update(task, advance=1, description=desc)

    return progress, on_result


def _values(table: BisectTable, cell: Cell) -> list[str]:
    """The cell's axis values; a release shows as its version (table.releases)."""
    return [table.releases.get(cell.values[s], cell.values[s]) for s in table.switches]


def _fmt_ttf(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _undecided(data: dict) -> str:
    """`4 (trial timeout 0.001s: 4)`: trials that decided nothing, and why; `-` for none."""
    if not data["undecided"]:
        return "-"
    return f"{data['undecided']} ({causes_text(data['undecided_causes'])})"


COLUMNS = ("trials", "failures", "rate", "95% CI", "forms", "median TTF", "undecided")


def _row(table: BisectTable, cell: Cell) -> list[str]:
    d = cell.to_json()
    lo, hi = d["ci95"]
    forms = " ".join(f"{k}:{v}" for k, v in d["forms"].items()) or "-"
    rate = f"{d['rate']:.0%}" if d["trials"] else "-"  # no finished trial: no rate
    ci = f"[{lo:.2f}, {hi:.2f}]" if d["trials"] else "-"
    counts = [str(d["trials"]), str(d["failures"]), rate, ci, forms]
    return [*_values(table, cell), *counts, _fmt_ttf(d["median_ttf_s"]), _undecided(d)]


def bisect_table(table: BisectTable) -> Table:
    view = Table(title="bisect", title_justify="left")
    for name in table.switches:
        view.add_column(name)
    for col in COLUMNS:
        view.add_column(col, justify="right")
    for cell in table.cells:
        view.add_row(*_row(table, cell))
    return view


def table_markdown(table: BisectTable) -> str:
    """The same table as markdown (table.md in --out), verdict lines below it."""
    head = [*table.switches, *COLUMNS]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in table.cells:
        rows.append("| " + " | ".join(_row(table, cell)) + " |")
    verdict = [f"- {line}" for line in table.verdict()]
    return "\n".join(["# bisect", "", *rows, "", "## Verdict", "", *verdict, ""])


def render_bisect(table: BisectTable, console: Console) -> None:
    console.print(bisect_table(table))
    for line in table.verdict():
        console.print(f"verdict: {line}", markup=False)
    for cell in table.cells:
        for err in cell.to_json()["errors"][:3]:
            console.print(f"undecided: {err}", markup=False)
