"""`hicache-diag report` (being built; see the issue that owns it)."""

from __future__ import annotations

import typer

from hicache_diag.errors import HicacheDiagError


def register(app: typer.Typer) -> None:
    @app.command("report")
    def _report() -> None:
        """Not built yet."""
        raise HicacheDiagError("'report' is not built yet")
