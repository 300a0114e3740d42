"""The builtin engine: our compact SGLang (hicache_diag/runtime/) beneath the one trial loop.
Its peer is hicache_diag/sglang/; neither imports the other (both speak run_options.py)."""
