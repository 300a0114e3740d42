"""Who printed each block (triage.emitters), per emitter kind: texts from public SGLang and
vLLM threads (public_emitters.py, provenance kept) through the whole reader and classifier,
and the attribution rule on its own. Only the death of what the serving loop needs is a crash;
a request handler's error the server survived, and a client's, are not."""

from __future__ import annotations

import pytest
from public_emitters import (
    BACKUP_THREAD_NAME,
    CASES,
    DETOKENIZER_SGLANG,
    HTTP_ASGI_SGLANG,
    VLLM_ENGINE_CORE_FATAL,
    VLLM_SHM_WAIT_SERVING,
    PublicCase,
)

from hicache_diag.logs.emitters import Emitter, ThreadRole, attribute, thread_role
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.rules.process_fate import pyspy_fate
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.classify import classify


def _triage(text: str, source: str = "server.log"):
    ev = parse_log_lines(text.splitlines(), source)
    return ev, classify([], ev)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.repo}#{c.number}")
def test_public_threads_name_their_emitter_and_keep_its_meaning(case: PublicCase):
    assert case.url.endswith(str(case.number)) and case.repo in case.url
    ev, report = _triage(case.text)
    assert report.kind == case.kind, (report.kind, report.evidence, report.reason)
    assert (report.emitter or "").startswith(case.emitter), report.emitter
    for exc in ev.exceptions:
        if case.emitter in ("http-server", "client"):
            assert exc.attribution.emitter.value == case.emitter
            assert exc.attribution.survived


def test_a_request_handlers_error_is_evidence_not_a_crash():
    _, report = _triage(HTTP_ASGI_SGLANG.text)
    assert report.kind == "unknown" and report.exit_code == 3
    assert "request handler" in (report.reason or "")


def test_a_handled_500_beside_a_live_server_is_named_in_the_evidence():
    text = HTTP_ASGI_SGLANG.text.replace(
        "[2025-06-11 06:19:30] ERROR:",
        "[2025-06-11 06:19:29 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 9\n"
        "[2025-06-11 06:19:30] ERROR:",
    )
    _, report = _triage(text)
    assert report.kind == "busy"
    assert any("answered and survived" in e for e in report.evidence)


def test_the_tokenizers_death_is_a_crash_of_the_tokenizer():
    ev, report = _triage(DETOKENIZER_SGLANG.text)
    assert [e.attribution.emitter for e in ev.exceptions] == [Emitter.TOKENIZER]
    assert report.kind == "crash" and report.emitter == "tokenizer"
    assert ev.exceptions[0].ts == "2025-08-15 14:25:48"  # the cut `[` restored


def test_vllm_engine_core_is_the_serving_loop():
    ev, _ = _triage(VLLM_ENGINE_CORE_FATAL.text)
    assert ev.exceptions and ev.exceptions[0].attribution.emitter is Emitter.SCHEDULER


def test_vllm_broadcast_wait_then_a_batch_is_no_hang():
    text = VLLM_SHM_WAIT_SERVING.text + (
        "INFO 04-18 01:09:10 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 9.0 tokens/s, Running: 1 reqs, Decode batch, #running-req: 1\n"
    )
    _, report = _triage(text)
    assert report.kind == "busy"


BACKUP_DEATH = f"""\
[2026-01-01 00:00:00 PP1 TP0] Decode batch, #running-req: 4, gen throughput (token/s): 12.0
Exception in thread {BACKUP_THREAD_NAME}:
"""


def test_a_thread_death_header_cut_off_still_names_the_thread_and_what_it_stops():
    ev, report = _triage(BACKUP_DEATH)
    assert report.kind == "crash" and report.culprit.rank.label == "PP1 TP0"
    assert report.emitter == f"scheduler thread {BACKUP_THREAD_NAME} (backup)"
    assert any("never written nor acked" in e and "hang ahead" in e for e in report.evidence)
    assert ev.exceptions[0].is_incomplete and ev.exceptions[0].thread == BACKUP_THREAD_NAME


def test_a_dead_backup_thread_and_a_watchdog_timeout_are_a_hang():
    text = BACKUP_DEATH + (
        "[2026-01-01 00:05:00 PP1 TP0] Scheduler watchdog timeout "
        "(self.watchdog_timeout=300, self.soft=False)\n"
    )
    _, report = _triage(text)
    assert (report.kind, report.form, report.culprit.rank.label) == ("hang", "C", "PP1 TP0")


@pytest.mark.parametrize(
    ("name", "frames", "role"),
    [
        ("Thread-8 (backup_thread_func)", [], ThreadRole.BACKUP),
        ("Thread-7 (prefetch_thread_func)", [], ThreadRole.PREFETCH),
        ("Thread-9 (prefetch_io_aux_func)", [], ThreadRole.STORAGE_IO),
        ("Thread-4 (prefetch_sync_thread_func)", [], ThreadRole.PREFETCH),
        ("hicache-load-enqueue", [], ThreadRole.LOAD),
        ("Thread-10 (watchdog_thread)", [], ThreadRole.WATCHDOG),
        ("Thread-3", ["_page_transfer", "prefetch_io_aux_func"], ThreadRole.STORAGE_IO),
        ("Thread-2 (_monitor)", [], ThreadRole.OTHER),
    ],
)
def test_thread_roles(name, frames, role):
    assert thread_role(name, frames) is role


def _who(**kw) -> Emitter:
    base = {"header": None, "thread": None, "frames": [], "files": [], "ranked": False}
    return attribute(**(base | kw)).emitter


def test_attribution_per_emitter_kind():
    srt = "/x/site-packages/sglang/srt/managers/"
    assert _who(scheduler=True) is Emitter.SCHEDULER
    assert _who(ranked=True, files=[srt + "scheduler.py"]) is Emitter.SCHEDULER
    assert _who(header="http", files=[srt + "tokenizer_manager.py"]) is Emitter.HTTP
    uvicorn = "/x/site-packages/uvicorn/protocols/http/h11_impl.py"
    assert _who(files=[uvicorn, srt + "tokenizer_manager.py"]) is Emitter.HTTP
    assert _who(files=[srt + "detokenizer_manager.py"]) is Emitter.TOKENIZER
    assert _who(header="tok") is Emitter.TOKENIZER
    assert _who(files=["/x/site-packages/openai/_base_client.py"]) is Emitter.CLIENT
    assert _who(header="client") is Emitter.CLIENT
    assert _who(files=["/x/sglang/launch_server.py"]) is Emitter.LAUNCHER
    assert _who(thread="Thread-8 (backup_thread_func)") is Emitter.SCHEDULER_THREAD
    assert _who() is Emitter.UNKNOWN


def test_a_client_traceback_beside_server_lines_is_still_the_clients():
    text = (
        "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 9\n"
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/openai/_base_client.py", line 1, in request\n'
        "openai.APIConnectionError: Connection error.\n"
    )
    _, report = _triage(text)
    assert report.kind == "busy"
    assert any("client program" in e for e in report.evidence)


@pytest.mark.parametrize(
    ("words", "fate"),
    [
        ("Error: Failed to suspend process", RankFate.STOPPED),
        ("waitpid returned Stopped(Pid(4242), SIGSTOP)", RankFate.STOPPED),
        ("Error: No such process (os error 3)", RankFate.EXITED),
        ("ptrace: ESRCH", RankFate.EXITED),
        ("Error: Permission denied (os error 13)", None),
        ("py-spy: command not found", None),
    ],
)
def test_pyspy_words_are_process_facts(words, fate):
    assert pyspy_fate(words) is fate


def _pyspy_failure(pid: int, words: str) -> str:
    return (
        "[2026-01-01 00:00:00 PP0 TP0] Decode batch, #running-req: 1\n"
        "[2026-01-01 00:00:01 PP1 TP0] Decode batch, #running-req: 1\n"
        f"[2026-01-01 00:05:00 PP1 TP0] Pyspy failed (py-spy dump --pid {pid}). Error: {words}\n"
        f"[2026-01-01 00:05:01 PP1 TP0] All pyspy dump attempts failed for PID {pid}.\n"
    )


def test_a_rank_pyspy_found_gone_is_a_crash_of_that_rank_not_a_missing_stack():
    _, report = _triage(_pyspy_failure(77, "No such process (os error 3)"))
    assert (report.kind, report.culprit.rank.label) == ("crash", "PP1 TP0")
    assert report.culprit.state == "exited"


def test_a_rank_pyspy_found_stopped_is_the_hangs_culprit():
    _, report = _triage(_pyspy_failure(77, "waitpid: Stopped(Pid(77), SIGSTOP)"))
    assert (report.kind, report.form, report.culprit.rank.label) == ("hang", "C", "PP1 TP0")
    assert report.signature == "unreadable (py-spy could not suspend it)"
