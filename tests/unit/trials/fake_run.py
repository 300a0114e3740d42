"""A stand-in for the trial function (engines.run_trial), called by bisect's real trial processes
(trials/bisect_child.py) with a cell's config: a deterministic outcome driven by the trial's
`run` line, written as a real verdict.json, so bisect's matrix, statistics, timeouts and Ctrl-C
are tested without the runtime. The trial processes import it by name (`use_fake` puts the
repository on their PYTHONPATH)."""

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

from hicache_diag.errors import UsageError
from hicache_diag.evidence.verdict import CrashForm, Outcome, Verdict, write_json_atomic
from hicache_diag.trials.signals import sigterm_as_interrupt

ROOT = Path(__file__).parents[3]
FAKE_TRIAL = f"{__name__}:fake_trial"


@dataclass(frozen=True)
class FakeConfig:
    """What bisect asks of an engine config (trials/engine.py `EngineConfig`)."""

    engine: ClassVar[str] = "builtin"
    seed: int = 0
    out: str | None = None
    hang_timeout: float = 5.0
    world_size: int = 2

    def for_trial(self, seed: int, out: str) -> "FakeConfig":
        return replace(self, seed=seed, out=out)


def use_fake(monkeypatch, spawn: bool = True) -> None:
    """Trial processes can import this module; `spawn`: no warm trial server (its torch import
    costs seconds; tests/unit/trials/test_trial_server.py and one runner test use it)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if spawn:
        monkeypatch.setenv("HICACHE_DIAG_TRIAL_START", "spawn")


def fake_cells(cfg):
    """A BisectConfig with one FakeConfig per cell."""
    from hicache_diag.trials.bisect import matrix

    return replace(cfg, cells=tuple(FakeConfig() for _ in matrix(cfg.axes)))


def _options(argv: list[str]) -> tuple[dict, list[str]]:
    opts, fixes = {}, []
    it = iter(argv[2:])  # hicache-diag run ...
    for arg in it:
        if arg == "--switch":
            fixes.append(next(it))
        elif arg in ("--bad", "--sleep", "--json"):
            opts[arg] = True
        elif arg.startswith("--"):
            opts[arg] = next(it)
    return opts, fixes


def fake_trial(cfg, argv: list[str]) -> SimpleNamespace:
    opts, fixes = _options(argv)
    seed, out = cfg.seed, Path(cfg.out)
    # The trial's config carries its own seed and run dir (EngineConfig.for_trial).
    assert (seed, str(out)) == (int(opts["--seed"]), opts["--out"]), (cfg, argv)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pid").write_text(str(os.getpid()))
    if "--bad" in opts:
        raise UsageError("unknown fault 'nope'; valid: dma-delay")
    if "--sleep" in opts:  # as a real trial: SIGTERM reaps (here: leaves a mark), then exits
        with sigterm_as_interrupt():
            try:
                time.sleep(60)
            except KeyboardInterrupt:
                (out / "reaped").write_text("1")
                raise SystemExit(130) from None
    legacy = "ack-count=local" in fixes or opts.get("--protocol") == "legacy"
    fail = legacy and (opts.get("--hicache-size") == "64MiB" or seed % 2 == 0)
    if opts.get("--storage-backend") == "file":
        fail = False
    if "sglang-0.5.18" in opts.get("--sglang-python", ""):  # a release axis: the old one fails
        fail = True
    verdict = Verdict(
        Outcome.CRASH if fail else Outcome.OK,
        CrashForm.A if fail else None,
        seed=seed,
        duration_s=1.0 + seed,
        run_dir=str(out),
    )
    write_json_atomic(out / "verdict.json", verdict.to_json())
    return SimpleNamespace(verdict=verdict)
