"""The hicache-diag command line (installed as hicache_diag.cli): typer + rich, no runtime logic."""
