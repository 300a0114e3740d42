"""Render bisect: a progress bar over all trials (stderr), the per-cell table, verdict lines."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hicache_diag.diagnosis.bisect_table import BisectTable, Cell, TrialResult


def trial_progress(console: Console, total: int, quiet: bool = False):
    """A started Progress and a callback that advances it per finished trial; shown only on a
    terminal, and not with --json (`quiet`)."""
    progress = Progress(
        TextColumn("bisect"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=console, transient=True,
        disable=quiet or not console.is_terminal,
    )  # fmt: skip
    task = progress.add_task("", total=total)
    failures = [0]

    def on_result(cell: Cell, res: TrialResult) -> None:
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


def bisect_table(table: BisectTable) -> Table:
    view = Table(title="bisect", title_justify="left")
    for name in table.switches:
        view.add_column(name)
    for col in ("trials", "failures", "rate", "95% CI", "forms", "median TTF", "errors"):
        view.add_column(col, justify="right")
    for cell in table.cells:
        data = cell.to_json()
        lo, hi = data["ci95"]
        forms = " ".join(f"{k}:{v}" for k, v in data["forms"].items()) or "-"
        view.add_row(
            *_values(table, cell), str(data["trials"]), str(data["failures"]),
            f"{data['rate']:.0%}", f"[{lo:.2f}, {hi:.2f}]", forms, _fmt_ttf(data["median_ttf_s"]),
            str(len(data["errors"])),
        )  # fmt: skip
    return view


def table_markdown(table: BisectTable) -> str:
    """The same table as markdown (table.md in --out), verdict lines below it."""
    head = [*table.switches, "trials", "failures", "rate", "95% CI", "forms", "median TTF"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in table.cells:
        d = cell.to_json()
        lo, hi = d["ci95"]
        forms = " ".join(f"{k}:{v}" for k, v in d["forms"].items()) or "-"
        vals = [*_values(table, cell), str(d["trials"]), str(d["failures"]),
                f"{d['rate']:.0%}", f"[{lo:.2f}, {hi:.2f}]", forms, _fmt_ttf(d["median_ttf_s"])]
        rows.append("| " + " | ".join(vals) + " |")
    verdict = [f"- {line}" for line in table.verdict()]
    return "\n".join(["# bisect", "", *rows, "", "## Verdict", "", *verdict, ""])


def render_bisect(table: BisectTable, console: Console) -> None:
    console.print(bisect_table(table))
    for line in table.verdict():
        console.print(f"verdict: {line}", markup=False)
    for cell in table.cells:
        for err in cell.to_json()["errors"][:3]:
            console.print(f"error: {err}", markup=False)
