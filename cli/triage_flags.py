"""`triage`'s inputs: each flag declared once (a `Param`), and CHECKS, the one table of
triage's input rules over them, run before anything is read, sampled or dumped (cli/triage.py).
What only reading or sampling can tell (a process gone, a log that is no log) is said where it
is found."""

from __future__ import annotations

import math
import os
from pathlib import Path

from hicache_diag.cli.params import Check, Parsed
from hicache_diag.options.params import HOSTS, SSH_CONFIG, VIA, Param

PID = Param("--pid", "Scheduler PID; repeat for several ranks.", "PID")
DISCOVER = Param("--discover", "Dump every sglang::scheduler* / hicache-diag::scheduler* process.")
PARENT = Param("--parent", "With --discover: only this launcher's tree.", "PID")
DUMPS = Param(
    "--dumps",
    "Folder of py-spy dumps (text, --json, --native, bare frames) or faulthandler text (repeat "
    "per node).",
    "DIR",
)
LOGS = Param(
    "--logs",
    "Server log, as written or behind CRI / docker / journald / Loki / table prefixes, or a "
    "pasted traceback (repeat per node).",
    "FILE",
)
SAVE = Param("--save", "Write the live samples here (merge with --dumps).", "DIR")
RECORD_DIR = Param(
    "--record-dir",
    "A production recording (`hicache-diag record`): a session folder or its record dir, as "
    "left or copied (repeat per node); with --pid/--discover, where to find the live ranks' "
    "recordings when their environment cannot be read.",
    "DIR",
)
FLIGHT = Param(
    "--fr",
    "Folder of PyTorch Flight Recorder dumps, one file per rank (pickle or JSON; "
    "docs/triage-framing.md).",
    "DIR",
)
INTERVAL = Param("--interval", "Seconds between live samples.", "SECONDS")
SAMPLES = Param("--samples", "Live samples per rank (>= 2 tells progress from a wedge).", "N")
NATIVE = Param("--native", "Add a py-spy --native pass.")
DEADLINE = Param("--deadline", "Seconds allowed per dump pass.", "SECONDS")
NUM_HEADS = Param("--num-heads", "Local attention heads, to decode form A's sizes.", "N")
PP = Param(
    "--pp",
    "The deployment's PP size, when the logs do not show PP prefixes.",
    "N",
    deprecated=("--pp-size",),
)
JSON = Param("--json", "Print hicache-diag/triage/v1.")
LIVE = Param(
    "--live", "Sample every node's schedulers at one instant through --via (docs/cluster.md)."
)
JOBID = Param("--jobid", "The running Slurm job (srun --overlap into it).", "J")
SELECTOR = Param("--selector", "kubectl: the pods' label selector.", "LABEL=VALUE")
NAMESPACE = Param("--namespace", "kubectl: namespace.", "NS", aliases=("-n",))
CONTAINER = Param("--container", "kubectl: the container.", "NAME")
HOST_TIMEOUT = Param("--host-timeout", "Per node: a later answer is missing.", "SECONDS")
# The cluster flags: any of them (or --live) samples the nodes instead of this host.
CLUSTER = (VIA, HOSTS, JOBID, SELECTOR, NAMESPACE, CONTAINER, SSH_CONFIG)
LOG_ARGS = "more_logs"  # the positional LOG files, read as --logs


def _cluster(p: Parsed) -> bool:
    return bool(p.value(LIVE)) or any(p.value(f) is not None for f in CLUSTER)


def _local_live(p: Parsed) -> bool:
    """Samples processes here (--pid, --discover)."""
    return bool(p.value(PID) or p.value(DISCOVER))


def _logs(p: Parsed) -> list[str]:
    return [*(p.value(LOGS) or ()), *(p.argument(LOG_ARGS) or ())]


def _live_only(p: Parsed) -> str | None:
    for flag in (INTERVAL, DEADLINE, SAMPLES):
        if p.given(flag) and not (_local_live(p) or _cluster(p)):
            return f"{flag} paces live sampling: use it with {PID}, {DISCOVER} or {LIVE}"
    if p.given(HOST_TIMEOUT) and not (p.value(LIVE) or p.value(VIA)):
        return f"{HOST_TIMEOUT} bounds each node of {LIVE}: use it with {LIVE}/{VIA}"
    return None


def _jobid_not_slurm(p: Parsed) -> str | None:
    via = p.value(VIA)
    if p.given(JOBID) and via not in (None, "slurm"):
        return f"{JOBID} names a Slurm job: it does nothing with {VIA} {via}"
    return None


def _read_twice(p: Parsed) -> str | None:
    for flag, paths in ((DUMPS, p.value(DUMPS) or ()), (LOGS, _logs(p))):
        seen = [os.path.realpath(x) for x in paths]  # a symlink loop: the input checks' to refuse
        twice = next((x for i, x in enumerate(seen) if x in seen[:i]), None)
        if twice is not None:
            return f"{flag} {str(twice)!r} given twice: each input is read once"
    return None


def _local_inputs_with_live(p: Parsed) -> str | None:
    local = (p.value(PID), p.value(DISCOVER), p.value(DUMPS), _logs(p), p.value(RECORD_DIR))
    if _cluster(p) and any(local):
        return f"{LIVE} samples the nodes: not with {PID}/{DISCOVER}/{DUMPS}/{LOGS}/{RECORD_DIR}"
    return None


def _host_timeout(p: Parsed) -> str | None:
    value = p.value(HOST_TIMEOUT)
    if _cluster(p) and value <= 0:
        return f"{HOST_TIMEOUT} must be > 0 (got {value})"
    return None


def _paths(p: Parsed) -> str | None:
    """Before anything is read: a device or FIFO would be read forever; '' is no path; --save
    a new or empty folder (a second save into it is refused, never merged)."""
    from hicache_diag.evidence.output_paths import claim_dir
    from hicache_diag.evidence.paths import input_dir, input_file

    for path in [] if _cluster(p) else _logs(p):
        input_file(str(LOGS), path)
    for flag in (DUMPS, RECORD_DIR, FLIGHT):
        for path in [] if _cluster(p) else p.value(flag) or ():
            input_dir(str(flag), path)
    claim_dir(str(SAVE), p.value(SAVE), fresh=True, once="a --save bundle")
    return None


def _something(p: Parsed) -> str | None:
    given = (p.value(DUMPS), _logs(p), p.value(RECORD_DIR), p.value(FLIGHT))
    if not (_cluster(p) or _local_live(p) or any(given)):
        return (
            f"nothing to triage: give {PID}, {DISCOVER}, {DUMPS}, {LOGS}, {RECORD_DIR} or {FLIGHT}"
        )
    return None


def _numbers(p: Parsed) -> str | None:
    bad = [x for x in p.value(PID) or () if x < 1]
    if bad:
        return f"{PID} must be a positive process id, got {bad[0]}"
    interval, deadline, samples = p.value(INTERVAL), p.value(DEADLINE), p.value(SAMPLES)
    if not (math.isfinite(interval) and math.isfinite(deadline)):
        return f"{INTERVAL} and {DEADLINE} must be finite numbers of seconds"
    if samples < 1:
        return f"{SAMPLES} must be at least 1, got {samples}"
    if interval < 0 or deadline <= 0:
        return f"{INTERVAL} must be >= 0 and {DEADLINE} > 0"
    for flag in (NUM_HEADS, PP):
        value = p.value(flag)
        if value is not None and value < 1:
            return f"{flag} must be positive, got {value}"
    return None


def _needs_live(p: Parsed) -> str | None:
    if _cluster(p):
        return None
    if p.value(SAVE) and not _local_live(p):
        return f"{SAVE} writes live samples: use it with {PID} or {DISCOVER}"
    if p.value(PARENT) is not None and not p.value(DISCOVER):
        return f"{PARENT} limits {DISCOVER}: give both"
    if p.value(NATIVE) and not _local_live(p):
        return f"{NATIVE} adds a live py-spy pass: use it with {PID} or {DISCOVER}"
    return None


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 2**22  # Linux's ceiling


def _pids_here(p: Parsed) -> str | None:
    import psutil

    pid_max = _pid_max()
    gone = [x for x in p.value(PID) or () if x > pid_max or not psutil.pid_exists(x)]
    return f"{PID} {gone[0]}: no such process on this host" if gone else None


def _within_a_day(p: Parsed) -> str | None:
    from hicache_diag.options.limits import MAX_SECONDS

    interval, deadline, samples = p.value(INTERVAL), p.value(DEADLINE), p.value(SAMPLES)
    for flag, value in ((INTERVAL, interval), (DEADLINE, deadline)):
        if value > MAX_SECONDS:
            return f"{flag} must be <= {MAX_SECONDS:.0f} s (one day) (got {value})"
    most = int(MAX_SECONDS // (interval + deadline))
    if _local_live(p) and samples > most:
        return (
            f"{SAMPLES} {samples} x ({INTERVAL} {interval} + {DEADLINE} {deadline}) s is more "
            f"than a day; the largest that fits is {most}"
        )
    return None


# triage's input rules, in the order they are told: flags that would do nothing, then paths,
# then what each value must be.
CHECKS = (
    Check("live-only-flags-without-live", _live_only),
    Check("jobid-without-slurm", _jobid_not_slurm),
    Check("input-read-twice", _read_twice),
    Check("local-inputs-with-live", _local_inputs_with_live),
    Check("host-timeout-positive", _host_timeout),
    Check("input-paths", _paths),
    Check("nothing-to-triage", _something),
    Check("numbers", _numbers),
    Check("flags-that-need-live-samples", _needs_live),
    Check("pids-on-this-host", _pids_here),
    Check("live-sampling-within-a-day", _within_a_day),
)
