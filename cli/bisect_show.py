"""bisect's end: the trials run, then the table saved (table.json, table.md beside the trials'
run dirs) and shown, whatever signal comes once the trials ended."""

from __future__ import annotations

import json
from pathlib import Path

from hicache_diag.cli.render.console import print_json
from hicache_diag.trials.bisect import run_bisect


def run_and_show(cfg, progress, on_result, labels: dict, json_out: bool) -> int:
    """The trials, then the table saved and shown whatever signal comes once they ended: a
    Ctrl-C as the last trial finishes still prints the table (run_bisect marks it interrupted
    when it cut trials short)."""
    from hicache_diag.trials.trial_guard import signals_deferred

    table = None
    try:
        with progress:
            table = run_bisect(cfg, on_result)
    except KeyboardInterrupt:
        if table is None:
            raise  # before run_bisect could answer: nothing ran to completion
    with signals_deferred(drop=True):  # the trials are over: nothing left to cut short
        table.releases = labels
        _save_table(table, cfg.out)
        _render(table, json_out)
    return table.exit_code


def _save_table(table, out: Path) -> None:
    """table.json (hicache-diag/bisect/v1) and table.md beside the trials' run dirs."""
    from hicache_diag.cli.render.bisect import table_markdown
    from hicache_diag.evidence.output_paths import write_atomic

    # --out was claimed fresh (check_writable), so these names are ours; written atomically.
    write_atomic(out / "table.json", json.dumps(table.to_json(), indent=2, sort_keys=True) + "\n")
    write_atomic(out / "table.md", table_markdown(table))


def _render(table, json_out: bool) -> None:
    if json_out:
        print_json(table.to_json())
        return
    import sys

    from hicache_diag.cli.render.bisect import render_bisect
    from hicache_diag.cli.render.console import SafeConsole as Console

    # Piped output gets a wide table instead of rich's 80-column truncation.
    render_bisect(table, Console(highlight=False, width=None if sys.stdout.isatty() else 140))
