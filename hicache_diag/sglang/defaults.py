"""`--engine sglang`'s defaults: the builtin engine's, except where they do not fit real SGLang
(no heavy imports: the CLI's --help reads them)."""

from hicache_diag.harness import builtin

# Real SGLang on a 2-core CPU starts in tens of seconds and steps in milliseconds, so silence
# means more here; the pool is small enough that hot prefixes cycle through the host tier.
SGLANG_DEFAULTS = {
    "max_total_tokens": 256,
    "hang_timeout": 30.0,
    "requests": 24,
}
DEFAULTS = {**builtin.DEFAULTS, **SGLANG_DEFAULTS}
TRIAL_TIMEOUT_S = 900.0  # a bisect trial: start-up alone takes tens of seconds
