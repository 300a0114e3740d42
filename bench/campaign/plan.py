"""Ground-truth campaign: random fault schedules over topologies and protocols, each
run as a real trial, the classifier scored against what was really injected.

The truth (fault kind, perturbed ranks, whether the protocol's fix covers it) stays with the
campaign, outside the run directory. The classifier reads a *blinded copy* of each run
directory: the manifest without its fault list and argv, the rank jsonl without `faults_fired`,
the rank logs without the lines that name an installed fault. Each trial also has a control:
the same command and seed without the fault, so a failure the configuration produces on its
own (natural DMA timing under `ack-count=local`) is not blamed on the fault.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag.engines.builtin.runtime.protocol import PRESETS, SWITCHES

# Fault kind -> (divergence source its per-rank input produces, switches whose fix absorbs it).
# A timing-only fault has no source of its own; every timing-sensitive switch must be fixed
# for it to be harmless.
TIMING_SWITCHES = ("ack-count", "lru-clock", "l3-hit", "l3-progress")
KINDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "dma-delay": ("dma-ack-count", ("ack-count",)),
    "host-alloc-fail": ("host-alloc", ("host-alloc",)),
    "clock-skew": ("lru-clock", ("lru-clock",)),
    "l3-hit": ("l3-hit", ("l3-hit",)),  # l3-partial-hit with keep < 1
    "l3-progress": ("l3-progress", ("l3-progress",)),  # l3-partial-hit with holes > 0
    "p2p-delay": (None, TIMING_SWITCHES),
    "rank-stall": (None, TIMING_SWITCHES),
}
# The single legacy switch each kind is usually paired with (so most trials can diverge).
KIND_SWITCH = {
    "dma-delay": "ack-count",
    "host-alloc-fail": "host-alloc",
    "clock-skew": "lru-clock",
    "l3-hit": "l3-hit",
    "l3-progress": "l3-progress",
}
L3_KINDS = ("l3-hit", "l3-progress")
# Timing-only faults have no culprit to score; they are drawn less often.
KIND_WEIGHTS = {
    "dma-delay": 2,
    "host-alloc-fail": 3,
    "clock-skew": 3,
    "l3-hit": 1,
    "l3-progress": 3,
    "p2p-delay": 1,
    "rank-stall": 1,
}
BASE_ARGS = ("--requests", "16", "--hang-timeout", "2")
# The l3_divergence recipe: requests far apart, so earlier ones are in L3 when later ones come.
L3_ARGS = (
    "--requests",
    "12",
    "--hang-timeout",
    "2",
    "--storage-backend",
    "file",
    "--workload",
    "idle",
    "--max-total-tokens",
    "128",
    "--hicache-size",
    "192KiB",
    "--hicache-storage-prefetch-policy",
    "wait_complete",
)


@dataclass(frozen=True, slots=True)
class TrialPlan:
    """One random trial; `fault` is the spec given to `run`, `kind` what the truth calls it."""

    index: int
    seed: int
    pp: int
    tp: int
    async_depth: int
    preset: str
    fixes: tuple[str, ...]
    kind: str
    fault: str
    targets: tuple[int, ...]
    run_args: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"t{self.index:03d}"

    @property
    def protocol_label(self) -> str:
        return self.preset + "".join(f"+{f}" for f in self.fixes)

    def modes(self) -> dict[str, str]:
        modes = dict(PRESETS[self.preset])
        modes.update(f.split("=", 1) for f in self.fixes)
        return modes

    def absorbed(self) -> bool:
        """Whether the protocol's fixes cover this fault (it must then change nothing)."""
        modes = self.modes()
        return all(modes[s] != SWITCHES[s].legacy for s in KINDS[self.kind][1])

    def argv(self, out: Path, *, control: bool = False) -> list[str]:
        argv = [
            "--pp",
            str(self.pp),
            "--tp",
            str(self.tp),
            "--async-depth",
            str(self.async_depth),
            "--protocol",
            self.preset,
        ]
        for fix in self.fixes:
            argv += ["--switch", fix]
        argv += list(self.run_args)
        if not control:
            argv += ["--fault", self.fault]
        return [*argv, "--seed", str(self.seed), "--out", str(out), "--json"]

    def control_key(self) -> str:
        return json.dumps(self.argv(Path("-"), control=True))


def _protocol(rng: random.Random, kind: str, l3: bool) -> tuple[str, tuple[str, ...]]:
    """legacy, l2, or full with one legacy switch (mostly the fault's own)."""
    roll = rng.random()
    if roll < 0.1:
        return "legacy", ()
    if roll < 0.2 and not l3:
        return "l2", ()
    own = KIND_SWITCH.get(kind)
    # clock-skew under the logical clock is refused (it touches nothing): keep its switch legacy.
    names = [own] if own and (rng.random() < 0.8 or kind == "clock-skew") else list(SWITCHES)
    name = rng.choice(names)
    return "full", (f"{name}={SWITCHES[name].legacy}",)


def _fault_spec(rng: random.Random, kind: str, targets: tuple[int, ...]) -> str:
    after = rng.choice((0, 0, 5, 10, 20))
    keys = [f"rank={'|'.join(map(str, targets))}"]
    if after:
        keys.append(f"after={after}")
    if rng.random() < 0.3 and kind not in L3_KINDS:  # L3 reads come late (warm L3 needed)
        keys.append(f"until={after + rng.randint(5, 40)}")
    if rng.random() < 0.3:
        keys.append("p=0.5")
    keys.append(f"seed={rng.randint(0, 999)}")
    own = {
        "dma-delay": lambda: f"ms={rng.choice((10, 30, 50))},dir={rng.choice(('write', 'both'))}",
        "host-alloc-fail": lambda: f"every={rng.choice((1, 1, 2, 3))}",
        "clock-skew": lambda: f"jitter-us={rng.choice((5000, 20000))}",
        "l3-hit": lambda: f"keep={rng.choice((0.0, 0.5))}",
        "l3-progress": lambda: f"holes={rng.choice((0.3, 0.6))}",
        "p2p-delay": lambda: f"ms={rng.choice((2, 10))}",
        "rank-stall": lambda: f"ms={rng.choice((20, 100))},every={rng.choice((5, 20))}",
    }[kind]()
    name = "l3-partial-hit" if kind in L3_KINDS else kind
    return f"{name}:{','.join(keys)},{own}"


def plan_trials(n: int, seed: int = 0, two_rank_share: float = 0.1) -> list[TrialPlan]:
    """`n` random trials, reproducible from `seed`. A `two_rank_share` of them perturb two
    ranks at once (ambiguous by construction: the report says so instead of scoring them)."""
    rng = random.Random(f"hicache-diag/campaign/{seed}")
    plans = []
    for i in range(n):
        kind = rng.choices(tuple(KIND_WEIGHTS), weights=tuple(KIND_WEIGHTS.values()))[0]
        l3 = kind in L3_KINDS
        pp = rng.choice((2, 2, 3, 4))
        tp = 1 if pp == 4 or rng.random() < 0.7 else 2  # at most 6 ranks on a small box
        world = pp * tp
        targets = tuple(sorted(rng.sample(range(world), 2 if rng.random() < two_rank_share else 1)))
        preset, fixes = _protocol(rng, kind, l3)
        # A small device pool mostly: eviction pressure is where LRU order and host allocs matter.
        tokens = rng.choice(("256", "256", "256", "512"))
        run_args = L3_ARGS if l3 else (*BASE_ARGS, "--max-total-tokens", tokens)
        spec = _fault_spec(rng, kind, targets)
        depth, seed_ = rng.choice((0, 1)), rng.randint(0, 9999)
        plans.append(
            TrialPlan(i, seed_, pp, tp, depth, preset, fixes, kind, spec, targets, run_args)
        )
    return plans


# ---- blinding ---------------------------------------------------------------------------------

_FAULT_LOG = re.compile(r"faults on PP|rank-stall|faults \[")


def blind_copy(run_dir: Path, dest: Path) -> Path:
    """Copy `run_dir` to `dest` with every trace of the injected faults removed: the manifest's
    fault list and argv (and the config's copy of them), `faults_fired` in the rank jsonl, and
    the log lines in which a rank names its installed faults or a stall it was told to take."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("*.bin"))
    manifest = dest / "manifest.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        for key in ("faults", "argv", "scenario"):
            data.pop(key, None)
        for key in ("faults", "scenario"):
            (data.get("config") or {}).pop(key, None)
        manifest.write_text(json.dumps(data, indent=1))
    for path in dest.glob("rank*.jsonl"):
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        for line in lines:
            line.pop("faults_fired", None)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for path in dest.glob("rank*.log"):
        kept = [
            x for x in path.read_text(errors="replace").splitlines(True) if not _FAULT_LOG.search(x)
        ]
        path.write_text("".join(kept))
    (dest / "verdict.json").unlink(missing_ok=True)
    return dest


# ---- oracle facts (read by the campaign, never by the classifier) ------------------------------


@dataclass(slots=True)
class Facts:
    """What really happened in one run, read from its unblinded directory."""

    fired_ranks: list[int] = field(default_factory=list)
    first_fired_step: int | None = None
    form: str | None = None  # from process facts: launcher hang -> C, the first error's text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_STALL_LOG = re.compile(r"rank-stall: stalling .* at step (\d+)")


def _fired(run_dir: Path) -> tuple[list[int], int | None]:
    ranks, steps = set(), []
    for path in run_dir.glob("rank*.jsonl"):
        rank = int(path.stem.removeprefix("rank"))
        for text in path.read_text().splitlines():
            for f in (json.loads(text).get("faults_fired") or []) if text.strip() else []:
                ranks.add(rank)
                steps.append(int(f.get("step", 0)))
    for path in run_dir.glob("rank*.log"):
        for m in _STALL_LOG.finditer(path.read_text(errors="replace")):
            ranks.add(int(path.stem.removeprefix("rank")))
            steps.append(int(m[1]))
    return sorted(ranks), (min(steps) if steps else None)


def _raw_form(run_dir: Path) -> str | None:
    """The form as plain process facts show it, without the classifier's rules: a hang the
    launcher detected is C; else the first rank to fail raised `pop from empty list` (B) or a
    shape error (A: the reshape text, or torch's later size mismatch on a downstream stage)."""
    try:
        launcher = json.loads((run_dir / "launcher.json").read_text())
    except (OSError, ValueError):
        return None
    if launcher.get("hang"):
        return "C"
    first = launcher.get("first_failure") or {}
    if first.get("rank") is None:
        return None
    log = (run_dir / f"rank{first['rank']}.log").read_text(errors="replace")
    if "pop from empty list" in log:
        return "B"
    if re.search(r"shape '\[\d+, -1, \d+\]' is invalid|shape mismatch|size of tensor", log):
        return "A"
    return "other"


def run_facts(run_dir: Path) -> Facts:
    ranks, first = _fired(run_dir)
    return Facts(ranks, first, _raw_form(run_dir))
