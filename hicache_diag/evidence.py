"""The run directory's layout (docs/evidence.md), spelled once: every file name a trial writes
and analysis reads. Bottom floor: it imports nothing of ours, so the SGLang plugin may use it."""

from __future__ import annotations

import platform
import socket
import sys
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

EVIDENCE_VERSION = 1

MANIFEST = "manifest.json"  # written first
LAUNCHER = "launcher.json"  # how each rank process ended, written after reaping
OUTPUTS = "outputs.json"
REFERENCE = "reference.json"
REQUESTS = "requests.json"  # the sglang engine's client
BUDGET = "budget.json"  # PP0 stopped on the step budget with work left
SERVER_LOG = "server.log"  # the sglang engine: SGLang's whole output
PLUGIN = "plugin.json"  # the sglang engine: what the plugin was told
VERDICT = "verdict.json"  # written last, atomically
STACKS = "stacks"


def rank_jsonl(run_dir: Path, rank: int) -> Path:
    """One line per scheduler step, flushed per line."""
    return run_dir / f"rank{rank}.jsonl"


def rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.log"


def stack_json(run_dir: Path, rank: int) -> Path:
    """py-spy dump --json of a rank, taken on a hang."""
    return run_dir / STACKS / f"rank{rank}.json"


def stack_txt(run_dir: Path, rank: int) -> Path:
    """The rank's own faulthandler dump (SIGUSR1), when py-spy could not dump it."""
    return run_dir / STACKS / f"rank{rank}.txt"


# `must_agree` (docs/evidence.md): what every rank must hold identically at the same step, one
# list for both engines' recorders. The batch decision first (a crash record's `must_agree`).
BATCH_KEYS = ("rids", "extend_num_tokens", "prefix_len", "host_hit_len")
MUST_AGREE = (*BATCH_KEYS, "acks_consumed", "evicted", "load_backs", "write_backs",
              "device_free", "tree_digest")  # fmt: skip
# Alike only where the protocol aligns them: the builtin engine adds the host pool's under
# `host-capacity=min` and the L3 hits with storage on. In real SGLang these and the pp_sync
# counts were equal on every busy step of every real run held here (0.5.12.post1-0.5.23, PP2
# and TP2, L2 and L3) until a fault fired, so its recorder adds every one it records.
MUST_AGREE_HOST = ("host_free", "host_capacity")
MUST_AGREE_L3 = ("l3_hit_len",)
MUST_AGREE_SGLANG = ("host_loaded_len", "l3_hit_len", "sync_received", "host_free")

# Every entry of the layout, as docs/evidence.md's tree names it (a test holds them together).
LAYOUT = (MANIFEST, "rank{r}.jsonl", "rank{r}.log", LAUNCHER, "stacks/rank{r}.json",
          "stacks/rank{r}.txt", OUTPUTS, REFERENCE, BUDGET, VERDICT)  # fmt: skip
SGLANG_LAYOUT = (SERVER_LOG, PLUGIN, REQUESTS)


# The records the trial loop writes into manifest.json and launcher.json (docs/evidence.md), one
# type each, every engine through the same writer; readers may keep reading the plain dicts
# (`from_json` takes what older runs wrote: unknown keys are ignored, absent ones default).


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _Record:
    """`to_json` writes every field (a key is never dropped); `from_json` keeps the known ones."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: dict[str, Any] | None):  # noqa: ANN206 - the subclass
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass(frozen=True, slots=True)
class ManifestHead(_Record):
    """The manifest fields every engine's run dir has; each engine adds its own after them."""

    tool: str = "hicache-diag"
    version: str = ""
    evidence_version: int = EVIDENCE_VERSION
    python: str = ""
    host: str = ""
    argv: list[str] = field(default_factory=list)
    started_at: str = ""

    @classmethod
    def now(cls, argv: list[str] | None, version: str) -> ManifestHead:
        return cls(version=version, python=platform.python_version(), host=socket.gethostname(),
                   argv=list(argv) if argv else list(sys.argv), started_at=utc_now())  # fmt: skip


@dataclass(frozen=True, slots=True)
class FirstFailure(_Record):
    """launcher.json `first_failure`: the first rank to end badly as the loop saw it (`rank`
    None: the engine's own server died with no rank to blame)."""

    rank: int | None = None
    t: float | None = None
    pid: int | None = None
    exitcode: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class HangRecord(_Record):
    """launcher.json `hang` (and `interrupt_stall`: the same facts when a Ctrl-C found every rank
    without a step for a while). Keys a detector does not know are written as null."""

    stalled_ranks: list[int] = field(default_factory=list)
    last_progress: dict[str, float] = field(default_factory=dict)  # rank -> last progress, epoch s
    proc_status: dict[str, str] = field(default_factory=dict)  # rank -> psutil status then
    stopped_ranks: list[int] = field(default_factory=list)
    last_steps: dict[str, Any] | None = None  # rank -> {step, t}
    detected_at: float | None = None
    during_startup: bool | None = None
    idle_s: dict[str, float] | None = None  # interrupt_stall: seconds each rank had not stepped
    detected_by: str | None = None  # "sglang-watchdog" when SGLang's own watchdog fired
    observed_by: int | None = None  # the rank whose watchdog fired
    watchdog_line: str | None = None


@dataclass(frozen=True, slots=True)
class StacksRecord(_Record):
    """launcher.json `stacks`: how the stacks were taken, and why py-spy was not enough."""

    tool: str | None = None  # "py-spy" | "faulthandler" | "py-spy (SGLang's watchdog)" | None
    error: str | None = None


@dataclass(slots=True)
class LauncherRecord(_Record):
    """launcher.json: how each rank process ended and what the trial loop saw (one writer for
    every engine: harness/trial.py `write_launcher_json`)."""

    ranks: list[dict[str, Any]] = field(default_factory=list)  # each engine's process records
    first_failure: dict[str, Any] | None = None  # FirstFailure
    hang: dict[str, Any] | None = None  # HangRecord
    stacks: dict[str, Any] = field(default_factory=lambda: StacksRecord().to_json())
    interrupted: bool = False
    interrupted_at: float | None = None
    interrupt_stall: dict[str, Any] | None = None  # HangRecord
    startup_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    oom_kills: int | None = None
    startup: dict[str, Any] = field(default_factory=dict)  # {grace_s, first_step_s}
    last_steps: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
    # An engine adds its own keys beside these (`Engine.launcher_extra`: `engine: "sglang"`).
