"""Hang cause and culprit from per-rank wait sites (no processes: RankReports built directly)."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.triage.hang import classify_stacks
from hicache_diag.triage.report import RankReport


def rank(pp, tp, site, kind, progressed=False, caller="event_loop_pp"):
    r = RankReport(RankId(pp=pp, tp=tp), 100 + pp * 10 + tp, None, "r", "blocked", site)
    r.wait_kind, r.progressed, r.frames = kind, progressed, [f"{site} (x.py)"]
    r.call_path = (site, caller)
    return r


def test_tp_deadlock_names_the_odd_rank_at_the_hicache_site():
    ranks = [rank(0, 0, "hicache-tp-allreduce", "hicache-comm")]
    ranks += [rank(0, t, "request-broadcast", "request") for t in (1, 2, 3)]
    f = classify_stacks(ranks, hang_hint=False)
    assert (f.kind, f.cause) == ("hang", "protocol-deadlock")
    assert [c.rank for c in f.culprits] == [RankId(pp=0, tp=0)]


def test_hicache_local_wait_beats_a_hicache_comm_wait():
    ranks = [
        rank(0, 0, "hicache-pp-sync-drain", "hicache-comm"),
        rank(1, 0, "storage-queue-get", "hicache-local"),
    ]
    f = classify_stacks(ranks, hang_hint=False)
    assert f.culprits[0].rank == RankId(pp=1, tp=0)


def test_symmetric_waits_are_a_network_suspect():
    same = [rank(0, t, "nccl-collective", "collective") for t in range(4)]
    assert classify_stacks(same, False).cause == "network-suspect"
    hicache_same = [rank(0, t, "hicache-tp-allreduce", "hicache-comm") for t in range(2)]
    f = classify_stacks(hicache_same, False)
    assert (f.kind, f.cause, f.culprits) == ("hang", "network-suspect", [])
    send_recv = [rank(0, 0, "pp-send", "p2p"), rank(1, 0, "pp-proxy-recv", "p2p")]
    assert classify_stacks(send_recv, False).cause == "network-suspect"


def test_different_collectives_are_a_protocol_deadlock():
    ranks = [rank(0, 0, "nccl-collective", "collective")]
    ranks += [rank(0, t, "request-broadcast", "request") for t in (1, 2)]
    f = classify_stacks(ranks, False)
    assert f.cause == "protocol-deadlock" and f.culprits[0].rank == RankId(pp=0, tp=0)


def test_straggler_outside_communication():
    ranks = [rank(0, 0, "pp-proxy-recv", "p2p"), rank(1, 0, "local-wait", "other")]
    f = classify_stacks(ranks, hang_hint=True)
    assert (f.kind, f.cause, f.culprits[0].rank) == ("hang", "straggler", RankId(pp=1, tp=0))


def test_progress_means_busy_and_idle_means_healthy():
    moving = [rank(0, 0, "forward", "compute", True), rank(1, 0, "pp-proxy-recv", "p2p", True)]
    assert classify_stacks(moving, False).kind == "busy"
    idle = [rank(0, 0, "idle-loop", "idle"), rank(1, 0, "request-recv", "request")]
    assert classify_stacks(idle, False).kind == "healthy"
    assert classify_stacks(idle, hang_hint=True).kind == "hang"
    assert classify_stacks([], False) is None


def test_same_hicache_site_from_different_callers_is_a_mismatch():
    # #30760: TP0 votes in can_terminate_prefetch while its peers vote in writing_check
    ranks = [rank(0, 0, "hicache-tp-allreduce", "hicache-comm", caller="can_terminate_prefetch")]
    ranks += [
        rank(0, t, "hicache-tp-allreduce", "hicache-comm", caller="writing_check") for t in (1, 2)
    ]
    f = classify_stacks(ranks, hang_hint=False)
    assert (f.cause, [c.rank for c in f.culprits]) == ("protocol-deadlock", [RankId(pp=0, tp=0)])


def test_one_snapshot_of_an_idle_pp_cluster_flushing_a_send_is_healthy():
    ranks = [rank(0, 0, "pp-send", "p2p", None), rank(1, 0, "request-recv", "request", None)]
    assert classify_stacks(ranks, hang_hint=False).kind == "healthy"
    assert classify_stacks(ranks, hang_hint=True).kind == "hang"


def test_everyone_computing_while_logs_time_out_is_a_hang():
    ranks = [rank(0, 0, "forward", "compute"), rank(1, 0, "forward", "compute")]
    assert classify_stacks(ranks, hang_hint=False).kind == "busy"
    assert classify_stacks(ranks, hang_hint=True).kind == "hang"


def test_busy_pipeline_is_not_a_straggler_but_a_sleeping_rank_is():
    multi = [rank(0, 0, "forward", "compute"), rank(1, 0, "pp-proxy-recv", "p2p")]
    f = classify_stacks(multi, hang_hint=False)
    assert (f.kind, f.cause) == ("busy", None)
    sleeping = [rank(0, 0, "local-wait", "other", True), rank(1, 0, "pp-proxy-recv", "p2p")]
    f = classify_stacks(sleeping, hang_hint=False)
    assert (f.kind, f.cause, f.culprits[0].rank) == ("busy", "straggler", RankId(pp=0, tp=0))
    # CI, a busy real server: both ranks moved, PP1 was caught outside communication last
    flowing = [rank(0, 0, "pp-proxy-recv", "p2p", True), rank(1, 0, "local-wait", "other", True)]
    f = classify_stacks(flowing, hang_hint=False)
    assert (f.kind, f.cause, f.culprits) == ("busy", None, [])
    # a working stage caught off-CPU once, in code the table does not name, while its peer
    # read the same recv twice: only a rank outside communication in every sample is held
    once = rank(1, 0, "local-wait", "other", True)
    once.sample_kinds = ("compute", "other")
    f = classify_stacks([rank(0, 0, "pp-proxy-recv", "p2p"), once], hang_hint=False)
    assert (f.kind, f.cause, f.culprits) == ("busy", None, [])
    once.sample_kinds = ("other", "other")
    f = classify_stacks([rank(0, 0, "pp-proxy-recv", "p2p"), once], hang_hint=False)
    assert (f.kind, f.cause, f.culprits[0].rank) == ("busy", "straggler", RankId(pp=1, tp=0))


def test_sender_blocked_while_the_peer_waits_for_requests_is_a_slot_mismatch():
    # form C of our runtime (#34568): PP0 sends a proxy PP1 never expects
    ranks = [rank(0, 0, "pp-send", "p2p"), rank(1, 0, "request-recv", "request")]
    f = classify_stacks(ranks, hang_hint=False)
    assert (f.kind, f.cause, f.culprits[0].rank) == ("hang", "protocol-deadlock", RankId(pp=1))
