"""A saved hunt re-judged from its runs (`report HUNT_DIR`): the hunt's own table, with what
each trigger's first failing run says now, and what a save changed."""

from __future__ import annotations

import io

from rich.text import Text

from hicache_diag.cli.render.console import SafeConsole as Console
from hicache_diag.cli.render.hunt import render_hunt
from hicache_diag.hunt.rejudge import HuntRejudge, Rejudged

NOT_FAILED = ("ok", "undecided", "interrupted")
TABLE_WIDTH = 140  # table.txt: as `report` prints to a pipe, wide enough that no column is cut


def _divergence(fd: dict | None) -> str:
    if not fd:
        return "none"
    return f"step {fd.get('step')} {fd.get('field')} ({fd.get('source')})"


def _notes(item: Rejudged) -> list[str]:
    if item.run is None:
        return [f"run dir {item.recorded_run} is not here: the recorded first divergence is kept"]
    if item.error is not None:
        return [f"its run could not be classified ({item.error}): the recorded entry is kept"]
    where = [] if str(item.run) == item.recorded_run else [f"found at {item.run}"]
    if item.outcome in NOT_FAILED:  # the counts and status stay the hunt's; say they disagree
        where.append(f"its run now classifies as {item.outcome}, not a failure")
    if not item.changed:
        return [*where, "re-judged from its run: as recorded"]
    return [*where, f"re-judged from its run; recorded by the hunt: {_divergence(item.before)}"]


def rejudge_notes(rejudge: HuntRejudge, kept_only: bool = False) -> dict[str, list[str]]:
    """Each trigger's lines; `kept_only`: only where the recorded entry was kept (what stays
    true after a save, for table.txt)."""
    return {i.trigger: _notes(i) for i in rejudge.runs if not (kept_only and i.judged)}


def render_rejudge(console: Console, rejudge: HuntRejudge) -> None:
    render_hunt(console, rejudge.report, rejudge_notes(rejudge))
    judged = sum(item.judged for item in rejudge.runs)
    console.print(
        Text(
            f"re-judged {judged} of {len(rejudge.runs)} first failing run(s) from their files; "
            f"{len(rejudge.changed)} first divergence(s) differ from hunt.json",
            style="dim",
        )
    )


def table_text(rejudge: HuntRejudge) -> str:
    """table.txt: the hunt's table as plain text, first divergences as judged now; it says
    the same after a second save (no comparison with the hunt.json it replaces)."""
    buf = io.StringIO()
    console = Console(file=buf, width=TABLE_WIDTH, color_system=None, highlight=False)
    render_hunt(console, rejudge.report, rejudge_notes(rejudge, kept_only=True))
    console.print("(first divergences re-judged from the runs: hicache-diag report HUNT_DIR)")
    return buf.getvalue()


def change_lines(rejudge: HuntRejudge) -> list[str]:
    return [
        f"{item.trigger}: first_divergence {_divergence(item.before)} -> {_divergence(item.after)}"
        for item in rejudge.changed
    ]
