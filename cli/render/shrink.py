"""The shrink's outcome in a few lines."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from hicache_diag.shrink.shrink import ShrinkReport


def render_shrink(console: Console, report: ShrinkReport) -> None:
    t = report.target
    console.print(Text(f"shrink: {report.run_dir} ({t.outcome} {t.form or ''})".rstrip()))
    if report.stopped == "not reproduced":
        console.print(Text("  the failure did not reproduce in the first trials: nothing shrunk"))
        return
    after = report.after or report.before
    console.print(f"  faults: {len(report.before.faults)} -> {len(after.faults)}")
    for spec in after.faults:
        console.print(Text(f"    {spec}"))
    console.print(f"  requests: {report.before.requests} -> {after.requests}")
    for line in report.removed:
        console.print(Text(f"  removed {line}"))
    console.print(Text(f"  {report.trials_run} trial(s); last failing run {report.last_failing}"))
    if report.stopped:
        console.print(Text(f"  stopped: {report.stopped}", style="yellow"))
