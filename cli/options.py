"""Annotated option aliases shared by `run` and `bisect` (one definition of each flag).

Defaults are None so that a `--scenario` file can fill in what the command line leaves out; the
command line always wins. `RUN_DEFAULTS` holds the values used when neither gives one.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hicache_diag.engines import ENGINES as ENGINE_REGISTRY
from hicache_diag.engines import default_help
from hicache_diag.errors import UsageError
from hicache_diag.harness import builtin

RUN_DEFAULTS = builtin.DEFAULTS  # each engine owns its defaults: harness/engine.py
MAX_STEPS_DEFAULT = "auto: 25 x requests + 2 x requests x (max-new-tokens + 1) x loop size + 1000"
ENGINES = tuple(ENGINE_REGISTRY)

# The type each scenario key must have (TOML gives ints, floats, strings, lists); `fix` is the
# scenario's list of --fix switches. Scenario keys are the run flags' names in snake_case.
_INT, _NUM, _STR = (int,), (int, float), (str,)
SCENARIO_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("pp", "tp", "async_depth", "page_size", "max_total_tokens"), _INT),
    **dict.fromkeys(("requests", "max_new_tokens", "seed", "max_steps"), _INT),
    **dict.fromkeys(("hicache_ratio", "hang_timeout"), _NUM),
    **dict.fromkeys(("hicache_write_policy", "hicache_storage_backend", "protocol"), _STR),
    **dict.fromkeys(("hicache_storage_dir", "hicache_storage_prefetch_policy"), _STR),
    **dict.fromkeys(("workload", "device", "engine", "model", "sglang_python"), _STR),
    "sglang_version": _STR,
    "hicache_size": (str, int),
    "fix": (list,),
    "sglang_arg": (list,),
    "sglang_env": (dict,),
}
_TYPE_WORDS = {
    _INT: "an integer",
    _NUM: "a number",
    _STR: "a string",
    (str, int): 'a size such as "64MiB" or a byte count',
    (list,): "a list of strings",
    (dict,): 'a table of NAME = "VALUE" strings',
}


def check_scenario_options(path: str, opts: dict) -> None:
    """Unknown keys and wrong types are bad input (exit 2), with the valid keys named."""
    for key, value in opts.items():
        want = SCENARIO_TYPES.get(key)
        if want is None:
            valid = ", ".join(sorted([*SCENARIO_TYPES, "description", "fault"]))
            raise UsageError(f"scenario {path!r}: unknown key {key!r}; valid keys: {valid}")
        ok = isinstance(value, want) and not isinstance(value, bool)
        if ok and key in ("fix", "sglang_arg"):
            ok = all(isinstance(v, str) for v in value)
        if ok and key == "sglang_env":
            ok = all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                     for v in value.values())  # fmt: skip
        if not ok:
            raise UsageError(f"scenario {path!r}: {key} must be {_TYPE_WORDS[want]}, not {value!r}")


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
            "verdict.", MAX_STEPS_DEFAULT,
        ),
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    str | None, _opt("--device", metavar="NAME", key="device", help="cpu or cuda.")
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
SGLANG_SCENARIO_KEYS = builtin.SGLANG_SCENARIO_KEYS
SglangPythonOpt = Annotated[
    str | None,
    _opt(
        "--sglang-python",
        metavar="PATH",
        help="sglang engine: the Python whose SGLang release to run [this one].",
    ),
]
