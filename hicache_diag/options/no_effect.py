"""Inputs that would do nothing, or contradict each other, refused before anything starts, from
one home: RULES over the run options (both engines; `run`, and the run flags of bisect, hunt
and shrink), and FLAG_RULES over any command's own flags as parsed (cli/main.py applies them to
every command). Each is a one-line reason naming what was written; a FLAG_RULES row marked
`warn` only warns (the input has a smaller effect than it says, not none)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hicache_diag.errors import UsageError

if TYPE_CHECKING:
    from hicache_diag.faults.base import Fault


class RunOptions(Protocol):
    """What the rules read of the run options (run_options.py, the layer above, calls them)."""

    given: Mapping[str, str]
    faults: tuple[str, ...]
    pp: int
    tp: int
    hicache_storage_dir: str | None

    @property
    def host_bytes(self) -> int: ...
    @property
    def storage(self) -> bool: ...
    def how(self, name: str) -> str: ...


NO_L3 = "does nothing without --hicache-storage-backend file"
L3_FAULTS = ("l3-partial-hit", "prefetch-alloc-fail")  # act only at the L3 storage hook points
PP_FAULTS = ("p2p-delay",)  # act only on the PP sends between stages


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    reason: Callable[[RunOptions], str | None]


def _size_and_ratio(o: RunOptions) -> str | None:
    if o.host_bytes and "hicache_ratio" in o.given:
        return (
            "--hicache-size and --hicache-ratio both set: a size fixes the host pool and the "
            "ratio does nothing; give one of them"
        )
    return None


def _storage_options(o: RunOptions) -> str | None:
    if o.storage:
        return None
    if o.hicache_storage_dir:
        return f"{o.how('hicache_storage_dir')} {NO_L3}"
    if "hicache_storage_prefetch_policy" in o.given:
        return f"{o.how('hicache_storage_prefetch_policy')} {NO_L3}"
    return None


def _faults(o: RunOptions) -> Iterator[tuple[str, Fault]]:
    from hicache_diag.faults import parse_fault_spec

    for spec in o.faults:
        parsed = parse_fault_spec(spec)
        yield parsed.name, parsed.build()


def _fault_needs(o: RunOptions) -> str | None:
    for name, _ in _faults(o):
        if name in L3_FAULTS and not o.storage:
            return f"fault {name!r} acts on L3 storage and {NO_L3}"
        if name in PP_FAULTS and o.pp < 2:
            return f"fault {name!r} delays the sends between PP stages and does nothing with --pp 1"
    return None


def _fault_never_fires(o: RunOptions) -> str | None:
    budget = getattr(o, "max_steps", None)  # the builtin runtime's step budget, when given
    for name, fault in _faults(o):  # (until < after: faults/base.py refuses)
        if fault.p == 0:
            return f"fault {name!r} never fires: p=0"
        if budget is not None and fault.after > budget:
            return (
                f"fault {name!r} never fires: its window opens at after={fault.after}, past "
                f"{o.how('max_steps')} {budget}"
            )
    return None


# Effect keys whose 0 is no effect (`leave=0`, a pool left empty, is the strongest shortage).
ZERO_IS_NONE = ("ms", "jitter-ms", "offset-ms", "drift-ppm", "jitter-us", "phase-ms", "hold")


def _fault_of_zero_size(o: RunOptions) -> str | None:
    """A fault whose every effect key is 0 or unset (a stall of 0 ms) fires and changes
    nothing."""
    for name, fault in _faults(o):
        keys = type(fault).EFFECT_KEYS
        values = {k: getattr(fault, k.replace("-", "_"), None) for k in keys}
        if keys and all(v is None or (k in ZERO_IS_NONE and v == 0) for k, v in values.items()):
            zero = ",".join(f"{k}={v:g}" for k, v in values.items() if v is not None)
            return f"fault {name!r} does nothing: {zero} (give one of {', '.join(keys)} > 0)"
    return None


def _contradicting_fixes(o: RunOptions) -> str | None:
    seen: dict[str, str] = {}
    for item in getattr(o, "fix", ()):
        switch, _, mode = item.partition("=")
        if switch in seen and seen[switch] != mode:
            return (
                f"--fix {switch}={seen[switch]} and --fix {switch}={mode} contradict; give the "
                "switch once"
            )
        seen[switch] = mode
    return None


def _idle_nodes(o: RunOptions) -> str | None:
    nnodes, ranks = getattr(o, "nnodes", 1), o.pp * o.tp
    if nnodes > ranks:
        return (
            f"{o.how('nnodes')} {nnodes} is more nodes than ranks ({ranks}: --pp {o.pp} x "
            f"--tp {o.tp}): a node would run nothing"
        )
    return None


def _warm_across_nodes(o: RunOptions) -> str | None:
    if getattr(o, "warm_server", False) and getattr(o, "nnodes", 1) > 1:
        return (
            f"--warm-server and {o.how('nnodes')} {o.nnodes} together: a warm server is proven "
            "clean on one node only; drop one of them"
        )
    return None


def _hosts(o: RunOptions) -> str | None:
    """--hosts/--via/--ssh-config place the nodes of --nnodes on machines (cluster/
    remote_nodes.py checks that they answer); each is refused where it would do nothing."""
    hosts, via, nnodes = getattr(o, "hosts", None), getattr(o, "via", None), getattr(o, "nnodes", 1)
    if via is not None and via != "ssh":
        return (
            f"run --via {via}: not built; run places its nodes on machines through ssh "
            "(--via ssh --hosts A,B)"
        )
    if not hosts:
        if via or getattr(o, "ssh_config", None):
            given = "--via ssh" if via else "--ssh-config"
            return f"{given} places the nodes of --nnodes on --hosts A,B: give --hosts"
        return None
    count = len(hosts.split(","))
    if nnodes <= 1:
        return f"--hosts places the nodes of --nnodes N on machines: give --nnodes {count}"
    if count != nnodes:
        return (
            f"--hosts names {count} host(s) for {o.how('nnodes')} {nnodes}: give one host per "
            "node, node 0's first"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule("size-and-ratio", _size_and_ratio),
    Rule("storage-options-without-storage", _storage_options),
    Rule("fault-without-its-mechanism", _fault_needs),
    Rule("fault-that-never-fires", _fault_never_fires),
    Rule("fault-of-zero-size", _fault_of_zero_size),
    Rule("contradicting-fixes", _contradicting_fixes),
    Rule("nodes-without-ranks", _idle_nodes),
    Rule("warm-server-across-nodes", _warm_across_nodes),
    Rule("hosts-without-their-nodes", _hosts),
)


def refuse_no_effect(options: RunOptions) -> None:
    """The first rule the options break, as a UsageError (exit 2)."""
    for rule in RULES:
        why = rule.reason(options)
        if why:
            raise UsageError(why)


@dataclass(frozen=True, slots=True)
class Flags:
    """One command's parameters as parsed, and which of them the command line set."""

    command: str
    values: Mapping[str, Any]
    given: frozenset[str]

    def has(self, *names: str) -> bool:
        return any(n in self.given for n in names)

    def live(self) -> bool:
        """triage: samples processes (here, or on nodes through --live/--via)."""
        v = self.values
        return bool(v.get("pid") or v.get("discover") or v.get("live") or v.get("via"))


@dataclass(frozen=True, slots=True)
class FlagRule:
    command: str
    name: str
    reason: Callable[[Flags], str | None]
    warn: bool = False


def _live_only(f: Flags) -> str | None:
    for name in ("interval", "deadline", "samples"):
        if f.has(name) and not f.live():
            return f"--{name} paces live sampling: use it with --pid, --discover or --live"
    if f.has("host_timeout") and not f.has("live", "via"):
        return "--host-timeout bounds each node of --live: use it with --live/--via"
    return None


def _jobid_not_slurm(f: Flags) -> str | None:
    via = f.values.get("via")
    if f.has("jobid") and via not in (None, "slurm"):
        return f"--jobid names a Slurm job: it does nothing with --via {via}"
    return None


def _read_twice(f: Flags) -> str | None:
    import os

    for name in ("dumps", "logs"):  # realpath: a symlink loop is the input checks' to refuse
        paths = [os.path.realpath(p) for p in f.values.get(name) or ()]
        if name == "logs":
            paths += [os.path.realpath(p) for p in f.values.get("more_logs") or ()]
        twice = next((p for i, p in enumerate(paths) if p in paths[:i]), None)
        if twice is not None:
            return f"--{name} {str(twice)!r} given twice: each input is read once"
    return None


def _force_without_outputs(f: Flags) -> str | None:
    if f.values.get("force") and not f.has("plots", "summary", "html", "save"):
        return (
            "--force replaces output files: it does nothing without --plots, --summary, "
            "--html or --save"
        )
    return None


def _engine_against_tree(f: Flags) -> str | None:
    # (--engine builtin --source: the builtin engine's own sources() says "drop --source")
    if f.values.get("engine") == "builtin" and f.has("sglang_python"):
        return "--engine builtin scans our own runtime, not an SGLang's: drop --sglang-python"
    return None


def _sources_self_or_all(f: Flags) -> str | None:
    diff = f.values.get("diff")
    if diff and len(set(diff)) == 1:
        return f"--diff {diff[0]} {diff[1]} compares a tree with itself: name two trees"
    if f.values.get("show_all") and f.has("run"):
        return "--all lists a scan's undecided reads: it does nothing with --run"
    return None


def _list_faults_with_run_flags(f: Flags) -> str | None:
    idle = sorted(f.given - {"list_faults", "engine"}) if f.values.get("list_faults") else ()
    if not idle:
        return None
    flags = ", ".join("--" + name.rstrip("_").replace("_", "-") for name in idle)
    return (
        f"--list-faults prints the fault catalog and exits; it ignores {flags} (--engine "
        "keeps the faults that engine can run)"
    )


def _cells(f: Flags) -> int:
    values = [f.values.get(n) for n in ("storage_backend", "hicache_size", "sglang_version")]
    values += [f.values.get("sglang_python")]
    values += [s.partition("=")[2] for s in f.values.get("switch") or ()]
    return math.prod(len([x for x in str(v).split(",") if x.strip()]) for v in values if v)


def _idle_jobs(f: Flags) -> str | None:
    from hicache_diag.options.limits import check_jobs

    trials = int(f.values.get("trials") or 1) * _cells(f)
    jobs = f.values.get("jobs")
    if not (f.has("jobs") and isinstance(jobs, int) and jobs > trials >= 1):
        return None
    try:
        check_jobs(jobs, 1)  # a --jobs past what fits is bisect's own refusal, not a warning
    except UsageError:
        return None
    return f"--jobs {jobs}: the matrix has {trials} trial(s), so at most {trials} run at once"


FLAG_RULES: tuple[FlagRule, ...] = (
    FlagRule("triage", "live-only-flags-without-live", _live_only),
    FlagRule("triage", "jobid-without-slurm", _jobid_not_slurm),
    FlagRule("triage", "input-read-twice", _read_twice),
    FlagRule("report", "force-without-outputs", _force_without_outputs),
    FlagRule("run", "list-faults-with-run-flags", _list_faults_with_run_flags, warn=True),
    FlagRule("sources", "engine-against-named-tree", _engine_against_tree),
    FlagRule("sources", "diff-with-itself-or-all-with-run", _sources_self_or_all),
    FlagRule("bisect", "more-jobs-than-trials", _idle_jobs, warn=True),
)


def refuse_no_effect_flags(flags: Flags) -> list[str]:
    """The first refusing rule of `flags.command` as a UsageError; else its warnings."""
    warnings = []
    for rule in FLAG_RULES:
        why = rule.reason(flags) if rule.command == flags.command else None
        if why and not rule.warn:
            raise UsageError(why)
        if why:
            warnings.append(why)
    return warnings
