"""Run and triage name the same culprit for the same stacks and process facts (rules/culprit.py).

Each case is one run directory: launcher.json's hang record (the process facts) and stacks/.
`run` judges it as `hicache-diag run` does at the end of a trial (classify_run); `triage` reads
the same directory as `hicache-diag triage --dumps RUN` does (run_triage)."""

from __future__ import annotations

import pytest

from hicache_diag.diagnosis import checks, classify_run
from hicache_diag.diagnosis.load import load_run
from hicache_diag.evidence.verdict import Outcome
from hicache_diag.rules.culprit import Reason
from hicache_diag.triage.session import TriageRequest, run_triage
from tests.unit.diagnosis.builder import RunDir, pyspy_dump

_MGR = "/x/sglang/srt/managers/scheduler_pp_mixin.py"
_CACHE = "/x/sglang/srt/mem_cache/hiradix_cache.py"
_C10D = "/t/torch/distributed/distributed_c10d.py"

P2P_RECV = pyspy_dump(
    ("recv", _C10D, 10),
    ("recv_tensor_dict", "/x/parallel_state.py", 9),
    ("_pp_recv_proxy_tensors", _MGR, 40),
    ("event_loop_pp", _MGR, 3),
)
P2P_SEND = pyspy_dump(
    ("send", _C10D, 10),
    ("send_tensor_dict", "/x/parallel_state.py", 9),
    ("_pp_send_dict_to_next_stage", _MGR, 44),
    ("event_loop_pp", _MGR, 3),
)
ASLEEP = pyspy_dump(
    ("sleep", "/x/sglang/srt/managers/scheduler.py", 70), ("event_loop_pp", _MGR, 3)
)
STORAGE_WAIT = pyspy_dump(
    ("get", "/usr/lib/python3.12/queue.py", 171),
    ("check_prefetch_progress", _CACHE, 500),
    ("event_loop_pp", _MGR, 3),
)
ACK_WAIT = pyspy_dump(
    ("synchronize", "/t/torch/cuda/streams.py", 5),
    ("writing_check", _CACHE, 300),
    ("event_loop_pp", _MGR, 3),
)
ALL_REDUCE = pyspy_dump(
    ("all_reduce", _C10D, 20), ("forward", "/x/model.py", 4), ("event_loop_pp", _MGR, 3)
)
EXITING = pyspy_dump(("_shutdown", "/usr/lib/python3.12/threading.py", 1590))
TP_VOTE = pyspy_dump(
    ("all_reduce", _C10D, 20), ("writing_check", _CACHE, 310), ("event_loop_pp", _MGR, 3)
)

# name: (stacks by rank, launcher facts by rank, the culprit both must name, or None)
CASES = {
    "outside-any-wait": ({0: P2P_RECV, 1: ASLEEP}, {}, 1),
    "hicache-local-storage-wait": ({0: P2P_RECV, 1: STORAGE_WAIT}, {}, 1),
    "hicache-local-ack-wait": ({0: ACK_WAIT, 1: P2P_RECV}, {}, 0),
    # The two old rules parted here: run's rank outside any wait counted a HiCache-local wait,
    # triage's did not (the sleeping rank is the one the others wait on).
    "hicache-local-beside-a-sleeper": ({0: STORAGE_WAIT, 1: ASLEEP, 2: P2P_RECV}, {}, 1),
    "hicache-sync-only-one-rank-at": ({0: TP_VOTE, 1: P2P_RECV}, {}, 0),
    "exited-by-launcher": ({0: P2P_RECV}, {1: "exited"}, 1),
    "exited-post-mortem-stack": ({0: P2P_RECV, 1: EXITING}, {}, 1),
    "stopped": ({0: TP_VOTE}, {1: "stopped"}, 1),
    "p2p-send-and-recv": ({0: P2P_SEND, 1: P2P_RECV}, {}, None),
    "same-collective": ({0: ALL_REDUCE, 1: ALL_REDUCE}, {}, None),
}


def _run_dir(tmp_path, stacks, facts):
    world = max([*stacks, *facts]) + 1
    rd = RunDir(tmp_path / "run", world=world)
    stalled = [r for r in range(world) if facts.get(r) != "exited"]
    rd.launcher["hang"] = {
        "detected_at": 1010.0,
        "stalled_ranks": stalled,
        "last_progress": {str(r): 1005.0 for r in stalled},
        "stopped_ranks": [r for r, f in facts.items() if f == "stopped"],
        "proc_status": {str(r): facts.get(r, "sleeping") for r in stalled},
    }
    for e in rd.launcher["ranks"]:
        e["state"] = "exited" if facts.get(e["rank"]) == "exited" else "hung"
        e["exitcode"] = 0 if e["state"] == "exited" else -9
    rd.stacks = dict(stacks)
    return rd.write()


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_and_triage_name_the_same_culprit(tmp_path, name):
    stacks, facts, want = CASES[name]
    run_dir = _run_dir(tmp_path, stacks, facts)
    run = load_run(run_dir)
    named = checks.hang_rank(run, run.launcher.hang)
    verdict = classify_run(run_dir)
    triaged = run_triage(TriageRequest(dumps=(run_dir,)))
    culprit = triaged.culprit
    triage_rank = culprit.rank.flat(1) if culprit is not None else None
    assert verdict.outcome is Outcome.HANG
    if want is None:  # no rank stands out: neither names one from the stacks
        assert named.reason is Reason.NONE and triage_rank is None, (named, triaged.evidence)
        assert triaged.cause == "network-suspect"
        return
    assert (named.rank, verdict.failed_rank, verdict.culprit_rank, triage_rank) == (want,) * 4, (
        named,
        verdict.evidence,
        triaged.evidence,
    )
    assert named.reason is not Reason.NONE
