"""`hicache-diag triage` (being built; see the issue that owns it)."""

from __future__ import annotations

import typer

from hicache_diag.errors import HicacheDiagError


def register(app: typer.Typer) -> None:
    @app.command("triage")
    def _triage() -> None:
        """Not built yet."""
        raise HicacheDiagError("'triage' is not built yet")
