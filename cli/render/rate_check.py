"""`run --check` over a rate scenario's trials: one row per trial, then the judged rate."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hicache_diag.trials.rate_check import RateCheck


def render_rate_check(console: Console, check: RateCheck) -> None:
    table = Table(title=Text(f"check: [expect] {check.expect}"), title_justify="left")
    for column in ("seed", "outcome", "form", "matched", "run dir"):
        table.add_column(column)
    for t in check.trials:
        matched = "undecided" if t.matched is None else ("yes" if t.matched else "no")
        table.add_row(str(t.seed), t.outcome or "-", t.form or "-", matched, t.run_dir)
    console.print(table)
    lo, hi = check.interval
    summary = f"{check.matched}/{check.decided} matched, 95% interval [{lo:.2f}, {hi:.2f}]"
    if check.decided < len(check.trials):
        summary += f"; {len(check.trials) - check.decided} trial(s) decided nothing"
    if check.interrupted:
        console.print(Text(f"check: interrupted after {summary}", style="yellow"))
    elif not check.decided:
        console.print(Text("check: undecided, no trial decided anything", style="yellow"))
    elif check.mismatches:
        console.print(Text(f"check: MISMATCH, {summary}", style="bold red"))
        for line in check.mismatches:
            console.print(Text(f"  {line}", style="red"))
    else:
        console.print(Text(f"check: ok, {summary}", style="green"))
