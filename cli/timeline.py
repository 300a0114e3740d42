"""`hicache-diag timeline` (being built; see the issue that owns it)."""

from __future__ import annotations

import typer

from hicache_diag.errors import HicacheDiagError


def register(app: typer.Typer) -> None:
    @app.command("timeline")
    def _timeline() -> None:
        """Not built yet."""
        raise HicacheDiagError("'timeline' is not built yet")
