"""The builtin engine's defaults and `build(request)`: a RunRequest -> RunConfig, every check
done before any rank starts (bad input raises UsageError: exit 2)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag import evidence as ev
from hicache_diag.errors import UsageError
from hicache_diag.harness.request import RunRequest

if TYPE_CHECKING:
    from hicache_diag.harness.engine import EngineConfig, Failure, Progress, TrialWatch
    from hicache_diag.harness.launcher import RankProcess
    from hicache_diag.harness.trial import TrialResult
    from hicache_diag.runtime.protocol import ProtocolConfig
    from hicache_diag.runtime.server_args import RunConfig, ServerArgs
    from hicache_diag.verdict import Verdict

DEFAULTS: dict[str, Any] = {
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
    "engine": "builtin",
    "max_steps": None,  # auto: server_args.auto_step_budget
}
TRIAL_TIMEOUT_S = 300.0  # a bisect trial: the builtin runtime starts in about a second
SGLANG_ONLY_FLAGS = ("model", "sglang_arg", "sglang_env", "sglang_python",
                     "sglang_consensus_checker")  # fmt: skip
# Scenario keys for the sglang engine only (the first two have no flag of the same name).
SGLANG_SCENARIO_KEYS = ("sglang_python", "sglang_version", "sglang_arg", "sglang_env")


def validated_faults(request: RunRequest, pp: int, tp: int,
                     engine: str = "sglang") -> tuple[str, ...]:  # fmt: skip
    """The request's fault specs, checked against the topology (both engines). On the builtin
    engine a fault whose mechanism it lacks is refused here; SGLang's, per release, at its probe."""
    faults = request.faults
    if not faults:
        return ()
    from hicache_diag.faults import validate_faults

    checked = validate_faults(faults, pp, tp)
    for spec in checked if engine == "builtin" else ():
        why = spec.build().refusal("builtin")
        if why:
            raise UsageError(f"fault {spec.name!r} cannot run on --engine builtin: {why}")
    return tuple(f.to_spec() for f in checked)


def _check_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available on this host")
    # Honest refusal: the tiny model, its KV pool and the PP transport run on CPU/gloo only.
    raise UsageError("--device cuda is not supported yet: this runtime runs on CPU (gloo)")


def _refuse_sglang_only(request: RunRequest) -> None:
    sglang_only = [f for f in SGLANG_ONLY_FLAGS if request.flags.get(f)]
    if sglang_only:
        flag = "--" + sglang_only[0].replace("_", "-")
        raise UsageError(f"{flag} applies to --engine sglang only")
    scenario_only = [k for k in SGLANG_SCENARIO_KEYS if request.scenario.get(k) is not None]
    if scenario_only:
        raise UsageError(
            f'scenario key {scenario_only[0]!r} applies to engine = "sglang" only '
            "(the scenario or --engine says builtin)"
        )


def _server_args(pick: Callable[[str], Any]) -> ServerArgs:
    from hicache_diag.paths import not_empty, output_dir
    from hicache_diag.runtime.server_args import ServerArgs, parse_size

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
    return sa


def _protocol(request: RunRequest, pick: Callable[[str], Any]) -> ProtocolConfig:
    """A scenario's `fix` list refines the scenario's own preset (e.g. legacy + ack-count=leader
    replays the state between #27285 and #31425); `--protocol` on the command line replaces
    that historical state whole, so it drops the list. `--fix` flags always apply last."""
    from hicache_diag.runtime.protocol import build_protocol

    flags = request.flags
    scenario_fixes = [] if flags.get("protocol") is not None else list(
        request.scenario.get("fix") or [])  # fmt: skip
    return build_protocol(pick("protocol"), scenario_fixes + list(flags.get("fix") or []))


def build(request: RunRequest) -> RunConfig:
    """RunRequest -> RunConfig. Validate everything (raising UsageError) before any process
    starts."""
    from hicache_diag.harness.no_effect import refuse_no_effect
    from hicache_diag.harness.rundir import check_writable
    from hicache_diag.harness.workload import check_fits
    from hicache_diag.limits import check_builtin_run, check_int, check_seconds, check_seed
    from hicache_diag.runtime.server_args import RunConfig, WorkloadConfig

    _refuse_sglang_only(request)

    def pick(name: str) -> Any:
        return request.value(name, DEFAULTS)

    sa = _server_args(pick)
    seed = int(pick("seed"))
    check_seed(seed)
    workload = WorkloadConfig(pick("workload"), pick("requests"), pick("max_new_tokens"), seed)
    check_fits(workload, sa)
    protocol = _protocol(request, pick)
    faults = validated_faults(request, sa.pp_size, sa.tp_size, "builtin")
    refuse_no_effect(request.given_all(), faults, sa.hicache_storage_backend != "none",
                     protocol.lru_clock)  # fmt: skip
    hang_timeout = float(pick("hang_timeout"))
    check_seconds("--hang-timeout", hang_timeout)
    max_steps = pick("max_steps")
    if max_steps is not None:
        check_int("--max-steps", int(max_steps), 1)
    check_writable(request.flags.get("out"))
    cfg = RunConfig(sa, protocol, workload, faults, seed, request.flags.get("out"), hang_timeout,
                    max_steps)  # fmt: skip
    check_builtin_run(cfg)  # pools, workload and records against this host's memory and disk
    return cfg

POLL_S = 0.1
CASCADE_GRACE_S = 1.0  # survivors of a crash get this long to log their own error


class BuiltinEngine:
    """Our runtime beneath the one trial loop (harness/engine.py `Engine`): forked or spawned
    ranks (harness/launcher.py) that run their own workload; the no-cache reference is computed
    here while they run."""

    poll_s = POLL_S
    busy = None  # every step line is progress
    faulthandler = True  # rank_main installs it on SIGUSR1
    line_clock = False
    started_at = 0.0  # set at start()

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.started_at = time.time()
        self.launcher: Any = None  # harness.launcher.Launcher, made by prepare()
        self.run_dir: Path | None = None

    def prepare(self, run_dir: Path) -> None:
        from hicache_diag.harness.launcher import Launcher

        self.run_dir = run_dir
        self.launcher = Launcher(run_dir, self.cfg.server_args)

    def manifest(self, argv: list[str]) -> dict[str, Any]:
        import torch

        from hicache_diag.harness.rundir import manifest_fields

        return manifest_fields(self.cfg, argv, torch.__version__)

    def start(self) -> None:
        self.started_at = time.time()
        self.launcher.start()

    def wait_ready(self, watch: TrialWatch, on_progress: Progress | None) -> None:
        """A rank is ready when it forks; start-up is watched by the hang watch's grace."""

    def drive(self) -> None:
        """The ranks run their own workload; the reference is computed meanwhile."""
        from hicache_diag.harness.reference import compute_reference
        from hicache_diag.harness.rundir import write_json
        from hicache_diag.harness.workload import Workload

        workload = Workload(self.cfg.workload, self.cfg.server_args)
        reference = compute_reference(self.cfg.server_args.model, workload.requests)
        write_json(self.run_dir / "reference.json", reference)

    def running(self) -> bool:
        return bool(self.launcher.alive())

    def poll(self, now: float) -> list[Failure]:
        from hicache_diag.harness.engine import Failure

        return [
            Failure(ev.FirstFailure(p.rank, p.ended_at, p.pid, p.exitcode, p.signal).to_json(),
                    CASCADE_GRACE_S)
            for p in self.launcher.poll() if p.state == "crashed"
        ]  # fmt: skip

    def ranks(self) -> list[RankProcess]:
        return list(self.launcher.procs) if self.launcher is not None else []

    def live(self) -> list[RankProcess]:
        return self.launcher.alive()

    def alive(self) -> list[RankProcess]:
        return self.launcher.alive()

    def activity(self) -> float:
        return 0.0

    def startup_grace(self, hang_timeout: float) -> float:
        from hicache_diag.harness.hang_watch import startup_grace

        return startup_grace(hang_timeout)

    def stop(self, state: str) -> None:
        self.launcher.kill_all(state)

    def drained(self, watch: TrialWatch) -> None:
        """Every rank exited on its own."""

    def close(self, watch: TrialWatch) -> None:
        if self.launcher is not None:
            self.launcher.close()

    def finish_evidence(self, watch: TrialWatch) -> None:
        """The ranks wrote their own evidence as they ran."""

    def launcher_extra(self) -> dict[str, Any]:
        return {}

    def amend(self, verdict: Verdict, watch: TrialWatch) -> Verdict:
        return verdict


def run_builtin_trial(cfg: EngineConfig, argv: list[str] | None = None,
                      on_progress: Progress | None = None) -> TrialResult:  # fmt: skip
    """The builtin engine's trial: the one trial loop over a BuiltinEngine."""
    from hicache_diag.harness.trial import run_engine_trial

    return run_engine_trial(BuiltinEngine(cfg), cfg, argv, on_progress)
