"""Annotated option aliases shared by `run` and `bisect` (one definition of each flag).

Defaults are None so that a `--scenario` file can fill in what the command line leaves out; the
command line always wins. `RUN_DEFAULTS` holds the values used when neither gives one.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_diag.errors import UsageError

RUN_DEFAULTS = {
    "pp": 2,
    "tp": 1,
    "async_depth": 0,
    "page_size": 4,
    "max_total_tokens": 256,
    "hicache_size": "0",
    "hicache_ratio": 2.0,
    "hicache_write_policy": "write_through",
    "hicache_storage_backend": "none",
    "hicache_storage_dir": None,
    "hicache_storage_prefetch_policy": "best_effort",
    "workload": "shared-prefix",
    "requests": 32,
    "max_new_tokens": 8,
    "hang_timeout": 5.0,
    "device": "cpu",
    "protocol": "full",
    "seed": 0,
}

# The type each scenario key must have (TOML gives ints, floats, strings, lists); `fix` is the
# scenario's list of --fix switches. Scenario keys are the run flags' names in snake_case.
_INT, _NUM, _STR = (int,), (int, float), (str,)
SCENARIO_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("pp", "tp", "async_depth", "page_size", "max_total_tokens"), _INT),
    **dict.fromkeys(("requests", "max_new_tokens", "seed"), _INT),
    **dict.fromkeys(("hicache_ratio", "hang_timeout"), _NUM),
    **dict.fromkeys(("hicache_write_policy", "hicache_storage_backend", "protocol"), _STR),
    **dict.fromkeys(("hicache_storage_dir", "hicache_storage_prefetch_policy"), _STR),
    **dict.fromkeys(("workload", "device"), _STR),
    "hicache_size": (str, int),
    "fix": (list,),
}
_TYPE_WORDS = {
    _INT: "an integer",
    _NUM: "a number",
    _STR: "a string",
    (str, int): 'a size such as "64MiB" or a byte count',
    (list,): 'a list of "NAME=MODE" strings',
}


def check_scenario_options(path: str, opts: dict) -> None:
    """Unknown keys and wrong types are bad input (exit 2), with the valid keys named."""
    for key, value in opts.items():
        want = SCENARIO_TYPES.get(key)
        if want is None:
            valid = ", ".join(sorted([*SCENARIO_TYPES, "description", "fault"]))
            raise UsageError(f"scenario {path!r}: unknown key {key!r}; valid keys: {valid}")
        ok = isinstance(value, want) and not isinstance(value, bool)
        if ok and key == "fix":
            ok = all(isinstance(v, str) for v in value)
        if not ok:
            raise UsageError(f"scenario {path!r}: {key} must be {_TYPE_WORDS[want]}, not {value!r}")


FaultOpt = Annotated[
    list[str] | None,
    typer.Option("--fault", help="Inject a fault: NAME[:key=value,...] (repeatable)."),
]
FixOpt = Annotated[
    list[str] | None,
    typer.Option("--fix", help="Set one protocol switch: NAME=MODE (repeatable)."),
]
ProtocolOpt = Annotated[
    str | None, typer.Option("--protocol", help="Switch preset: legacy, l2 or full [full].")
]
ScenarioOpt = Annotated[
    str | None, typer.Option("--scenario", help="TOML scenario: [[fault]] tables and run options.")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Workload and fault seed [0].")]
OutOpt = Annotated[str | None, typer.Option("--out", help="Run directory [runs/<utc>-<seed>/].")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the verdict JSON on stdout.")]
PpOpt = Annotated[int | None, typer.Option("--pp", help="Pipeline stages [2].")]
TpOpt = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel ranks per stage [1].")]
AsyncDepthOpt = Annotated[
    int | None, typer.Option("--async-depth", help="pp_async_batch_depth; loop size pp+depth [0].")
]
PageSizeOpt = Annotated[int | None, typer.Option("--page-size", help="Tokens per page [4].")]
MaxTotalTokensOpt = Annotated[
    int | None, typer.Option("--max-total-tokens", help="Device KV pool tokens [1024].")
]
HicacheSizeOpt = Annotated[
    str | None, typer.Option("--hicache-size", help="Host pool bytes per rank, e.g. 64MiB [0].")
]
HicacheRatioOpt = Annotated[
    float | None, typer.Option("--hicache-ratio", help="Host pool = ratio x device [2.0].")
]
WritePolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--hicache-write-policy", help="write_through|write_back|write_through_selective."
    ),
]
StorageBackendOpt = Annotated[
    str | None,
    typer.Option("--hicache-storage-backend", "--storage-backend", help="L3 backend: none|file."),
]
StorageDirOpt = Annotated[
    str | None, typer.Option("--hicache-storage-dir", "--storage-dir", help="L3 file directory.")
]
PrefetchPolicyOpt = Annotated[
    str | None,
    typer.Option("--hicache-storage-prefetch-policy", help="best_effort|wait_complete|timeout."),
]
WorkloadOpt = Annotated[
    str | None,
    typer.Option("--workload", help="shared-prefix|random|long-prompt|idle [shared-prefix]."),
]
RequestsOpt = Annotated[int | None, typer.Option("--requests", help="Number of requests [32].")]
MaxNewTokensOpt = Annotated[
    int | None, typer.Option("--max-new-tokens", help="Tokens generated per request [8].")
]
HangTimeoutOpt = Annotated[
    float | None,
    typer.Option("--hang-timeout", help="Seconds without a rank step before a hang [5]."),
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu|cuda [cpu].")]
