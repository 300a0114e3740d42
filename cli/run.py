"""`hicache-diag run` (being built; see the issue that owns it)."""

from __future__ import annotations

import typer

from hicache_diag.errors import HicacheDiagError


def register(app: typer.Typer) -> None:
    @app.command("run")
    def _run() -> None:
        """Not built yet."""
        raise HicacheDiagError("'run' is not built yet")
