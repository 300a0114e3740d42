"""Diagnostic accuracy against ground truth: N random fault schedules, each a real `run`.

    python bench/accuracy.py [--trials 60] [--seed 0] [--jobs 2] [--out DIR] [--verbose]

Trials draw a fault kind (dma-delay, host-alloc-fail, clock-skew, l3-partial-hit keep/holes,
p2p-delay, rank-stall), its rank(s), step window, probability and seed, a topology (PP 2-4,
TP 1-2, async depth 0-1) and a protocol (legacy, l2, or full with one legacy switch), from
`--seed`. Each trial also runs its control (the same command and seed without the fault). The
injected truth stays here: the classifier reads a blinded copy of each run directory (no fault
list, no `faults_fired`, no log line naming a fault), and the line `blinded verdict differs`
counts runs whose own verdict changed when blinded (0 means it never looked).

Prints the ambiguous trials by reason (two ranks perturbed, fails without the fault too, fault
never fired or never mattered, timing-only fault), per-kind scores, the confusion tables of
source, form and outcome, and last `accuracy: culprit X/Y, source X/Y, form X/Y` over the
decidable trials (bench/campaign/score.py says which are). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/campaign/, also when imported

from campaign.plan import TrialPlan, blind_copy, plan_trials, run_facts  # noqa: E402
from campaign.score import Scored, by_kind, confusion, summarize, verdict_fields  # noqa: E402

from hicache_diag.cli.run import options_from_argv
from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.engines.registry import build, engine
from hicache_diag.trials.bisect_trials import PlannedTrial, TrialRunner, trial_env
from hicache_diag.trials.trial_server import TrialServer


def _run(runner: TrialRunner, argv: list[str], out: Path, seed: int) -> dict | None:
    cfg = build(options_from_argv(argv))  # argv holds the trial's --seed and --out
    res = runner.run(PlannedTrial(0, seed, out, ["hicache-diag", "run", *argv], cfg))
    try:
        return json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        return None if res is None or res.outcome is None else {"outcome": res.outcome}


def _control(runner: TrialRunner, plan: TrialPlan, root: Path, cache: dict) -> tuple:
    """(outcome, first divergence step) of the same command and seed without the fault."""
    key = plan.control_key()
    if key not in cache:
        out = root / "controls" / plan.name
        verdict = _run(runner, plan.argv(out, control=True), out, plan.seed) or {}
        cache[key] = (verdict.get("outcome"), verdict_fields(verdict)["step"])
    return cache[key]


def _trial(runner: TrialRunner, plan: TrialPlan, root: Path, cache: dict) -> Scored:
    control, control_step = _control(runner, plan, root, cache)
    out = root / "runs" / plan.name
    own = _run(runner, plan.argv(out), out, plan.seed) or {}
    blind = blind_copy(out, root / "blind" / plan.name) if out.exists() else None
    verdict = verdict_fields(classify_run(blind).to_json()) if blind else {}
    same = verdict_fields(own) == verdict if own else True
    return Scored(plan, run_facts(out), control, verdict, same, control_step)


def run_campaign(plans: list[TrialPlan], root: Path, jobs: int, timeout_s: float) -> list[Scored]:
    runner = TrialRunner(timeout_s)
    modules = engine("builtin").preload
    runner.server = TrialServer.start(root / "trial-server.log", trial_env(), modules=modules)
    cache: dict[str, str | None] = {}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_trial, runner, plan, root, cache) for plan in plans]
            return [f.result() for f in futures]
    except KeyboardInterrupt:
        runner.kill_all()
        raise
    finally:
        if runner.server is not None:
            runner.server.close()


def _table(title: str, rows: list[str], cols: list[str], cells: dict) -> None:
    head = "truth \\ verdict"
    width = max([len(r) for r in rows] + [len(head)]) + 2
    print(f"\n{title}")
    print(f"{head:<{width}}" + "".join(f"{c:>15}" for c in cols))
    for r in rows:
        print(f"{r:<{width}}" + "".join(f"{cells.get((r, c), 0):>15}" for c in cols))


def report(rows: list[Scored], wall_s: float, verbose: bool) -> None:
    if verbose:
        for r in rows:
            p = r.plan
            print(
                f"{p.name} pp{p.pp} tp{p.tp} d{p.async_depth} {p.protocol_label:<28} "
                f"{p.fault:<60} control={r.control}@{r.control_step} "
                f"fired={r.facts.fired_ranks}@{r.facts.first_fired_step} "
                f"-> {r.verdict} [{r.ambiguous or 'decidable'}]"
                f"{'' if r.same_as_unblinded else ' BLINDING CHANGED THE VERDICT'}"
            )
    s = summarize(rows)
    print(
        f"\n{s.trials} trials in {wall_s:.0f} s; decidable {s.decidable}; "
        f"blinded verdict differs from the run's own: {s.blinding_changed}"
    )
    for reason, n in s.ambiguous.most_common():
        print(f"  ambiguous: {reason}: {n}")
    print(f"\n{'kind':<16}{'trials':>8}{'decidable':>11}{'culprit':>9}{'source':>8}")
    for kind, n, dec, cul, src in by_kind(rows):
        print(f"{kind:<16}{n:>8}{dec:>11}{cul:>9}{src:>8}")
    _table("source (decidable trials)", *confusion(rows, "source"))
    _table("form (runs that crashed or hung; truth from process facts)", *confusion(rows, "form"))
    _table("outcome (the fix covers the fault: ok expected)", *confusion(rows, "outcome"))
    print(f"outcome: {s.outcome}/{s.outcome_total} ok where the fix covers the fault")
    print(
        f"fault first (the control failed too, but later; not in the line below): culprit "
        f"{s.ff_culprit}/{s.fault_first}, source {s.ff_source}/{s.fault_first}"
    )
    print(s.last_line())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0, help="draws the whole campaign")
    ap.add_argument("--jobs", type=int, default=2, help="trials at a time")
    ap.add_argument("--out", type=Path, help="keep run directories here (default: a temp dir)")
    ap.add_argument("--trial-timeout", type=float, default=120.0)
    ap.add_argument("--verbose", action="store_true", help="one line per trial")
    ns = ap.parse_args()
    if ns.trials < 1 or ns.jobs < 1:
        ap.error("--trials and --jobs must be >= 1")
    plans = plan_trials(ns.trials, ns.seed)
    with tempfile.TemporaryDirectory(prefix="hicache-accuracy-") as tmp:
        root = ns.out or Path(tmp)
        if (root / "runs").exists():
            ap.error(f"--out {root} holds a campaign already; give an empty directory")
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        rows = run_campaign(plans, root, ns.jobs, ns.trial_timeout)
        report(rows, time.perf_counter() - t0, ns.verbose)


if __name__ == "__main__":
    main()
