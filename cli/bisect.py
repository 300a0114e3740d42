"""`hicache-diag bisect` (being built; see the issue that owns it)."""

from __future__ import annotations

import typer

from hicache_diag.errors import HicacheDiagError


def register(app: typer.Typer) -> None:
    @app.command("bisect")
    def _bisect() -> None:
        """Not built yet."""
        raise HicacheDiagError("'bisect' is not built yet")
