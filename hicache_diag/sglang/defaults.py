"""`--engine sglang`'s defaults where the builtin engine's do not fit (no heavy imports: the CLI's
--help reads them)."""

# Real SGLang on a 2-core CPU starts in tens of seconds and steps in milliseconds, so silence
# means more here; the pool is small enough that hot prefixes cycle through the host tier.
SGLANG_DEFAULTS = {
    "max_total_tokens": 256,
    "hang_timeout": 30.0,
    "requests": 24,
}
TRIAL_TIMEOUT_S = 900.0  # a bisect trial: start-up alone takes tens of seconds
