"""classify(): crash first, then stacks, then logs alone; exits, merged log dumps, exit codes."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import Frame, RankDump, ThreadStack
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.triage.classify import classify
from hicache_diag.triage.hang import RankSamples


def samples(pp: int, *names: str, error: str | None = None) -> RankSamples:
    frames = tuple(Frame(n, "x.py", 1) for n in names)
    dump = RankDump(RankId(pp=pp), 10 + pp, None, [ThreadStack("MainThread", False, frames)])
    return RankSamples(RankId(pp=pp), 10 + pp, None, [dump], error=error)


def test_rank_that_died_between_samples_is_the_crash_culprit():
    ranks = [
        samples(0, "recv", "recv_tensor_dict", "event_loop_pp"),
        samples(1, "forward", error="no such process: 11"),
    ]
    report = classify(ranks)
    assert (report.kind, report.culprit.rank) == ("crash", RankId(pp=1))
    assert int(report.exit_code) == 16  # a crash of another form (docs/design.md §4)


def test_subprocess_watchdog_line_alone_is_a_crash_elsewhere():
    line = "[2026-01-01 00:00:00] Subprocess scheduler_0 (pid=5) crashed with exit code -6."
    report = classify([], parse_log_lines([line], "x"))
    assert report.kind == "crash" and "root crash is elsewhere" in report.evidence[0]


def test_log_dumps_become_samples_and_hang_lines_evidence():
    lines = [
        "[2026-01-01 00:00:00 PP1 TP0] Pyspy dump for PID 7 (py-spy dump --pid 7):",
        'Thread 7 (idle): "MainThread"',
        "    synchronize (sglang/srt/managers/cache_controller.py:10)",
        "    writing_check (sglang/srt/mem_cache/hiradix_cache.py:618)",
        "[2026-01-01 00:00:00 PP0 TP0] Pyspy dump for PID 6 (py-spy dump --pid 6):",
        'Thread 6 (idle): "MainThread"',
        "    recv (torch/distributed/distributed_c10d.py:1)",
        "    recv_tensor_dict (sglang/srt/distributed/parallel_state.py:1)",
        "[2026-01-01 00:00:01 PP1 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300)",
    ]
    report = classify([], parse_log_lines(lines, "x"))
    assert (report.kind, report.cause) == ("hang", "protocol-deadlock")
    assert report.culprit.pid == 7 and report.culprit.wait_site == "ack-event-synchronize"
    assert any(e.startswith("log: x:9") for e in report.evidence)
    assert int(report.exit_code) == 12


def test_symmetric_hicache_sync_hints_at_call_counts():
    ranks = [samples(p, "all_reduce", "_all_reduce_attn_groups", "writing_check") for p in (0, 1)]
    report = classify(ranks)
    assert (report.kind, report.cause) == ("hang", "network-suspect")
    assert "#30760" in report.next_steps[0]
