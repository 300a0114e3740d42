"""`hicache-diag bisect`: crash rates over a matrix of switches (docs/design.md §6)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from hicache_diag.cli.options import with_default
from hicache_diag.cli.triage_cluster import Hosts, SshConfig, TrialVia
from hicache_diag.diagnosis.bisect_table import RELEASE_AXIS
from hicache_diag.errors import UsageError
from hicache_diag.options.limits import check_seconds
from hicache_diag.options.run_options import RunOptions
from hicache_diag.trials.bisect import (
    HOST_AXIS,
    STORAGE_AXIS,
    Axis,
    BisectConfig,
    parse_switch,
    parse_values,
)


def _run_options() -> set[str]:
    """Long option names of the `run` command, so --switch can vary any of them."""
    from hicache_diag.cli.run import _app

    run = typer.main.get_command(_app())
    names = set()
    for param in getattr(run, "params", []):
        names |= {o.removeprefix("--") for o in param.opts if o.startswith("--")}
    return names - {"out", "json", "seed", "list-faults"}  # list-faults prints and exits


def _axes(storage: str | None, size: str | None, switches: list[str]) -> tuple[Axis, ...]:
    axes = []
    if storage is not None:
        axes.append(Axis(STORAGE_AXIS, parse_values("--storage-backend", storage)))
    if size is not None:
        axes.append(Axis(HOST_AXIS, parse_values("--hicache-size", size)))
    from hicache_diag.engines.registry import protocol_switches

    options = _run_options() if switches else set()
    known = protocol_switches() if switches else {}
    axes += [parse_switch(spec, options, known) for spec in switches]
    return tuple(axes)


def _venv_python(version: str) -> str:
    import os

    from hicache_diag.engines.registry import release_engine

    releases = release_engine().releases
    VENVS_ENV = releases.venvs_env
    root = os.environ.get(VENVS_ENV)
    if not root:
        raise UsageError(
            f"--sglang-version {version}: set ${VENVS_ENV} to the directory that "
            "holds one venv per release (sglang-<version>/)"
        )
    python = releases.venv_python(version)
    if python is None:
        raise UsageError(
            f"--sglang-version {version}: no {root}/sglang-{version}/bin/python; "
            f"create it with: {releases.install_command(version)}"
        )
    return python


def _releases(python: str | None, version: str | None, engine: str) -> tuple[list[str], dict]:
    """The releases to compare, as interpreters, and their versions where the flag gave them
    (--sglang-version: resolved through $HICACHE_DIAG_SGLANG_VENVS)."""
    if python is None and version is None:
        return [], {}
    if python is not None and version is not None:
        raise UsageError("--sglang-python and --sglang-version both name the releases: give one")
    from hicache_diag.engines.registry import require_releases

    require_releases(engine, "--sglang-python/--sglang-version")
    if version is not None:
        versions = parse_values("--sglang-version", version)
        pythons = [_venv_python(v) for v in versions]
        return pythons, dict(zip(pythons, versions, strict=True))
    return list(parse_values("--sglang-python", python)), {}


def _release_labels(pythons: tuple[str, ...], known: dict[str, str]) -> dict[str, str]:
    """Each interpreter's SGLang version (probed when the flag gave paths); the path is added
    where two interpreters hold the same version."""
    from hicache_diag.engines.registry import release_engine

    probe = release_engine().releases.probe
    found = {p: known.get(p) or probe(p, "--sglang-python") for p in pythons}
    versions = list(found.values())
    return {p: v if versions.count(v) == 1 else f"{v} ({p})" for p, v in found.items()}


def _refuse_flat_axes(axes: tuple[Axis, ...]) -> None:
    """An axis with one value, or a value twice, compares nothing (or a cell with itself); an
    axis given twice would overwrite itself in every cell."""
    names = [a.name for a in axes]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise UsageError(f"bisect axis {twice} is given twice; give it once with every value")
    for axis in axes:
        dup = next((v for i, v in enumerate(axis.values) if v in axis.values[:i]), None)
        if dup is not None:
            raise UsageError(f"bisect axis {axis.name} lists {dup!r} twice; give distinct values")
        if len(axis.values) < 2:
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


Backends = Annotated[
    str | None,
    typer.Option("--storage-backend", metavar="V1,V2", help="Backends to compare, e.g. none,file."),
]
Sizes = Annotated[
    str | None,
    typer.Option(
        "--hicache-size", metavar="S1,S2", help="Host sizes to compare, e.g. 16MiB,64MiB."
    ),
]
Switches = Annotated[
    list[str] | None,
    typer.Option(
        "--switch",
        metavar="NAME=V1,V2",
        help="A protocol switch or run option to vary; repeatable.",
    ),
]
Trials = Annotated[int, typer.Option("--trials", metavar="N", help="Trials per cell.")]
Jobs = Annotated[int, typer.Option("--jobs", "-j", metavar="N", help="Trials run in parallel.")]
Seed = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of trial 0 (trial j: +j).")]
Out = Annotated[
    str | None,
    typer.Option(
        "--out", metavar="DIR", help=with_default("Parent of the run dirs.", "runs/bisect-<utc>")
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        "--trial-timeout",
        metavar="SECONDS",
        help=with_default("Seconds before killing a trial.", "300; 900 with --engine sglang"),
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the table as JSON.")]
Pythons = Annotated[
    str | None,
    typer.Option(
        "--sglang-python",
        metavar="PY1,PY2",
        help="SGLang releases to compare, as interpreters (one: every cell).",
    ),
]
Versions = Annotated[
    str | None,
    typer.Option(
        "--sglang-version",
        metavar="V1,V2",
        help="Releases by version, from $HICACHE_DIAG_SGLANG_VENVS/sglang-<V>.",
    ),
]


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
    """Append the `run` flags that bisect passes through to its --help (after both commands
    are registered, so the list is the run command's own)."""
    flags = sorted(f"--{name}" for name in _run_options())
    lines, line = [], " "
    for flag in flags:
        if len(line) + len(flag) + 1 > 76:
            lines.append(line)
            line = " "
        line += f" {flag}"
    lines.append(line)
    text = "\n".join(
        ["\b", "Run flags passed to every trial (see hicache-diag run --help):", *lines]
    )
    for info in app.registered_commands:
        if info.name == "bisect":
            info.epilog = f"{EXAMPLES}\n\n{text}"


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
    via: TrialVia = None,
    hosts: Hosts = None,
    ssh_config: SshConfig = None,
) -> None:
    """Repeat `run` over a matrix of switches; any other `run` flag applies to every cell."""
    from hicache_diag.cli.render.bisect import trial_progress
    from hicache_diag.cli.render.console import err_console

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
    """The axes (the release axis last), the options every cell starts from, the releases."""
    axes = _axes(req.storage_backend, req.hicache_size, list(req.switches))
    given = req.sglang_python is not None or req.sglang_version is not None
    pythons, versions = _releases(
        req.sglang_python, req.sglang_version, base.engine if given else ""
    )
    if len(pythons) == 1:  # one release: every cell runs it, as `run --sglang-python` does
        base = base.with_value("sglang_python", pythons[0], "--sglang-python")
    elif pythons:
        axes += (Axis(RELEASE_AXIS, tuple(pythons)),)
    return axes, base, (pythons, versions)


def plan_bisect(req: BisectRequest, quiet: bool = False) -> tuple[BisectConfig, dict]:
    """Every check, then each cell's engine config: the bisect ready to run, and the releases'
    labels. Bad input raises UsageError before any trial starts."""
    from hicache_diag.cli.render.console import err_console
    from hicache_diag.cli.render.status import PhaseStatus
    from hicache_diag.cli.run import options_from_argv
    from hicache_diag.options.limits import check_jobs, check_seed, check_trials
    from hicache_diag.trials.rundir import check_writable

    if req.trial_timeout is not None:
        check_seconds("--trial-timeout", req.trial_timeout)
    check_writable(req.out)  # a file, non-empty or unwritable: 2
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(req.out) if req.out is not None else Path("runs") / f"bisect-{stamp}"
    axes, base, (pythons, versions) = _matrix(req, options_from_argv(req.run_args))
    if base.check:
        raise UsageError(
            "--check does nothing in bisect (it tabulates rates; no verdict is checked): "
            "use run --check on one scenario, or [expect] trials for a rate"
        )
    cfg = BisectConfig(axes, req.trials, req.jobs, req.seed, out, tuple(req.run_args))
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
    labels = _release_labels(axes[-1].values, versions) if len(pythons) > 1 else {}
    return cfg, labels


def register(app: typer.Typer) -> None:
    app.command(
        "bisect",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        epilog=EXAMPLES,
        short_help="Crash rates over a matrix of switches, 95% intervals.",
    )(bisect)
