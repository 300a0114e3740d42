"""`hicache-diag bisect`: crash rates over a matrix of switches (docs/design.md §6)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import typer

from hicache_diag.cli.bisect_releases import release_labels, release_pythons
from hicache_diag.cli.params import Check, Parsed, check, flag
from hicache_diag.cli.run_flags import pass_through_names, run_fields
from hicache_diag.diagnosis.bisect_table import RELEASE_AXIS
from hicache_diag.engines.registry import release_options
from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_seconds
from hicache_diag.options.params import HOSTS, SSH_CONFIG, VIA, Param, restated
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.bisect import (
    HOST_AXIS,
    STORAGE_AXIS,
    Axis,
    BisectConfig,
    parse_switch,
    parse_values,
)

# Axes: a run option's own flag (declared once, on its field), comma-separated values to compare.
BACKENDS = restated(
    RunOptions, "hicache_storage_backend", "Backends to compare, e.g. none,file.", "V1,V2"
)
SIZES = restated(RunOptions, "hicache_size", "Host sizes to compare, e.g. 16MiB,64MiB.", "S1,S2")
SWITCH = Param(
    "--switch",
    "A protocol switch or run option: several values are compared (an axis), one is set in "
    "every cell; repeatable.",
    "NAME=V1,V2",
)
TRIALS = Param("--trials", "Trials per cell.", "N")
JOBS = Param("--jobs", "Trials run in parallel.", "N", aliases=("-j",))
SEED = Param("--seed", "Seed of trial 0 (trial j: +j).", "N")
OUT = Param("--out", "Parent of the run dirs.", "DIR")
TIMEOUT = Param("--trial-timeout", "Seconds before killing a trial.", "SECONDS")
JSON = Param("--json", "Print the table as JSON.")
PYTHONS = restated(
    release_options(),
    "sglang_python",
    "SGLang releases to compare, as interpreters (one: every cell).",
    "PY1,PY2",
)
VERSIONS = Param(
    "--sglang-version", "Releases by version, from $HICACHE_DIAG_SGLANG_VENVS/sglang-<V>.", "V1,V2"
)
OWN = (BACKENDS, SIZES, SWITCH, TRIALS, JOBS, SEED, OUT, TIMEOUT, JSON, PYTHONS, VERSIONS)
OWN += (VIA, HOSTS, SSH_CONFIG)
# Run flags bisect does not pass through: its own, or what means nothing over many trials.
NOT_PASSED = {s for p in OWN for s in p.spellings} | {"--check", "--list-faults"}


def _axes(storage: str | None, size: str | None, switches: list[str]) -> tuple[Axis, ...]:
    from hicache_diag.engines.registry import protocol_switches

    names = pass_through_names()
    axes = []
    if storage is not None:
        values = parse_values(str(BACKENDS), storage)
        axes.append(Axis(STORAGE_AXIS, values, field=names[str(BACKENDS).removeprefix("--")]))
    if size is not None:
        values = parse_values(str(SIZES), size)
        axes.append(Axis(HOST_AXIS, values, field=names[str(SIZES).removeprefix("--")]))
    known = protocol_switches() if switches else {}
    axes += [parse_switch(spec, names, known) for spec in switches]
    return tuple(axes)


def _fixed(axes: tuple[Axis, ...], base: RunOptions) -> tuple[tuple[Axis, ...], RunOptions, list]:
    """An axis of one value beside one that varies is a setting of every cell (`--switch
    ack-count=leader` as in `run`), applied to the options the cells start from; with the run
    flags that say so (each trial's reproducing line)."""
    if not any(len(a.values) > 1 for a in axes):
        return axes, base, []
    args = []
    for axis in axes:
        if len(axis.values) == 1:
            base = axis.apply(base, axis.values[0])
            args += axis.args(axis.values[0])
    return tuple(a for a in axes if len(a.values) > 1), base, args


def _refuse_flat_axes(axes: tuple[Axis, ...], fixed_ok: bool = False) -> None:
    """An axis with one value (unless `fixed_ok`: a setting beside an axis that varies), or a
    value twice, compares nothing (or a cell with itself); an axis given twice would overwrite
    itself in every cell."""
    names = [a.name for a in axes]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise UsageError(f"bisect axis {twice} is given twice; give it once with every value")
    for axis in axes:
        dup = next((v for i, v in enumerate(axis.values) if v in axis.values[:i]), None)
        if dup is not None:
            raise UsageError(f"bisect axis {axis.name} lists {dup!r} twice; give distinct values")
        if len(axis.values) < 2 and not fixed_ok:
            raise UsageError(
                f"bisect axis {axis.name} has one value ({axis.values[0]}): nothing to compare; "
                "give two or more, e.g. --switch host-alloc=local,two-phase"
            )


def with_cell_configs(
    base: RunOptions, cfg: BisectConfig, trial_timeout: float | None = None
) -> tuple[BisectConfig, int]:
    """Each cell's engine config: the pass-through run options with the cell's axis values
    (Axis.apply), built by their engine once, before any trial starts: a bad axis value or
    release is one line and exit 2, not N failed trials. Returns the config holding them, with
    `trial_timeout` (--trial-timeout) or else the cells' engine's own trial timeout, and the
    most ranks any cell runs."""
    from hicache_diag.engines.registry import build, engine
    from hicache_diag.trials.bisect import matrix

    if base.out is not None:
        raise UsageError("give --out to bisect itself (the parent of every trial's run dir)")
    configs = []
    for values in matrix(cfg.axes):
        options = base
        for axis in cfg.axes:
            options = axis.apply(options, values[axis.name])
        configs.append(build(options))
    world = max(c.world_size for c in configs)
    if trial_timeout is None:  # each engine's own: real SGLang starts in tens of seconds
        trial_timeout = type(base).trial_timeout_s
    preload = engine(base.engine).preload
    warm = engine(base.engine).warm if getattr(base, "warm_server", False) else None
    done = replace(
        cfg, cells=tuple(configs), trial_timeout_s=trial_timeout, preload=preload, warm=warm
    )
    return done, world


def _cells(axes: tuple[Axis, ...]) -> int:
    n = 1
    for a in axes:
        n *= len(a.values)
    return n


def _cells(axes: tuple[Axis, ...]) -> int:
    return math.prod(len(a.values) for a in axes)


Backends = flag(BACKENDS, str | None)
Sizes = flag(SIZES, str | None)
Switches = flag(SWITCH, list[str] | None)
Trials = flag(TRIALS, int)
Jobs = flag(JOBS, int)
Seed = flag(SEED, int)
Out = flag(OUT, str | None, "runs/bisect-<utc>")
Timeout = flag(TIMEOUT, float | None, "300; 900 with --engine sglang")
Json = flag(JSON, bool)
Pythons = flag(PYTHONS, str | None)
Versions = flag(VERSIONS, str | None)
Via = flag(VIA, str | None)
Hosts = flag(HOSTS, str | None)
SshConfig = flag(SSH_CONFIG, str | None)


EXAMPLES = """\b
Examples:
  hicache-diag bisect --storage-backend none,file --hicache-size 16MiB,64MiB \\
      --trials 3 --jobs 2 --scenario samples/scenarios/form_a.toml
  hicache-diag bisect --switch host-alloc=local,two-phase --trials 5 \\
      --protocol legacy --fault host-alloc-fail:rank=1
  hicache-diag bisect --engine sglang --sglang-version 0.5.18,0.5.21 \\
      --trials 4 --pp 2 --hicache-storage-backend file --via ssh --hosts n1,n2
                    # a trial per free host (or --via slurm: a job step each);
                    # --out on a path the hosts share

Exit: 0 completed, whatever it found (table.json and table.md in --out),
3 no trial finished (each undecided, its cause in the table: nothing concluded),
130 interrupted (partial table), 2 bad input, 1 internal error."""


def add_run_flags_to_help(app: typer.Typer) -> None:
    """Append the `run` flags that bisect passes through to its --help (from the run options'
    own declarations, so the list is the run command's)."""
    from hicache_diag.cli.run_flags import ENGINE, SCENARIO

    spelled = [s for _, p, _ in run_fields() for s in (p.flag, *p.aliases)]
    flags = sorted({str(ENGINE), str(SCENARIO), *spelled} - NOT_PASSED)
    lines, line = [], " "
    for name in flags:
        if len(line) + len(name) + 1 > 76:
            lines.append(line)
            line = " "
        line += f" {name}"
    lines.append(line)
    text = "\n".join(
        ["\b", "Run flags passed to every trial (see hicache-diag run --help):", *lines]
    )
    for info in app.registered_commands:
        if info.name == "bisect":
            info.epilog = f"{EXAMPLES}\n\n{text}"


def _planned_trials(p: Parsed) -> int:
    """Trials the matrix holds, from the axis flags as given (each value list's length)."""
    lists = [p.value(x) for x in (BACKENDS, SIZES, VERSIONS, PYTHONS)]
    lists += [s.partition("=")[2] for s in p.value(SWITCH) or ()]
    counts = [len([x for x in str(v).split(",") if x.strip()]) for v in lists if v]
    return int(p.value(TRIALS) or 1) * math.prod(counts)


def _idle_jobs(p: Parsed) -> str | None:
    from hicache_diag.options.limits import check_jobs

    trials, jobs = _planned_trials(p), p.value(JOBS)
    if not (p.given(JOBS) and isinstance(jobs, int) and jobs > trials >= 1):
        return None
    try:
        check_jobs(jobs, 1)  # a --jobs past what fits is bisect's own refusal, not a warning
    except UsageError:
        return None
    return f"{JOBS} {jobs}: the matrix has {trials} trial(s), so at most {trials} run at once"


# bisect's own input rules (the run flags it passes through are checked as run's, per cell).
CHECKS = (Check("more-jobs-than-trials", _idle_jobs, warn=True),)


def bisect(
    ctx: typer.Context,
    storage_backend: Backends = None,
    hicache_size: Sizes = None,
    switch: Switches = None,
    trials: Trials = 3,
    jobs: Jobs = 1,
    seed: Seed = 0,
    out: Out = None,
    trial_timeout: Timeout = None,
    json_out: Json = False,
    sglang_python: Pythons = None,
    sglang_version: Versions = None,
    via: Via = None,
    hosts: Hosts = None,
    ssh_config: SshConfig = None,
) -> None:
    """Repeat `run` over a matrix of switches; any other `run` flag applies to every cell."""
    from hicache_diag.cli.render.bisect import trial_progress
    from hicache_diag.cli.render.console import err_console

    check(ctx, CHECKS)
    request = BisectRequest(
        ctx.args,
        storage_backend,
        hicache_size,
        tuple(switch or ()),
        trials,
        jobs,
        seed,
        out,
        trial_timeout,
        sglang_python,
        sglang_version,
    )
    cfg, labels = plan_bisect(request, quiet=json_out)
    if via or hosts or ssh_config:  # hicache_diag/trials/remote_trials.py
        from hicache_diag.trials.remote_trials import via as trials_via

        cfg = trials_via(cfg, via, hosts, ssh_config)
    cells = _cells(cfg.axes)
    progress, on_result = trial_progress(err_console, cells * trials, quiet=json_out)
    from hicache_diag.cli.bisect_show import run_and_show

    raise typer.Exit(run_and_show(cfg, progress, on_result, labels, json_out))


@dataclass(frozen=True, slots=True)
class BisectRequest:
    """What `bisect` was asked, as typed (run_args: the pass-through `run` flags)."""

    run_args: list[str]
    storage_backend: str | None
    hicache_size: str | None
    switches: tuple[str, ...]
    trials: int
    jobs: int
    seed: int
    out: str | None
    trial_timeout: float | None
    sglang_python: str | None
    sglang_version: str | None


def _matrix(req: BisectRequest, base: RunOptions) -> tuple[tuple[Axis, ...], RunOptions, tuple]:
    """The axes (the release axis last), the options every cell starts from (and the run flags
    every trial adds for them), the releases."""
    axes = _axes(req.storage_backend, req.hicache_size, list(req.switches))
    _refuse_flat_axes(axes, fixed_ok=True)
    axes, base, fixed = _fixed(axes, base)
    given = req.sglang_python is not None or req.sglang_version is not None
    pythons, versions = release_pythons(
        req.sglang_python, req.sglang_version, base.engine if given else ""
    )
    release = pass_through_names()[str(PYTHONS).removeprefix("--")]
    if len(pythons) == 1:  # one release: every cell runs it, as `run --sglang-python` does
        base = base.with_value(release, pythons[0], str(PYTHONS))
    elif pythons:
        axes += (Axis(RELEASE_AXIS, tuple(pythons), field=release),)
    return axes, base, (pythons, versions, fixed)


def plan_bisect(req: BisectRequest, quiet: bool = False) -> tuple[BisectConfig, dict]:
    """Every check, then each cell's engine config: the bisect ready to run, and the releases'
    labels. Bad input raises UsageError before any trial starts."""
    from hicache_diag.cli.render.console import err_console
    from hicache_diag.cli.render.status import PhaseStatus
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.options.limits import check_jobs, check_seed, check_trials
    from hicache_diag.trials.rundir import check_writable

    if req.trial_timeout is not None:
        check_seconds(str(TIMEOUT), req.trial_timeout)
    check_writable(req.out)  # a file, non-empty or unwritable: 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(req.out) if req.out is not None else Path("runs") / f"bisect-{stamp}"
    axes, base, (pythons, versions, fixed) = _matrix(req, options_from_argv(req.run_args))
    if base.check:
        raise UsageError(
            "--check does nothing in bisect (it tabulates rates; no verdict is checked): "
            "use run --check on one scenario, or [expect] trials for a rate"
        )
    cfg = BisectConfig(axes, req.trials, req.jobs, req.seed, out, (*req.run_args, *fixed))
    if not axes:
        raise UsageError(
            "bisect needs a matrix: --storage-backend V1,V2, --hicache-size S1,S2, "
            "--sglang-version V1,V2 or --switch NAME=v1,v2"
        )
    _refuse_flat_axes(axes)
    check_trials(req.trials, _cells(axes), out)
    check_seed(req.seed)
    check_seed(req.seed + req.trials - 1, "--seed + --trials - 1")  # trial j runs seed + j
    with PhaseStatus(err_console, quiet, f"checking {_cells(axes)} cell(s)"):
        cfg, world = with_cell_configs(base, cfg, req.trial_timeout)  # sglang: probes releases
    check_jobs(req.jobs, world)
    labels = release_labels(axes[-1].values, versions) if len(pythons) > 1 else {}
    return cfg, labels


def register(app: typer.Typer) -> None:
    app.command(
        "bisect",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog=EXAMPLES,
        short_help="Crash rates over a matrix of switches, 95% intervals.",
    )(bisect)
