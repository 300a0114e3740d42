"""Render a RunReport: rich tables on stderr-free stdout console, and the Markdown summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from hicache_diag.cli.render.divergence_block import markdown_blocks, render_blocks
from hicache_diag.diagnosis.report import RunReport
from hicache_diag.evidence.verdict import Verdict

MAX_TIMELINE_ROWS = 40
# Short headers so the per-rank timeline fits a terminal.
SHORT = {
    "extend_num_tokens": "extend",
    "write_queue": "write_q",
    "load_queue": "load_q",
    "ack_write_queue": "ack_write_q",
    "ack_load_queue": "ack_load_q",
    "host_free": "host_free",
    "acks_consumed_write": "consumed_w",
    "acks_consumed_load": "consumed_l",
    "inflight_sends": "inflight",
}


def _headline(v: Verdict) -> str:
    form = f" (form {v.form.value})" if v.form else ""
    return f"{v.outcome.value}{form}, exit {int(v.exit_code)}"


def _verdict_lines(v: Verdict) -> list[str]:
    lines = [f"verdict: {_headline(v)}"]
    if v.signature:
        lines.append(f"signature: {v.signature}")
    lines.append(f"failed rank: {_cell(v.failed_rank)}    culprit rank: {_cell(v.culprit_rank)}")
    duration = "-" if v.duration_s is None else f"{v.duration_s:.2f}s"
    lines.append(f"seed: {_cell(v.seed)}    steps: {_cell(v.steps)}    duration: {duration}")
    return lines


def divergence_values(values: dict) -> str:
    """`rank 0: 16, rank 1: 12`: never a Python dict (or None) in the text."""
    return ", ".join(f"rank {rank}: {_cell(value)}" for rank, value in values.items())


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _frame_table(df: pd.DataFrame, title: str, index_name: str, prefix: str = "") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(index_name, justify="right")
    for col in df.columns:
        table.add_column(f"{prefix}{col}", justify="right")
    for idx, row in df.iterrows():
        table.add_row(str(idx), *(_cell(v) for v in row))
    return table


def _rank_table(v: Verdict) -> Table:
    table = Table(title="ranks", title_justify="left")
    for col in ("rank", "pp", "tp", "pid", "state", "where"):
        table.add_column(col)
    for r in v.ranks:
        table.add_row(str(r.rank), str(r.pp), str(r.tp), _cell(r.pid), r.state, r.where or "-")
    return table


def _timeline_view(report: RunReport) -> pd.DataFrame:
    table = report.timelines.set_index(["step", "rank"])
    fd = report.verdict.first_divergence
    if fd is not None:  # centre the view on the divergence rather than the start of the run
        steps = table.index.get_level_values("step")
        table = table[(steps >= fd.step - 5) & (steps <= fd.step + 5)]
    return table.head(MAX_TIMELINE_ROWS).rename(columns=SHORT)


def render_report(report: RunReport, console: Console) -> None:
    v = report.verdict
    source = "verdict.json" if report.recorded else "classified now"
    console.print(Panel("\n".join(_verdict_lines(v)), title=f"{report.run.run_dir} ({source})"))
    fd = v.first_divergence
    if fd is not None:
        console.print(
            f"first divergence: step {fd.step}, field {fd.field}, source {fd.source.value}, "
            f"values {divergence_values(fd.values)}"
        )
        if not report.window.empty:
            title = f"{fd.field} around step {fd.step}"
            console.print(_frame_table(report.window, title, "step", "rank "))
    console.print(_rank_table(v))
    render_blocks(report.blocks, [r.rank for r in v.ranks], console)
    if not report.timelines.empty:
        view = _timeline_view(report).reset_index().set_index("step")
        console.print(_frame_table(view, "per-rank timelines", "step"))
    for line in v.evidence:
        console.print(f"  - {line}", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    for path in report.written:
        console.print(f"wrote: {path}", markup=False)


def _md_table(df: pd.DataFrame, index_name: str) -> list[str]:
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join([index_name, *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for idx, row in df.iterrows():
        out.append("| " + " | ".join([str(idx), *(_cell(v) for v in row)]) + " |")
    return out


def ranks_frame(v: Verdict) -> pd.DataFrame:
    return pd.DataFrame(
        [[r.pp, r.tp, r.pid, r.state, r.where] for r in v.ranks],
        index=[r.rank for r in v.ranks],
        columns=["pp", "tp", "pid", "state", "where"],
    )


def markdown_summary(report: RunReport, path: Path, files: list[Path]) -> str:
    """One page: verdict, first divergence, ranks, evidence, the plots, and `files`: every
    file this report writes (this one included), exactly."""
    v = report.verdict
    md = [f"# hicache-diag report: `{report.run.run_dir}`", ""]
    md += [f"- {line}" for line in _verdict_lines(v)] + [""]
    fd = v.first_divergence
    if fd is not None:
        md += [f"## First divergence: step {fd.step}, `{fd.field}` ({fd.source.value})", ""]
        if not report.window.empty:
            md += _md_table(report.window.rename(columns=lambda r: f"rank {r}"), "step") + [""]
    md += ["## Ranks", ""] + _md_table(ranks_frame(v), "rank") + [""]
    md += markdown_blocks(report.blocks, [r.rank for r in v.ranks])
    md += ["## Evidence", ""]
    md += [f"- {line}" for line in v.evidence] + [""]
    if report.notes:
        md += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    rel = [os.path.relpath(f, path.parent) for f in files]
    plots = [(f, r) for f, r in zip(files, rel, strict=True) if f.suffix == ".png"]
    if plots:
        md += ["## Timelines", ""] + [f"![{f.stem}]({r})" for f, r in plots] + [""]
    md += ["## Files", ""] + [f"- [{r}]({r})" for r in rel] + [""]
    return "\n".join(md)
