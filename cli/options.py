"""Annotated option aliases shared by `run` and `bisect` (one definition of each flag).

Defaults are None so that a `--scenario` file can fill in what the command line leaves out; the
command line always wins. `RUN_DEFAULTS` holds the values used when neither gives one.
"""

from __future__ import annotations

from typing import Annotated

import typer

RUN_DEFAULTS = {
    "pp": 2,
    "tp": 1,
    "async_depth": 0,
    "page_size": 4,
    "max_total_tokens": 1024,
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
    "engine": "builtin",
}
ENGINES = ("builtin", "sglang")

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
CheckOpt = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Compare the verdict with the scenario's [expect] table: exit 0 on a match, 4 if not.",
    ),
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
EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine", help="builtin (our compact runtime) or sglang (the real server) [builtin]."
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", help="sglang engine: a model directory [a tiny built-in Llama]."),
]
SglangArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sglang-arg", help="sglang engine: one more launch_server argument (repeatable)."
    ),
]
SGLANG_SCENARIO_KEYS = ("sglang_python", "sglang_version")  # scenario-only, sglang engine only
SglangPythonOpt = Annotated[
    str | None,
    typer.Option("--sglang-python", help="sglang engine: the Python whose SGLang release to run."),
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu|cuda [cpu].")]
