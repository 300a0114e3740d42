"""The accuracy campaign's parts (bench/accuracy.py): random plans, blinding, oracle facts and
scoring, on synthetic run directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from campaign.plan import Facts, blind_copy, plan_trials, run_facts  # noqa: E402
from campaign.score import Scored, confusion, summarize  # noqa: E402

from hicache_diag.faults import validate_faults  # noqa: E402


def test_plans_are_reproducible_valid_and_span_the_asked_ranges():
    plans = plan_trials(80, seed=3)
    assert plans == plan_trials(80, seed=3) and plans != plan_trials(80, seed=4)
    assert {p.pp for p in plans} == {2, 3, 4} and {p.tp for p in plans} == {1, 2}
    assert {p.async_depth for p in plans} == {0, 1}
    assert {"legacy", "l2", "full"} <= {p.preset for p in plans}
    assert any(len(p.targets) == 2 for p in plans)
    for p in plans:
        validate_faults([p.fault], pp_size=p.pp, tp_size=p.tp)  # raises on a bad spec
        assert all(0 <= r < p.pp * p.tp for r in p.targets)


def test_absorbed_follows_the_faults_switch():
    plans = plan_trials(200, seed=1)
    for p in plans:
        if p.kind == "host-alloc-fail":
            assert p.absorbed() == (p.modes()["host-alloc"] == "two-phase")
        if p.kind == "rank-stall":
            assert p.absorbed() == (
                p.modes()["ack-count"] != "local"
                and p.modes()["lru-clock"] == "logical"
                and p.modes()["l3-hit"] == "min"
                and p.modes()["l3-progress"] == "min"
            )


def test_control_argv_drops_only_the_fault(tmp_path):
    p = plan_trials(1, seed=0)[0]
    full, control = p.argv(tmp_path), p.argv(tmp_path, control=True)
    assert "--fault" in full and "--fault" not in control
    assert [a for a in full if a not in ("--fault", p.fault)] == control


def _run_dir(root: Path) -> Path:
    root.mkdir()
    (root / "manifest.json").write_text(
        json.dumps(
            {
                "faults": ["host-alloc-fail:rank=1"],
                "argv": ["run", "--fault", "host-alloc-fail"],
                "seed": 3,
                "config": {"faults": ["host-alloc-fail:rank=1"], "seed": 3},
            }
        )
    )
    lines = [
        {"rank": 1, "step": 0, "faults_fired": []},
        {"rank": 1, "step": 1, "faults_fired": [{"fault": "host-alloc-fail", "step": 1}]},
    ]
    (root / "rank1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (root / "rank0.jsonl").write_text(json.dumps({"rank": 0, "step": 0}) + "\n")
    (root / "rank1.log").write_text(
        "[t PP1 TP0] faults on PP1 TP0 (rank 1): ['host-alloc-fail']\n"
        "[t PP1 TP0] rank 1 up: layers [3, 4], faults ['host-alloc-fail']\n"
        "[t PP1 TP0] Scheduler hit an exception: Traceback\n"
        "IndexError: pop from empty list\n"
    )
    (root / "rank0.log").write_text("[t PP0 TP0] rank-stall: stalling 100 ms at step 5\n")
    (root / "launcher.json").write_text(
        json.dumps({"hang": None, "first_failure": {"rank": 1, "t": 1.0}})
    )
    (root / "verdict.json").write_text("{}")
    return root


def test_blind_copy_removes_every_trace_of_the_injection(tmp_path):
    blind = blind_copy(_run_dir(tmp_path / "run"), tmp_path / "blind")
    text = "".join(p.read_text() for p in blind.rglob("*") if p.is_file())
    assert "host-alloc-fail" not in text and "faults_fired" not in text
    assert "rank-stall" not in text and not (blind / "verdict.json").exists()
    assert (
        "pop from empty list" in text
        and json.loads((blind / "manifest.json").read_text())["seed"] == 3
    )


def test_facts_come_from_the_unblinded_run(tmp_path):
    facts = run_facts(_run_dir(tmp_path / "run"))
    assert facts.fired_ranks == [0, 1] and facts.first_fired_step == 1 and facts.form == "B"


def _scored(
    kind="host-alloc-fail", targets=(1,), control="ok", fired=(1,), verdict=None, control_step=None
) -> Scored:
    plan = next(p for p in plan_trials(300, seed=5) if p.kind == kind)
    plan = type(plan)(
        **{**{f: getattr(plan, f) for f in plan.__dataclass_fields__}, "targets": targets}
    )
    verdict = verdict or {
        "outcome": "crash",
        "form": "B",
        "culprit_rank": 1,
        "source": "host-alloc",
        "step": 9,
    }
    return Scored(plan, Facts(list(fired), 3, "B"), control, verdict, True, control_step)


def test_ambiguous_reasons_and_the_accuracy_line():
    rows = [
        _scored(),
        _scored(
            verdict={
                "outcome": "crash",
                "form": "B",
                "culprit_rank": 0,
                "source": "unknown",
                "step": 9,
            }
        ),
        _scored(targets=(0, 1)),
        _scored(control="diverged"),
        _scored(fired=()),
        _scored(verdict={"outcome": "ok", "form": None, "culprit_rank": None, "source": None}),
        _scored(kind="p2p-delay"),
    ]
    reasons = [r.ambiguous for r in rows]
    assert reasons == [
        None,
        None,
        "two ranks perturbed",
        "fails without the fault too",
        "fault never fired",
        "fault never mattered (ok)",
        "timing-only fault (no per-rank input of its own)",
    ]
    s = summarize(rows)
    assert s.last_line().startswith("accuracy: culprit 1/2, source 1/2, form ")
    labels, cols, cells = confusion(rows, "source")
    assert labels == ["host-alloc"] and cells[("host-alloc", "unknown")] == 1


def test_fault_first_needs_the_run_to_diverge_before_its_control():
    early = _scored(control="diverged", control_step=20)
    late = _scored(control="diverged", control_step=5)
    assert early.fault_first and not late.fault_first
    assert summarize([early, late]).fault_first == 1
