"""Upper bounds on every size a command takes, from what the work needs and what the machine has.

The one owner of "does this fit": run (either engine), bisect, triage and timeline call these
before anything starts. A refusal is a UsageError (exit 2) that names the largest value that
fits, so a user can retype it instead of watching memory grow or a disk fill.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hicache_diag.errors import UsageError

# Slots beyond the running-request cap (ServerArgs.max_running_requests, 8; SGLang's engine is
# held to the same documented range) never all hold a batch.
ASYNC_DEPTH_MAX = 8
MAX_SECONDS = 86_400.0  # any interval or timeout: one day; past that it is a typo, not a wait
RECORD_BYTES_PER_STEP = 1536  # one rank{r}.jsonl line (measured ~1.2 KiB at the defaults)
RUN_DIR_BYTES = 2 * 1024**2  # a finished builtin run dir with its logs (measured 0.3-5 MiB)
RANK_PROCESS_BYTES = 200 * 1024**2  # a forked rank's own pages beyond the pools (torch, gloo)
POOL_OVERHEAD_BYTES_PER_TOKEN = 24  # the allocator's free list and the tree's index per slot
REQUEST_BYTES = 1024  # one request held by the workload, the reference and outputs, per copy
SEED_MAX = 2**32 - 1  # seeds reach torch generators and SGLang's --random-seed (32-bit there)
MEMORY_SHARE = 0.8  # of what the machine has available; the rest stays for everything else


@dataclass(frozen=True, slots=True)
class Machine:
    """What this host has, read once per check (psutil + the file system)."""

    memory_available: int
    cpus: int

    @staticmethod
    def here() -> Machine:
        import psutil

        return Machine(psutil.virtual_memory().available, os.cpu_count() or 1)

    @property
    def memory_budget(self) -> int:
        return int(self.memory_available * MEMORY_SHARE)


def disk_free(path: str | Path | None) -> int:
    """Free bytes on the file system that `path` (or its nearest existing parent) lives on."""
    probe = Path(path or ".").absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


def check_int(flag: str, value: int, lo: int, hi: int | None = None, why: str = "") -> None:
    """lo <= value <= hi, else one line naming the valid range."""
    if value < lo or (hi is not None and value > hi):
        span = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        reason = f" ({why})" if why else ""
        raise UsageError(f"{flag} must be {span} (got {value}){reason}")


def check_seconds(flag: str, value: float, allow_zero: bool = False) -> None:
    """A finite number of seconds, > 0 (or >= 0), at most a day."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_SECONDS):
        low = ">= 0" if allow_zero else "> 0"
        raise UsageError(
            f"{flag} must be a finite number of seconds {low} and <= {MAX_SECONDS:.0f} "
            f"(one day) (got {value})"
        )


def check_seed(seed: int, flag: str = "--seed") -> None:
    check_int(flag, seed, 0, SEED_MAX)


def check_async_depth(depth: int, running: int = ASYNC_DEPTH_MAX) -> None:
    """`running`: the engine's running-request cap; a slot holds at least one request."""
    why = f"micro-batch slots beyond the {running} running requests never all hold a batch"
    check_int("--async-depth", depth, 0, running, why)


def check_pools(
    per_rank_token_bytes: list[int],
    device_tokens: int,
    host_tokens: list[int],
    machine: Machine | None = None,
) -> None:
    """Device + host KV pools of every rank (all on this host) against the memory budget.
    `per_rank_token_bytes[r]`: KV bytes per token on rank r; `host_tokens[r]` its host pool."""
    machine = machine or Machine.here()
    fixed = len(per_rank_token_bytes) * RANK_PROCESS_BYTES
    per_device_token = sum(b + POOL_OVERHEAD_BYTES_PER_TOKEN for b in per_rank_token_bytes)
    host = sum(
        t * (b + POOL_OVERHEAD_BYTES_PER_TOKEN)
        for t, b in zip(host_tokens, per_rank_token_bytes, strict=True)
    )
    need = fixed + device_tokens * per_device_token + host
    if need <= machine.memory_budget:
        return
    # The host pool scales with the device pool (ratio) or is fixed (size): solve for the device.
    ratio = sum(host_tokens) / max(1, device_tokens * len(host_tokens))
    spare = machine.memory_budget - fixed
    per_token = per_device_token * (1 + ratio)
    largest = max(0, int(spare / per_token)) if spare > 0 else 0
    raise UsageError(
        f"the KV pools need {_gib(need)} across {len(per_rank_token_bytes)} rank(s) and this "
        f"host has {_gib(machine.memory_available)} available; the largest "
        f"--max-total-tokens that fits is {largest} (host pool sized alike)"
    )


def check_requests(
    requests: int, tokens_per_request: int, copies: int, machine: Machine | None = None
) -> None:
    """The workload is built up front in every rank and the CLI (prompts, reference, outputs)."""
    machine = machine or Machine.here()
    each = (REQUEST_BYTES + 8 * tokens_per_request) * copies
    largest = machine.memory_budget // each
    if requests > largest:
        raise UsageError(
            f"--requests {requests} needs ~{_gib(requests * each)} of memory for the workload "
            f"held by {copies} process(es); the largest that fits is {largest}"
        )


def check_record_disk(steps: int, world_size: int, out: str | Path | None, flag: str) -> None:
    """rank{r}.jsonl grows a line per step per rank; `steps` of them must fit the disk."""
    free = disk_free(out or "runs")
    each = RECORD_BYTES_PER_STEP * world_size
    largest = free // each
    if steps > largest:
        raise UsageError(
            f"{flag}: {steps} recorded steps x {world_size} rank(s) need ~{_gib(steps * each)} "
            f"and the disk under {out or 'runs/'} has {_gib(free)} free; the largest that fits "
            f"is {largest}"
        )


def check_trials(trials: int, cells: int, out: str | Path) -> None:
    """Each trial leaves a run directory; the whole matrix must fit the disk."""
    free = disk_free(out)
    largest = free // (RUN_DIR_BYTES * cells)
    if trials > largest:
        raise UsageError(
            f"--trials {trials} x {cells} cell(s) leave ~{_gib(trials * cells * RUN_DIR_BYTES)}"
            f" of run directories and {out} has {_gib(free)} free; the largest --trials that "
            f"fits is {largest}"
        )


def check_jobs(jobs: int, world_size: int, machine: Machine | None = None) -> None:
    """Parallel trials each hold world_size rank processes in memory."""
    machine = machine or Machine.here()
    largest = max(1, machine.memory_budget // (RANK_PROCESS_BYTES * max(1, world_size)))
    check_int(
        "--jobs",
        jobs,
        1,
        largest,
        f"{world_size} rank(s) per trial in {_gib(machine.memory_available)} of available memory",
    )
