"""The builtin engine: our compact SGLang (engines/builtin/runtime/) beneath the one trial loop.
Its peer is hicache_diag/engines/sglang/; neither imports the other (both speak run_options.py)."""
