"""The hunt's table: one row per trigger tried, then each one's evidence and what was not run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hicache_diag.hunt.model import HuntReport, TriggerResult


def _first(result: TriggerResult) -> str:
    fd = result.first_divergence
    if not fd:
        return "no first divergence recorded"
    values = ", ".join(f"rank {r}: {v}" for r, v in (fd.get("values") or {}).items())
    source = f" (source {fd['source']})" if fd.get("source") else ""
    return f"first divergence at step {fd.get('step')}, {fd.get('field')}: {values}{source}"


def _status(result: TriggerResult) -> str:
    via = f" via {result.via}" if result.via else ""
    if result.divergent:
        return f"DIVERGES{via} (confirmed)"
    if result.failures and result.confirmed is None and result.reruns:
        return f"failed{via}; its fresh reruns were undecided ({len(result.reruns)}): unknown"
    if result.failures and result.confirmed is False and not result.reruns:
        return f"failed{via}, not confirmed on a fresh rerun"  # a hunt.json before `reruns`
    if result.failures and result.confirmed is None:  # no rerun ran (the hunt was stopped)
        return f"failed{via}; not confirmed: no fresh rerun ran"
    if result.failures:
        return f"failed{via}, not reproduced by {len(result.reruns)} fresh rerun(s)"
    return "no divergence" if result.trials else "not run"


def hunt_table(report: HuntReport) -> Table:
    table = Table(title=Text(f"hunt: {report.release}"), title_justify="left")
    for column in ("trigger", "how", "reads", "failed/trials", "95% interval", "status"):
        table.add_column(column)
    for r in report.results:
        how = f"fault {r.fault}" if r.fault else ("natural" if r.trials else "-")
        forms = ", ".join(f"{k} {v}" for k, v in sorted(r.forms.items()))
        counts = f"{r.failures}/{r.trials}" + (f" ({forms})" if forms else "")
        lo, hi = r.interval
        table.add_row(r.name, how, str(len(r.sources)), counts, f"[{lo:.2f}, {hi:.2f}]", _status(r))
    return table


def render_hunt(
    console: Console, report: HuntReport, notes: dict[str, list[str]] | None = None
) -> None:
    """`notes`: lines under a trigger's first failing run (a re-judged hunt's, say)."""
    console.print(hunt_table(report))
    for r in report.results:
        if r.first_failure:
            console.print(Text(f"{r.name}: {_first(r)}\n  run dir {r.first_failure}"))
        for note in (notes or {}).get(r.name, []):
            console.print(Text(f"  {note}"))
        if r.export:
            console.print(Text(f"  export: {r.export}"))
        for why in r.skipped:
            console.print(Text(f"{r.name}: not run: {why}", style="dim"))
    if report.unmapped:
        console.print(f"{len(report.unmapped)} unaligned read(s) no trigger covers (hunt.json)")
    if report.stopped:
        console.print(
            Text(f"stopped: {report.stopped} after {report.trials_run} trial(s)", "yellow")
        )
