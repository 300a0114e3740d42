"""`hicache-diag run`: flags (+ scenario) -> RunConfig -> one trial -> verdict panel or JSON."""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import typer

from hicache_diag.cli import options as o
from hicache_diag.cli.render.console import err_console, print_json
from hicache_diag.cli.render.progress import LiveProgress
from hicache_diag.cli.render.status import PhaseStatus
from hicache_diag.cli.render.verdict import render_check, render_verdict
from hicache_diag.errors import UsageError
from hicache_diag.harness.no_effect import refuse_no_effect
from hicache_diag.limits import check_builtin_run, check_int, check_seconds, check_seed
from hicache_diag.paths import not_empty, output_dir
from hicache_diag.runtime.protocol import build_protocol
from hicache_diag.runtime.server_args import RunConfig, ServerArgs, WorkloadConfig, parse_size
from hicache_diag.verdict import ExitCode, Outcome


def _pick(flags: dict[str, Any], scenario: dict[str, Any], name: str) -> Any:
    """Command line, then scenario file, then the run default."""
    if flags.get(name) is not None:
        return flags[name]
    if scenario.get(name) is not None:
        return scenario[name]
    return o.RUN_DEFAULTS.get(name)


def _scenario(path: str | None) -> tuple[tuple[str, ...], dict[str, Any]]:
    if path is None:
        return (), {}
    from hicache_diag.faults import load_scenario
    from hicache_diag.paths import input_file

    input_file("--scenario", path)  # a device or a FIFO would be read forever
    sc = load_scenario(path)
    opts = dict(sc.options)
    # Scenario keys use run flag names in snake_case; map the storage aliases.
    for alias, name in (
        ("storage_backend", "hicache_storage_backend"),
        ("storage_dir", "hicache_storage_dir"),
    ):
        if alias in opts:
            opts.setdefault(name, opts.pop(alias))
    o.check_scenario_options(path, opts)
    return sc.fault_specs(), opts


def _expectation(path: str | None) -> Any:
    """`--check`: the scenario's [expect] table, refused (exit 2) when there is none to check."""
    if path is None:
        raise UsageError("--check needs --scenario FILE with an [expect] table")
    from hicache_diag.faults import load_scenario

    expect = load_scenario(path).expect
    if expect is None:
        raise UsageError(
            f"--check: scenario {path!r} has no [expect] table "
            '(add e.g. [expect] outcome = "crash", form = "B")'
        )
    return expect


def _check_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available on this host")
    # Honest refusal: the tiny model, its KV pool and the PP transport run on CPU/gloo only.
    raise UsageError("--device cuda is not supported yet: this runtime runs on CPU (gloo)")


def _faults(scenario_faults: tuple[str, ...], flags: dict[str, Any], pp: int, tp: int):
    faults = scenario_faults + tuple(flags.get("fault") or ())
    if not faults:
        return ()
    from hicache_diag.faults import validate_faults

    return tuple(f.to_spec() for f in validate_faults(faults, pp, tp))


def build_engine_config(flags: dict[str, Any]) -> Any:
    """RunConfig (builtin) or SglangRunConfig, validated before any process starts."""
    scenario_faults, sopts = _scenario(flags.get("scenario"))
    pick = lambda name: _pick(flags, sopts, name)  # noqa: E731
    engine = pick("engine")
    if engine not in o.ENGINES:
        raise UsageError(f"unknown --engine {engine!r}; valid: {', '.join(o.ENGINES)}")
    sglang_only = [f for f in ("model", "sglang_arg", "sglang_python") if flags.get(f)]
    if engine == "builtin":
        if sglang_only:
            flag = "--" + sglang_only[0].replace("_", "-")
            raise UsageError(f"{flag} applies to --engine sglang only")
        scenario_only = [k for k in o.SGLANG_SCENARIO_KEYS if sopts.get(k) is not None]
        if scenario_only:
            raise UsageError(
                f'scenario key {scenario_only[0]!r} applies to engine = "sglang" only '
                "(the scenario or --engine says builtin)"
            )
        return build_run_config(flags)
    from hicache_diag.harness.rundir import check_writable
    from hicache_diag.sglang.build import build_sglang_config

    check_writable(flags.get("out"))
    if pick("max_steps") is not None:  # SGLang's server runs until its requests are answered
        raise UsageError("--max-steps applies to --engine builtin only")
    pp, tp = int(pick("pp")), int(pick("tp"))
    faults = _faults(scenario_faults, flags, pp, tp)
    given = {k: v for k, v in {**sopts, **flags}.items() if v is not None}
    refuse_no_effect(given, faults, pick("hicache_storage_backend") != "none")
    return build_sglang_config(flags, sopts, faults, pick)


def build_run_config(flags: dict[str, Any]) -> RunConfig:
    """Validate everything (raising UsageError) before any process starts."""
    scenario_faults, sopts = _scenario(flags.get("scenario"))
    pick = lambda name: _pick(flags, sopts, name)  # noqa: E731
    device = pick("device")
    if device == "cuda":
        _check_cuda()
    sa = ServerArgs(
        pp_size=pick("pp"),
        tp_size=pick("tp"),
        pp_async_batch_depth=pick("async_depth"),
        page_size=pick("page_size"),
        max_total_tokens=pick("max_total_tokens"),
        hicache_size=parse_size(pick("hicache_size")),
        hicache_ratio=float(pick("hicache_ratio")),
        hicache_write_policy=pick("hicache_write_policy"),
        hicache_storage_backend=pick("hicache_storage_backend"),
        hicache_storage_dir=pick("hicache_storage_dir"),
        hicache_storage_prefetch_policy=pick("hicache_storage_prefetch_policy"),
        device=device,
    )
    not_empty("--hicache-storage-dir", sa.hicache_storage_dir)
    if sa.hicache_storage_backend == "none" and sa.hicache_storage_dir:
        raise UsageError(
            "--hicache-storage-dir does nothing without --hicache-storage-backend file"
        )
    if sa.hicache_storage_backend != "none" and sa.hicache_storage_dir:
        output_dir("--hicache-storage-dir", sa.hicache_storage_dir)  # no torch import to refuse
        from hicache_diag.runtime.mem_cache.hicache_storage import check_storage_dir

        check_storage_dir(sa.hicache_storage_dir)  # exit 2 before any rank starts
    seed = int(pick("seed"))
    check_seed(seed)
    workload = WorkloadConfig(pick("workload"), pick("requests"), pick("max_new_tokens"), seed)
    from hicache_diag.harness.workload import check_fits

    check_fits(workload, sa)
    given = {k: v for k, v in {**sopts, **flags}.items() if v is not None}
    # A scenario's `fix` list refines the scenario's own preset (e.g. legacy + ack-count=leader
    # replays the state between #27285 and #31425); `--protocol` on the command line replaces
    # that historical state whole, so it drops the list. `--fix` flags always apply last.
    scenario_fixes = [] if flags.get("protocol") is not None else list(sopts.get("fix") or [])
    fixes = scenario_fixes + list(flags.get("fix") or [])
    protocol = build_protocol(pick("protocol"), fixes)
    faults = _faults(scenario_faults, flags, sa.pp_size, sa.tp_size)
    refuse_no_effect(given, faults, sa.hicache_storage_backend != "none", protocol.lru_clock,
                     engine="builtin")
    hang_timeout = float(pick("hang_timeout"))
    check_seconds("--hang-timeout", hang_timeout)
    max_steps = pick("max_steps")
    if max_steps is not None:
        check_int("--max-steps", int(max_steps), 1)
    from hicache_diag.harness.rundir import check_writable

    check_writable(flags.get("out"))
    cfg = RunConfig(sa, protocol, workload, faults, seed, flags.get("out"), hang_timeout,
                    max_steps)  # fmt: skip
    check_builtin_run(cfg)  # pools, workload and records against this host's memory and disk
    return cfg


# \b keeps click from rewrapping the block.
EXAMPLES = """\b
Examples:
  hicache-diag run              # demo: prefix reuse, eviction, host load-back
  hicache-diag run --scenario samples/scenarios/form_a.toml  # form A: exit 10
  hicache-diag run --fault 'rank-stall:rank=1,ms=8000,after=15,until=15'
                                # a stalled rank: hang naming rank 1, exit 12

Exit: 0 ok, 10/11/12 form A/B/C, 13 diverged, 14 wrong output, 15 leak,
16 other crash, 3 undecided (also: step budget exhausted), 4 --check mismatch,
130 interrupted, 2 bad input, 1 internal error."""


def _catalogue() -> str:
    """Fault names and --fix switches with their modes (legacy first), from the registries,
    so the help can never drift from what the parser accepts (docs/faults.md has the table)."""
    from hicache_diag.faults import FAULTS
    from hicache_diag.runtime.protocol import SWITCHES

    lines = ["\b", "Faults (--fault NAME[:key=value,...]; keys in docs/faults.md):"]
    lines += textwrap.wrap(", ".join(sorted(FAULTS)), 76, initial_indent="  ",
                           subsequent_indent="  ", break_on_hyphens=False)  # fmt: skip
    lines.append("Switches (--fix NAME=MODE; legacy mode first, then the fix):")
    for sw in SWITCHES.values():
        lines.append(f"  {sw.name}={'|'.join(sw.modes)}  {sw.upstream}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("run", epilog=f"{EXAMPLES}\n\n{_catalogue()}",
                 short_help="Run a PP + HiCache runtime, give a verdict.")  # fmt: skip
    def run(
        fault: o.FaultOpt = None,
        fix: o.FixOpt = None,
        protocol: o.ProtocolOpt = None,
        scenario: o.ScenarioOpt = None,
        seed: o.SeedOpt = None,
        out: o.OutOpt = None,
        json_: o.JsonOpt = False,
        pp: o.PpOpt = None,
        tp: o.TpOpt = None,
        async_depth: o.AsyncDepthOpt = None,
        page_size: o.PageSizeOpt = None,
        max_total_tokens: o.MaxTotalTokensOpt = None,
        hicache_size: o.HicacheSizeOpt = None,
        hicache_ratio: o.HicacheRatioOpt = None,
        hicache_write_policy: o.WritePolicyOpt = None,
        hicache_storage_backend: o.StorageBackendOpt = None,
        hicache_storage_dir: o.StorageDirOpt = None,
        hicache_storage_prefetch_policy: o.PrefetchPolicyOpt = None,
        workload: o.WorkloadOpt = None,
        requests: o.RequestsOpt = None,
        max_new_tokens: o.MaxNewTokensOpt = None,
        hang_timeout: o.HangTimeoutOpt = None,
        max_steps: o.MaxStepsOpt = None,
        device: o.DeviceOpt = None,
        engine: o.EngineOpt = None,
        model: o.ModelOpt = None,
        sglang_arg: o.SglangArgOpt = None,
        sglang_python: o.SglangPythonOpt = None,
        check: o.CheckOpt = False,
    ) -> None:
        """Run a real PP + HiCache runtime, inject faults, record evidence, give a verdict."""
        flags = dict(locals())
        expect = _expectation(scenario) if check else None
        # With --engine sglang the checks probe the release and may build the model: seconds.
        with PhaseStatus(err_console, quiet=json_, first="checking the run"):
            cfg = build_engine_config(flags)
        raise typer.Exit(_run_and_render(cfg, json_, expect))


def _run_and_render(cfg: RunConfig, json_: bool, expect: Any = None) -> int:
    """One trial with the live view on stderr; the verdict as JSON (stdout) or a panel."""
    if isinstance(cfg, RunConfig):
        from hicache_diag.harness.trial import run_trial
    else:
        from hicache_diag.sglang.trial import run_sglang_trial as run_trial

    try:
        with LiveProgress(err_console, cfg.world_size, quiet=json_) as progress:
            progress.update({"phase": "starting", "elapsed_s": 0.0})  # from the first second
            argv = ["hicache-diag", *sys.argv[1:]]
            result = run_trial(cfg, argv, on_progress=progress.update)
    except KeyboardInterrupt:
        # A second Ctrl-C during classification: the ranks are reaped, the verdict not written.
        sys.stderr.write("hicache-diag: interrupted; every rank was reaped\n")
        return 130
    if result.verdict.outcome is Outcome.INTERRUPTED:
        sys.stderr.write(
            f"hicache-diag: interrupted; every rank was reaped, {result.run_dir}/verdict.json "
            "written\n"
        )
    if json_:
        print_json(result.verdict.to_json())
    else:
        render_verdict(err_console, result.verdict)
    if expect is None:
        return int(result.verdict.exit_code)
    # --check: the scenario is a regression test; its exit status is the match, not the form.
    mismatches = expect.mismatches(result.verdict)
    render_check(err_console, expect.describe(), mismatches)
    return int(ExitCode.CHECK_MISMATCH if mismatches else ExitCode.OK)
