"""The sglang engine beneath the one trial loop (trials/trial.py; docs/design.md §8).

`SglangEngine`: plugin config -> launch -> ready -> workload over HTTP while the loop watches
the schedulers (a scheduler that dies is the first failure: the survivors get a grace to log
their cascade; no busy step and no completed request for `hang_timeout` with requests
outstanding is a hang: py-spy dumps every scheduler) -> reap the whole tree -> per-rank logs
from SGLang's log prefixes -> the process facts SGLang's log adds -> reference.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.client import WorkloadClient
from hicache_diag.engines.sglang.config import REQUEST_TIMEOUT_S, SglangRunConfig
from hicache_diag.engines.sglang.nodes import make_server, placement_evidence
from hicache_diag.engines.sglang.options import SglangOptions
from hicache_diag.engines.sglang.plugin.config import PluginConfig
from hicache_diag.engines.sglang.server import SchedulerProc, SglangServer
from hicache_diag.engines.sglang.sessions import SESSION_WORKLOADS, make_client
from hicache_diag.engines.sglang.trial_evidence import finish_evidence, split_rank_logs
from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import Outcome, Verdict
from hicache_diag.options.workloads import Workload
from hicache_diag.trials.engine import Engine, Failure, Progress, TrialWatch
from hicache_diag.trials.rundir import manifest_head, write_json
from hicache_diag.trials.trial import TrialResult, run_engine_trial

POLL_S = 0.2
CASCADE_GRACE_S = 3.0  # SGLang's survivors log `Connection closed by peer` within a second or two

_Watch = TrialWatch  # the loop's record (trials/trial.py)


def run_sglang_trial(
    cfg: SglangRunConfig, argv: list[str] | None = None, on_progress: Progress | None = None
) -> TrialResult:
    """One `--engine sglang` trial through the one trial loop."""
    return run_engine_trial(SglangEngine(cfg, on_progress), cfg, argv, on_progress)


def _busy(line: dict[str, Any]) -> bool:
    """The plugin writes a line for idle scheduler turns too; only the others are progress."""
    return not line.get("idle")


class SglangEngine(Engine):
    """Real SGLang beneath the one trial loop (trials/engine.py `Engine`): launch_server with
    our plugin, ready at /health_generate, the workload over HTTP; the schedulers are the ranks
    (found by process title), and a run ends when every request is answered. No step and no
    answered request for the hang timeout with requests outstanding is a hang (the server is
    already serving, so start-up gets no more grace than that)."""

    poll_s = POLL_S
    busy = staticmethod(_busy)
    faulthandler = False  # SGLang's schedulers have no SIGUSR1 faulthandler
    line_clock = True
    started_at = 0.0  # set at start()
    tie_tolerance = SglangOptions.tie_tolerance

    def __init__(
        self, cfg: SglangRunConfig, on_progress: Progress | None = None, warm: Any = None
    ) -> None:
        self.cfg = cfg
        self.given = cfg  # as the trial was given: the warm pool's launch key (its L3 dir unset)
        self.warm = warm  # sglang/warm.py WarmSglang: the server may outlive this trial
        self.warm_record: ev.WarmServerRecord | None = None
        self._log_offset = 0
        self.on_progress = on_progress
        self.started_at = time.time()
        self.server: SglangServer | None = None
        self.client: WorkloadClient | None = None
        self.run_dir: Path | None = None
        self.plugin_path: Path | None = None
        self.requests: list[Any] = []
        self._stopped = False
        self._lost = False
        self._t_work = 0.0

    def prepare(self, run_dir: Path) -> None:
        cfg = self.cfg
        if (
            cfg.hosts and cfg.placement is None
        ):  # `run` places them (engines/sglang/remote_nodes.py)
            raise UsageError(
                "--hosts: only `run` places nodes on hosts; for trials across hosts use "
                "bisect --via ssh --hosts"
            )
        warm, control = self.warm, None
        if warm is not None:
            self.warm_record = warm.boundary(cfg, run_dir)  # reuse, or stop a dirty server
            warm.note_trial(run_dir)
            control = str(warm.control_dir)
        if cfg.spec.hicache_storage_backend and not cfg.spec.hicache_storage_dir:
            # SGLang's default (/tmp/hicache) would mix unrelated runs: the trial's own dir, or
            # on a warm server the pool's, emptied at every boundary (sglang/warm.py).
            l3 = (warm.l3_dir(cfg) if warm is not None else None) or run_dir / "l3"
            # Made here: each stage's TP rank 0 creates a missing dir with a bare os.makedirs
            # (hicache_storage.py HiCacheFile.__init__, 0.5.18-0.5.23), so PP>1 races to
            # FileExistsError at start-up.
            l3.mkdir(parents=True, exist_ok=True)
            cfg = self.cfg = replace(cfg, spec=replace(cfg.spec, hicache_storage_dir=str(l3)))
        from hicache_diag.engines.sglang.release import SglangInstall

        install = SglangInstall(
            cfg.python,
            cfg.sglang_version,
            Path(cfg.package_dir or "."),
            None,
            cfg.cpu_kernel_names,
            launch=cfg.launch_facts,
        )
        self.run_dir = run_dir
        if self.reused:
            self.server = warm.server
        else:
            log = warm.log_path if warm is not None else None
            self.server = make_server(install, cfg.spec, run_dir, log, cfg.placement)
        self.plugin_path = run_dir / ev.PLUGIN
        kernels = cfg.cpu_kernel_names
        plugin = PluginConfig(str(run_dir), cfg.seed, cfg.faults, cfg.spec.cpu, kernels)
        replace(plugin, control_dir=control).write(str(self.plugin_path))
        # A scripted workload's client appends its turns to this list as they are sent.
        scripted = cfg.workload.workload in SESSION_WORKLOADS
        self.requests = [] if scripted else Workload(cfg.workload, cfg.workload_pool()).requests

    def manifest(self, argv: list[str]) -> dict[str, Any]:
        cfg = self.cfg
        launch = cfg.spec.argv(cfg.python, self.server.port)
        return {
            **manifest_head(argv),
            "engine": "sglang",
            "device": cfg.device_name,
            "sglang": {
                **cfg.release,
                **({"cuda": cfg.cuda_facts} if cfg.cuda_facts else {}),
                "version": cfg.sglang_version,
                "python": cfg.python,
                "argv": launch,
                "launch_facts": cfg.launch_facts.to_json(),
                **({"nodes": self.server.launch_lines()} if cfg.spec.nnodes > 1 else {}),
            },
            "notes": list(cfg.notes),
            "seed": cfg.seed,
            "config": {
                "spec": {
                    k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg.spec).items()
                },
                "workload": asdict(cfg.workload),
                "hang_timeout": cfg.hang_timeout,
                # The model's own config, so an export rebuilds it on another machine.
                "model_config": _model_config(cfg.spec.model),
            },
            # SGLang's protocol is whatever its release contains (docs/design.md §8).
            "protocol": None,
            "faults": list(cfg.faults),
            "topology": cfg.topology(),
            **({"warm_server": self.warm_record.to_json()} if self.warm_record else {}),
        }

    @property
    def reused(self) -> bool:
        return self.warm_record is not None and self.warm_record.reused

    def start(self) -> None:
        if self.warm is not None:
            self._log_offset = _size(self.warm.log_path)  # this trial's slice starts here
        if self.reused:
            self.started_at = time.time()
            for s in self.server.schedulers:
                s.state = "running"  # the previous trial marked them finished
            return
        self.server.start(self.plugin_path)
        self.started_at = self.server.started_at
        if self.warm is not None:
            self.warm.adopt(self.server, self.given)

    def wait_ready(self, watch: TrialWatch, on_progress: Progress | None) -> None:
        """Raises ServerStartError (an EngineStartError) if SGLang never serves."""
        if self.reused:  # the boundary was this trial's start-up
            watch.timings["startup_s"] = self.warm_record.boundary_s or 0.0
            return
        on_phase = _phase_reporter(self.server, self.cfg, on_progress)
        watch.timings["startup_s"] = round(self.server.wait_ready(on_phase=on_phase), 3)
        if self.warm is not None:
            t0 = time.time()
            self.warm.take_fresh_proof(self.run_dir)
            watch.timings["fresh_proof_s"] = round(time.time() - t0, 3)

    def drive(self) -> None:
        self.client = make_client(self.cfg, self.server.url, self.requests, REQUEST_TIMEOUT_S)
        self._t_work = time.time()
        self.client.start()

    def running(self) -> bool:
        return bool(self.client.outstanding) and not self._stopped

    def poll(self, now: float) -> list[Failure]:
        """Every scheduler that ended (SGLang's schedulers never end on their own while
        serving), then the server itself gone with no scheduler to blame."""
        server = self.server
        failures = [
            Failure(
                ev.FirstFailure(s.rank, s.ended_at, s.pid, s.exitcode, s.signal), CASCADE_GRACE_S
            )
            for s in server.poll()
        ]
        if not self._lost and not server.alive():
            self._lost = True
            lost = ev.FirstFailure(None, now, server.popen.pid)  # no scheduler to blame
            failures.append(Failure(lost, 0.0))
        return failures

    def ranks(self) -> list[SchedulerProc]:
        return self.server.schedulers if self.server is not None else []

    def live(self) -> list[SchedulerProc]:
        # server.poll() marks a SIGSTOPped scheduler "stopped": it is live, and watched.
        return [s for s in self.ranks() if s.state in ("running", "stopped")]

    def alive(self) -> list[SchedulerProc]:
        """The schedulers py-spy can dump (a stopped one cannot be suspended)."""
        return [s for s in self.ranks() if s.state == "running"]

    def activity(self) -> float:
        return self.client.result.completed_at if self.client is not None else 0.0

    def kernel_states(self) -> dict[int, str]:
        if self.server.remote:  # its nodes' own facts: our /proc does not hold their pids
            return self.server.kernel_states(self.live())
        return super().kernel_states()

    def dump_stacks(self, run_dir: Path, skip: set[int]) -> ev.StacksRecord | None:
        if self.server.remote:  # the collector on each node, as `triage --live --via ssh`
            return self.server.dump_stacks(run_dir, [s for s in self.alive() if s.rank not in skip])
        return None  # py-spy here (the trial loop's)

    def startup_grace(self, hang_timeout: float) -> float:
        return hang_timeout  # SGLang already serves: its own readiness request has run

    def stop(self, state: str) -> None:
        """The schedulers are reaped by `close` (SGLang's tree is killed whole)."""
        self._stopped = True

    def drained(self, watch: TrialWatch) -> None:
        if self.client is None or not self.client.result.done:
            return
        for s in self.server.schedulers:
            if s.state == "running":
                s.state = "finished"  # alive and stepping when the workload was done
        done = len(self.client.result.outputs)
        watch.timings["workload_s"] = round(time.time() - self._t_work, 3)
        watch.timings["per_request_s"] = round(watch.timings["workload_s"] / max(1, done), 4)

    def close(self, watch: TrialWatch) -> None:
        if self.client is not None:
            self.client.stop()
        if self.server is None:
            return
        self.server.poll()
        warm = self.warm
        if warm is not None and warm.server is self.server:
            done = self.client is not None and self.client.result.done
            if warm.release(self.cfg, watch, done):
                watch.timings["shutdown_s"] = 0.0  # kept warm for the next trial
                return
            t0 = time.time()
            warm.stop()
            watch.timings["shutdown_s"] = round(time.time() - t0, 3)
            return
        watch.timings["shutdown_s"] = round(self.server.close(), 3)

    def finish_evidence(self, watch: TrialWatch) -> None:
        if self.server is None:
            return
        if self.warm is not None:
            self.warm.log_slice(self.run_dir, self._log_offset)
        finish_evidence(self.run_dir, self.server, self.client, watch)
        # Only requests that completed can be compared; a crash or hang leaves the rest
        # unanswered.
        done = set(self.client.result.outputs) if self.client is not None else set()
        write_json(
            self.run_dir / ev.REFERENCE,
            _reference(self.cfg, [r for r in self.requests if r.rid in done], self.warm),
        )

    def launcher_extra(self) -> dict[str, Any]:
        remote = self.server.launcher_extra() if self.server and self.server.remote else {}
        return {"engine": "sglang", **remote}

    def amend(self, verdict: Verdict, watch: TrialWatch) -> Verdict:
        if watch.startup_error and not _any_step_recorded(self.run_dir, self.cfg.world_size):
            verdict = _environment_failure(verdict, watch.startup_error)
        elif watch.startup_error:  # the schedulers were serving (SGLang's readiness request)
            verdict.evidence.append(f"it ended before SGLang reported ready: {watch.startup_error}")
        verdict.evidence += [f"launch adapted: {note}" for note in self.cfg.notes]
        verdict.evidence += [f"relaunched: {why}" for why in self.server.relaunches]
        verdict.evidence += placement_evidence(self.server, self.cfg.placement)
        lost = getattr(self.server, "lost", None)
        return _lost_node(verdict, lost) if lost else verdict


def _phase_reporter(server: SglangServer, cfg: SglangRunConfig, on_progress: Progress | None):
    """Start-up phases as progress snapshots (the CLI shows them as one status line)."""
    if on_progress is None:
        return None

    def report(phase: str) -> None:
        on_progress(
            {
                "phase": f"SGLang {cfg.sglang_version}: {phase}",
                "elapsed_s": time.time() - server.started_at,
                "log": str(server.log_path),
            }
        )

    return report


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _model_config(model: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None


def _any_step_recorded(run_dir: Path, world_size: int) -> bool:
    """Whether a scheduler loop ran: a failure after that is the run's (0.5.13's form B can
    come while SGLang serves its own readiness request), before it the environment's."""
    for rank in range(world_size):
        try:
            if ev.rank_jsonl(run_dir, rank).stat().st_size > 0:
                return True
        except OSError:
            continue
    return False


def _environment_failure(verdict: Verdict, error: str) -> Verdict:
    """A server that never became ready failed as an environment (a settings assert, a missing
    driver, a bad flag): `undecided`, with the cause, and never a form or a rank to blame. The
    cause is the exception the classifier read from the first scheduler that raised (the rule
    book's traceback parser), else the launcher's own last error line."""
    cause = verdict.signature if verdict.outcome is Outcome.CRASH and verdict.signature else error
    said = f"SGLang never became ready (the environment failed, not a rank): {cause}"
    return _undecided(verdict, f"SGLang never became ready: {cause}", [said, f"launcher: {error}"])


def _lost_node(verdict: Verdict, lost: dict[str, str]) -> Verdict:
    """A node whose ssh link ended mid-run: the environment's failure (`undecided`), the node
    named, its ranks (and the cascade on the others) never blamed."""
    said = "; ".join(f"{node}: {why}" for node, why in lost.items())
    line = (
        f"lost {said}: the run ended with it (the environment failed, not a rank); its "
        "ranks are not judged, never blamed"
    )
    signature = f"a node's ssh link ended mid-run ({said})"
    return _undecided(verdict, signature, [line, *verdict.evidence])


def _undecided(verdict: Verdict, signature: str, evidence: list[str]) -> Verdict:
    """The environment's failure: no form, no failed or culprit rank, no divergence judged."""
    return replace(
        verdict,
        outcome=Outcome.UNDECIDED,
        form=None,
        failed_rank=None,
        culprit_rank=None,
        first_divergence=None,
        signature=signature,
        evidence=evidence,
    )


def _reference(cfg: SglangRunConfig, requests: list[Any], warm: Any = None) -> dict[str, Any]:
    from hicache_diag.engines.sglang.reference import compute_reference

    worker = warm.reference if warm is not None else None
    return compute_reference(cfg.python, cfg.spec.model, requests, worker)


__all__ = ["SglangEngine", "run_sglang_trial", "split_rank_logs"]
