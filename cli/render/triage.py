"""Render a TriageReport: verdict line, culprit, per-rank table, rank-set stack tree, next steps."""

from __future__ import annotations

import time

from rich import box
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from hicache_diag.cli.render.console import SafeConsole as Console
from hicache_diag.cli.render.safe_text import safe_report
from hicache_diag.triage.recorded import Recording
from hicache_diag.triage.report import TriageReport
from hicache_diag.triage.stacks import StackNode, format_rank_set

_STYLE = {"crash": "bold red", "hang": "bold red", "busy": "green", "healthy": "green"}
_STATE = {"blocked": "red", "crashed": "red", "exited": "yellow", "running": "green"}
MAX_TREE_DEPTH = 40


def verdict_line(report: TriageReport) -> str:
    parts = [report.kind.upper()]
    if report.form:
        parts.append(f"form {report.form}")
    if report.cause:
        parts.append(report.cause)
    line = " · ".join(parts)
    if report.culprit is not None:
        c = report.culprit
        where = f" at {c.wait_site}" if c.wait_site else ""
        pid = f" (pid {c.pid})" if c.pid else ""
        line += f" — culprit {c.rank.label}{pid}{where}"
    return line


def _rank_table(report: TriageReport) -> Table:
    table = Table(title="ranks", show_lines=False, box=box.SIMPLE_HEAD, show_edge=False)
    # At 80 columns the frame is what a reader needs: it keeps room and folds, never "…".
    widths = {"rank": 7, "pid": 7, "role": 10, "state": 7, "wait site": 14}
    for col, width in widths.items():
        table.add_column(col, overflow="fold", max_width=width)
    table.add_column("at frame", overflow="fold", min_width=20, ratio=1)
    culprit = report.culprit.rank if report.culprit else None
    for r in report.ranks:
        label = Text(r.rank.label, style="bold red" if r.rank == culprit else "")
        state = Text(r.state, style=_STATE.get(r.state, ""))
        top = r.site_frame or (r.frames[0] if r.frames else (r.error or ""))
        cells = (str(r.pid or "-"), r.role)
        site = Text(r.wait_site or "-")
        table.add_row(label, *(Text(c) for c in cells), state, site, Text(top))
    return table


def _recorded_table(recording: Recording) -> Table:
    """Each rank's recording: its last step, its last in-process dump, why it is blind."""
    table = Table(title="recorded", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("rank", "pid", "last step", "dumped"):
        table.add_column(col, overflow="fold", max_width=12)
    table.add_column("blind", overflow="fold", ratio=1)
    for r in recording.ranks:
        dumped = time.strftime("%H:%M:%S", time.localtime(r.dumped_at)) if r.dumped_at else "-"
        step = "-" if r.last_step is None else str(r.last_step)
        blind = Text(r.blind or "-", style="yellow" if r.blind else "")
        table.add_row(Text(r.label), Text(str(r.pid or "-")), Text(step), Text(dumped), blind)
    return table


def divergence_line(recording: Recording) -> str | None:
    p = recording.parting
    if p is None:
        return None
    where = f"steps {p.step}-{p.last_step}" if p.last_step is not None else f"step {p.step}"
    values = ", ".join(f"rank {r} = {v}" for r, v in p.values.items())
    field = p.field or "field unknown"
    rotated = "" if p.reach == "lines" else f" (values rotated out: {p.reach} only)"
    return f"first divergence: {where}, {field}: {values}{rotated} · source {p.source}"


def _add(tree: Tree, node: StackNode, total: int, depth: int) -> None:
    for child in node.children.values():
        # Collapse a chain whose rank set does not change: one line per branch point.
        chain = [child]
        while len(chain[-1].children) == 1:
            nxt = next(iter(chain[-1].children.values()))
            if nxt.ranks != child.ranks:
                break
            chain.append(nxt)
        style = "" if len(child.ranks) == total else "bold yellow"
        label = Text(f"[{_ranks(child)}] ", style=style)
        label.append(chain[0].label if len(chain) == 1 else f"{chain[0].label} … {chain[-1].label}")
        branch = tree.add(label)
        if depth < MAX_TREE_DEPTH:
            _add(branch, chain[-1], total, depth + 1)


def _ranks(node: StackNode) -> str:
    return format_rank_set(node.ranks)


def render_triage(report: TriageReport, console: Console | None = None) -> None:
    # Error texts carry `[/pytorch/...]` paths that rich would parse as markup: print as Text;
    # escape sequences a log carried are shown, never sent to the terminal.
    report = safe_report(report)
    console = console or Console()
    console.print(Text(verdict_line(report), style=_STYLE.get(report.kind, "bold yellow")))
    if report.confidence != "high":
        console.print(Text(f"confidence: {report.confidence}", style="yellow"))
    if report.signature:
        console.print(Text(f"signature: {report.signature}"))
    if report.emitter:  # who printed the evidence that decided it (triage.emitters)
        console.print(Text(f"printed by: {report.emitter}"))
    if report.reason:
        console.print(Text(f"reason: {report.reason}"))
    for line in report.framing:  # what reading the logs undid (logs.framing_notes)
        console.print(Text(f"framing: {line}", style="dim"))
    if report.ranks:
        console.print(_rank_table(report))
    if report.recording is not None and report.recording.ranks:
        console.print(_recorded_table(report.recording))
        if line := divergence_line(report.recording):
            console.print(Text(line, style="bold"))
    for line in report.evidence:
        console.print(Text(f"• {line}"))
    if report.stack_tree is not None and report.stack_tree.children:
        tree = Tree(Text("stacks (innermost last; [ranks] at each branch)"))
        _add(tree, report.stack_tree, len(report.stack_tree.ranks), 0)
        console.print(tree)
    console.print("next steps:")
    for i, step in enumerate(report.next_steps, 1):
        console.print(Text(f"  {i}. {step}"))
