"""Annotated option aliases shared by `run` and `bisect` (one definition of each flag).

Defaults are None so that a `--scenario` file can fill in what the command line leaves out; the
command line always wins. The values used when neither gives one are the run options' own
(hicache_diag/options/run_options.py), shown in --help from there.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hicache_diag.engines.registry import ENGINES as ENGINE_REGISTRY
from hicache_diag.engines.registry import default_help

MAX_STEPS_DEFAULT = "auto: 25 x requests + 2 x requests x (max-new-tokens + 1) x loop size + 1000"
ENGINES = ENGINE_REGISTRY.names()


def with_default(help: str, value: object) -> str:
    """`help  [default: X]`, exactly as click prints a real default, for options whose own
    default is None (so that a scenario can fill them in) and for descriptive defaults."""
    return f"{help}  [default: {value}]"


def _opt(*names: str, help: str, metavar: str | None = None, key: str | None = None) -> Any:
    text = with_default(help, default_help(key)) if key else help
    return typer.Option(*names, help=text, metavar=metavar, show_default=False)


FaultOpt = Annotated[
    list[str] | None,
    _opt("--fault", metavar="SPEC", help="Inject a fault: NAME[:key=value,...]; repeatable."),
]
FixOpt = Annotated[
    list[str] | None,
    _opt("--fix", metavar="NAME=MODE", help="Set one protocol switch; repeatable."),
]
ProtocolOpt = Annotated[
    str | None,
    _opt("--protocol", metavar="PRESET", key="protocol", help="Switch preset: legacy, l2, full."),
]
ScenarioOpt = Annotated[
    str | None,
    _opt("--scenario", metavar="FILE", help="TOML scenario: fault tables and run options."),
]
SeedOpt = Annotated[
    int | None, _opt("--seed", metavar="N", key="seed", help="Workload and fault seed.")
]
OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        metavar="DIR",
        help=with_default("Run directory; new or empty.", "runs/<utc>-<seed>"),
        show_default=False,
    ),
]
CheckOpt = Annotated[
    bool,
    _opt(
        "--check",
        help="Compare the verdict with the scenario's [expect] table: exit 0 on a match, 4 if not.",
    ),
]
WarmServerOpt = Annotated[
    bool,
    _opt(
        "--warm-server",
        help="sglang engine, several trials (run --check on a rate scenario): run them one "
        "after another on one server, reused only when every rank proves its state equal to "
        "a fresh server's (else restarted); each trial's manifest says which.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only the verdict JSON on stdout.")]
PpOpt = Annotated[int | None, _opt("--pp", metavar="N", key="pp", help="Pipeline stages.")]
TpOpt = Annotated[
    int | None, _opt("--tp", metavar="N", key="tp", help="Tensor-parallel ranks per stage.")
]
AsyncDepthOpt = Annotated[
    int | None,
    _opt(
        "--async-depth",
        metavar="N",
        key="async_depth",
        help="Extra micro-batch slots; loop size is pp + depth.",
    ),
]
PageSizeOpt = Annotated[
    int | None, _opt("--page-size", metavar="N", key="page_size", help="Tokens per page.")
]
MaxTotalTokensOpt = Annotated[
    int | None,
    _opt("--max-total-tokens", metavar="N", key="max_total_tokens", help="Device KV pool tokens."),
]
HicacheSizeOpt = Annotated[
    str | None,
    _opt(
        "--hicache-size",
        metavar="SIZE",
        key="hicache_size",
        help="Host pool bytes per rank, e.g. 64MiB; 0 uses --hicache-ratio.",
    ),
]
HicacheRatioOpt = Annotated[
    float | None,
    _opt(
        "--hicache-ratio",
        metavar="X",
        key="hicache_ratio",
        help="Host pool = X times the device pool.",
    ),
]
WritePolicyOpt = Annotated[
    str | None,
    _opt(
        "--hicache-write-policy",
        metavar="POLICY",
        key="hicache_write_policy",
        help="write_through, write_back or write_through_selective.",
    ),
]
StorageBackendOpt = Annotated[
    str | None,
    _opt(
        "--hicache-storage-backend",
        "--storage-backend",
        metavar="NAME",
        key="hicache_storage_backend",
        help="L3 backend: none or file.",
    ),
]
StorageDirOpt = Annotated[
    str | None,
    typer.Option(
        "--hicache-storage-dir",
        "--storage-dir",
        metavar="DIR",
        help=with_default("L3 file directory (needs --storage-backend file).", "the run dir"),
        show_default=False,
    ),
]
PrefetchPolicyOpt = Annotated[
    str | None,
    _opt(
        "--hicache-storage-prefetch-policy",
        metavar="POLICY",
        key="hicache_storage_prefetch_policy",
        help="best_effort, wait_complete or timeout.",
    ),
]
WorkloadOpt = Annotated[
    str | None,
    _opt(
        "--workload",
        metavar="NAME",
        key="workload",
        help="shared-prefix, random, long-prompt or idle; --engine sglang only: "
        "session-timeout, session-close, flush-timeout, overload (docs/sources.md).",
    ),
]
RequestsOpt = Annotated[
    int | None, _opt("--requests", metavar="N", key="requests", help="Number of requests.")
]
MaxNewTokensOpt = Annotated[
    int | None,
    _opt(
        "--max-new-tokens", metavar="N", key="max_new_tokens", help="Tokens generated per request."
    ),
]
HangTimeoutOpt = Annotated[
    float | None,
    _opt(
        "--hang-timeout",
        metavar="SECONDS",
        key="hang_timeout",
        help="No rank step for this long (from the first step on) is a hang.",
    ),
]
MaxStepsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-steps",
        metavar="N",
        help=with_default(
            "Step budget: PP0 stops after N steps; running out is undecided (exit 3), never a "
            "verdict.",
            MAX_STEPS_DEFAULT,
        ),
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    str | None,
    _opt(
        "--device",
        metavar="NAME",
        key="device",
        help="auto, cpu or cuda. auto: --engine sglang runs on CUDA when the release's torch "
        "sees a GPU per rank, else on the CPU; cuda is refused where it cannot run.",
    ),
]
EngineOpt = Annotated[
    str | None,
    _opt(
        "--engine",
        metavar="NAME",
        key="engine",
        help="builtin (our compact runtime) or sglang (the real SGLang server).",
    ),
]
ModelOpt = Annotated[
    str | None,
    _opt("--model", metavar="DIR", help="sglang engine: a model directory [a tiny Llama]."),
]
SglangArgOpt = Annotated[
    list[str] | None,
    _opt(
        "--sglang-arg",
        metavar="ARG",
        help="sglang engine: one more launch_server argument, "
        "e.g. --sglang-arg=--watchdog-timeout=60; repeatable.",
    ),
]
SglangEnvOpt = Annotated[
    list[str] | None,
    _opt(
        "--sglang-env",
        metavar="NAME=VALUE",
        help="sglang engine: one more environment variable for the server, "
        "e.g. --sglang-env SGLANG_REQ_WAITING_TIMEOUT=1.5; repeatable.",
    ),
]
SglangPythonOpt = Annotated[
    str | None,
    _opt(
        "--sglang-python",
        metavar="PATH",
        help="sglang engine: the Python whose SGLang release to run [this one].",
    ),
]
NnodesOpt = Annotated[
    int | None,
    _opt(
        "--nnodes",
        metavar="N",
        key="nnodes",
        help="sglang engine: one server per node with SGLang's --nnodes/--node-rank/"
        "--dist-init-addr, PP stages on different nodes (loopback nodes here; --hosts: machines).",
    ),
]
