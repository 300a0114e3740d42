"""Rendering of result records (the only place that imports rich)."""
