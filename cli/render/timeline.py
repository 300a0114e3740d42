"""Renders a `TimelineTable`: the measured iterations next to the formula."""

from __future__ import annotations

from rich.table import Table

from hicache_diag.cli.render.console import SafeConsole as Console


def render_timeline(table, console: Console | None = None) -> None:
    import sys

    # Piped output gets a wide table instead of rich's 80-column wrap.
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    t = Table(
        title=(
            f"HiCache ack latency, PP{table.pp} + {table.async_depth} async "
            f"(pp_loop_size {table.loop_size}), iterations after the prefill launch"
        )
    )
    for col in ("event", "issued", "ack queued", "ack consumed", "measured delay", "formula"):
        t.add_column(col, justify="left" if col in ("event", "formula") else "right")
    for ev in table.events:
        text, value = table.formula(ev.event)
        mark = "" if value == ev.delay_iters else "  (differs)"
        t.add_row(
            f"{ev.event}_ack",
            f"+{ev.issued_iter}",
            f"+{ev.ack_queued_iter}",
            f"+{ev.ack_consumed_iter}",
            f"+{ev.delay_iters}",
            text + mark,
        )
    console.print(t)
    observed = ", ".join(
        f"{kind} " + " ".join(f"+{d}x{n}" for d, n in counts.items())
        for kind, counts in table.observed.items()
    )
    console.print(
        f"measured on rank {table.rank} from {table.samples} host-hit prefill(s) "
        f"(shown: {table.rid} launched at step {table.launch_step}); observed: {observed}; "
        f"ranks agree: {'yes' if table.ranks_agree else 'no'}"
    )
