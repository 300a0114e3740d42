"""The verdict panel (stderr): outcome, form, ranks, signature, divergence, evidence."""

from __future__ import annotations

import re
import shlex

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from hicache_diag.evidence.verdict import Outcome, Verdict

_STYLE = {Outcome.OK: "green", Outcome.DIVERGED: "yellow", Outcome.WRONG_OUTPUT: "yellow"}


class _Grid:
    """A two-column grid whose cells are plain text: evidence quotes error lines such as gloo's
    `[/pytorch/.../pair.cc:553] Connection closed`, which rich would read as markup tags."""

    def __init__(self) -> None:
        self.table = Table.grid(padding=(0, 2))
        self.table.add_column(style="bold")
        self.table.add_column()

    def add_row(self, key: str, value: str) -> None:
        self.table.add_row(Text(key), Text(value))


def verdict_table(v: Verdict) -> Table:
    t = _Grid()
    form = f" (form {v.form.value})" if v.form else ""
    t.add_row("outcome", f"{v.outcome.value}{form}   exit {int(v.exit_code)}")
    if v.failed_rank is not None:
        t.add_row("failed rank", _rank_text(v, v.failed_rank))
    if v.culprit_rank is not None:
        t.add_row("culprit rank", _rank_text(v, v.culprit_rank))
    if v.signature:
        t.add_row("signature", v.signature)
    if v.first_divergence is not None:
        fd = v.first_divergence
        t.add_row("first divergence", f"step {fd.step}, {fd.field} ({fd.source.value})")
    for r in v.ranks:
        where = f" at {r.where}" if r.where else ""
        host = f" on {r.host}" if r.host else ""
        t.add_row(f"rank {r.rank} {r.label}{host}", f"{r.state}{where}")
    for line in v.evidence:
        t.add_row("evidence", _clean(line))
    for rank, c in sorted(v.cache.items(), key=lambda kv: int(kv[0])):
        t.add_row(f"cache rank {rank}", _cache_text(c))
    t.add_row("steps / time", f"{v.steps} steps in {v.duration_s:.1f} s, seed {v.seed}")
    if v.device:
        t.add_row("device", v.device)
    t.add_row("run dir", str(v.run_dir))
    if v.run_dir:
        t.add_row("next", f"hicache-diag report {shlex.quote(v.run_dir)}")
    return t.table


def _rank_text(v: Verdict, rank: int) -> str:
    """`1`, or `1 (node-1 PP1 TP0)` when the run spans nodes (`on HOST` with --hosts)."""
    state = next((r for r in v.ranks if r.rank == rank and r.node), None)
    if state is None:
        return str(rank)
    return f"{rank} ({state.label}{f' on {state.host}' if state.host else ''})"


def _cache_text(c: dict[str, int]) -> str:
    return (
        f"reused {c.get('prefix_hit', 0)} ({c.get('host_hit', 0)} from host), evicted "
        f"{c.get('evicted', 0)}, loaded back {c.get('load_backs', 0)}, written back "
        f"{c.get('write_backs', 0)} tokens"
    )


# A gloo error quotes its C++ source path and ends with a chatty hint; the panel keeps the
# error itself (the full line stays in verdict.json and the rank's log).
_SOURCE_PATH = re.compile(r"\[/[^\]]+\.(?:cc|cpp|h):\d+\] ")
_GLOO_HINT = re.compile(r"\. This is typically caused by a remote worker crashing.*$")


def _clean(line: str) -> str:
    return _GLOO_HINT.sub("", _SOURCE_PATH.sub("", line))


def render_verdict(console: Console, v: Verdict) -> None:
    style = _STYLE.get(v.outcome, "red")
    console.print(Panel(verdict_table(v), title="hicache-diag run", border_style=style))


def render_check(
    console: Console, expected: str, mismatches: list[str], undecided: str | None = None
) -> None:
    """`run --check`'s line after the verdict: what [expect] said and where the run differed
    (`undecided`: why the run decided nothing to check, never a mismatch)."""
    if undecided is not None:
        console.print(
            Text(f"check: not checked, the run decided nothing ({undecided})", style="yellow")
        )
        return
    if not mismatches:
        console.print(Text(f"check: ok, the verdict matches [expect] {expected}", style="green"))
        return
    console.print(Text(f"check: MISMATCH against [expect] {expected}", style="bold red"))
    for line in mismatches:
        console.print(Text(f"  {line}", style="red"))
