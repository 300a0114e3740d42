"""`hicache-diag report HUNT_DIR`: a saved hunt's table with each trigger's first failing run
re-judged from its files; `--save --force` rewrites hunt.json's first divergences and
table.txt (atomically, saying what changed). Nothing is written without --save."""

from __future__ import annotations

import sys
from pathlib import Path

from hicache_diag.errors import UsageError

# report's run-dir outputs, refused for a hunt dir (its runs are reported one by one)
RUN_ONLY = ("--plots", "--summary", "--html")


def check_hunt_flags(hunt_dir: Path, given: dict[str, object], save: bool, force: bool):
    """Refusals before anything is read: a run dir's outputs, or a save that would replace
    files without --force (the report command's rule: outputs exist only with --force)."""
    from hicache_diag.evidence.output_paths import claim_file
    from hicache_diag.hunt.rejudge import HUNT_JSON, TABLE_TXT

    for flag in RUN_ONLY:
        if given.get(flag) is not None:
            raise UsageError(
                f"{flag} renders one run dir; {str(hunt_dir)!r} is a hunt (hunt.json): "
                "give one of its runs"
            )
    if given.get("--reclassify") is not None:
        # Re-tallying every trial afresh would leave the hunt's confirming reruns, shrink and
        # export pointing at a first failure that may no longer be the first: refused.
        raise UsageError(
            f"--reclassify: {str(hunt_dir)!r} is a hunt: its report already classifies each "
            "trigger's first failing run afresh (verdict.json ignored) and keeps the hunt's own "
            "trial counts; give one run dir to reclassify it"
        )
    if not save:
        return
    for name in (HUNT_JSON, TABLE_TXT):
        path = hunt_dir / name
        if path.exists() and not force:
            raise UsageError(
                f"--save would rewrite {path}; add --force to replace it (hunt.json: only "
                "its first divergences change)"
            )
        claim_file("--save", path, force=True)  # evidence, read-only folder, not a file


def _save(rejudge) -> list[str]:
    """Write what differs, each file atomically; the lines that say what was written."""
    from hicache_diag.cli.render.hunt_rejudge import change_lines, table_text
    from hicache_diag.evidence.output_paths import write_atomic
    from hicache_diag.hunt.rejudge import HUNT_JSON, TABLE_TXT

    lines = []
    hunt_json = rejudge.hunt_json() if rejudge.changed else None  # else left as it was
    for name, text in ((HUNT_JSON, hunt_json), (TABLE_TXT, table_text(rejudge))):
        path = rejudge.hunt_dir / name
        if text is None or (path.is_file() and path.read_text() == text):
            lines.append(f"{path}: unchanged")
            continue
        write_atomic(path, text)
        lines.append(f"wrote {path}")
        if name == HUNT_JSON:
            lines += [f"  {line}" for line in change_lines(rejudge)]
    return lines


def report_hunt(hunt_dir: Path, save: bool, json_out: bool) -> None:
    from hicache_diag.cli.render.console import print_json
    from hicache_diag.cli.render.hunt_rejudge import render_rejudge
    from hicache_diag.hunt.rejudge import rejudge_hunt

    rejudge = rejudge_hunt(hunt_dir)
    written = _save(rejudge) if save else []
    if json_out:
        print_json(rejudge.report.to_json())
    else:
        from hicache_diag.cli.render.console import SafeConsole as Console

        width = None if sys.stdout.isatty() else 140
        render_rejudge(Console(highlight=False, width=width), rejudge)
    for line in written:  # whole lines (paths unwrapped), as report's notes are written
        sys.stderr.write(line + "\n")
