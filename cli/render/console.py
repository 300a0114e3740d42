"""The shared stderr console: progress, logs and panels never touch stdout (that is for --json)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

err_console = Console(stderr=True, highlight=False)


def print_json(data: dict[str, Any]) -> None:
    """--json output: plain stdout write, never through rich (pdm's pitfall)."""
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()
