"""Form A from the crash record, and how a hang verdict explains the stack tool it used."""

from __future__ import annotations

import json

import pytest

from hicache_diag.diagnosis.classify import classify_run
from hicache_diag.evidence.verdict import CrashForm, ExitCode, Outcome
from tests.unit.diagnosis.builder import RunDir, pyspy_dump

# What torch raises when view(N, -1, D) happened to divide and set_kv_buffer noticed instead.
BROADCAST_ERR = (
    "RuntimeError: shape mismatch: value tensor of shape [192, 2, 16] cannot be broadcast to "
    "indexing result of shape [192, 4, 16]"
)


def _crash_line(rank: int, step: int, extend: int, proxy: int | None) -> str:
    return json.dumps(
        {
            "rank": rank,
            "pp": rank,
            "tp": 0,
            "step": step,
            "slot": step % 2,
            "rids": ["r9"],
            "forward_mode": "extend",
            "extend_num_tokens": extend,
            "prefix_len": {"r9": 0},
            "host_hit_len": {"r9": 0},
            "l3_hit_len": {},
            "crashed": True,
            "proxy_tokens": proxy,
            "error": BROADCAST_ERR,
            "must_agree": ["rids", "extend_num_tokens"],
            "t": 1000.5,
        }
    )


def _crashed_run(tmp_path, extend: int, proxy: int | None):
    rd = RunDir(tmp_path)
    rd.crash(1, 4, BROADCAST_ERR, t=1000.05)  # rank 1 wrote steps 0..4, then raised in step 5
    rd.stop_at[0] = 4  # PP0 never recorded step 5 either: only the crash record can tell
    root = rd.write()
    with open(root / "rank1.jsonl", "a") as fh:
        fh.write(_crash_line(1, 5, extend, proxy) + "\n")
    return root


def test_later_shape_error_with_a_received_token_mismatch_is_form_a(tmp_path):
    v = classify_run(_crashed_run(tmp_path, extend=192, proxy=96))
    assert (v.outcome, v.form, v.failed_rank) == (Outcome.CRASH, CrashForm.A, 1)
    assert v.exit_code is ExitCode.FORM_A
    assert any("computed 192 tokens but received 96" in line for line in v.evidence)


def test_crash_record_with_equal_counts_is_not_form_a(tmp_path):
    v = classify_run(_crashed_run(tmp_path, extend=96, proxy=96))
    assert (v.outcome, v.form) == (Outcome.CRASH, None)


def test_crash_record_without_upstream_tensor_is_not_form_a(tmp_path):
    v = classify_run(_crashed_run(tmp_path, extend=96, proxy=None))
    assert v.form is None


def _hang(rd: RunDir) -> RunDir:
    rd.launcher["hang"] = {
        "detected_at": 9,
        "last_progress": {"0": 5.0, "1": 5.0},
        "stalled_ranks": [0, 1],
    }
    return rd


def test_hang_with_faulthandler_fallback_says_why_py_spy_failed(tmp_path):
    rd = _hang(RunDir(tmp_path))
    rd.launcher["stacks"] = {"tool": "faulthandler", "error": "rank0: py-spy not installed"}
    text = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/x/hicache_diag/engines/builtin/runtime/ps.py", line 4 in recv_dict_from_prev\n'
    )
    rd.stacks = dict.fromkeys((0, 1), text)
    v = classify_run(rd.write())
    assert v.form is CrashForm.C
    assert any("py-spy not installed" in line and "faulthandler" in line for line in v.evidence)
    assert {r.where for r in v.ranks} == {"recv_dict_from_prev (ps.py:4)"}


def test_empty_faulthandler_files_are_not_stacks(tmp_path):
    rd = _hang(RunDir(tmp_path))
    rd.launcher["stacks"] = {"tool": "faulthandler", "error": "ptrace denied"}
    rd.stacks = {0: pyspy_dump(("recv", "/x/hicache_diag/ps.py", 3))}
    root = rd.write()
    (root / "stacks" / "rank1.txt").write_text("")
    v = classify_run(root)
    assert {r.rank: r.where for r in v.ranks} == {0: "recv (ps.py:3)", 1: None}


DMA_THREAD = (
    "Thread 0x2 (most recent call first):\n"
    '  File "/x/hicache_diag/engines/builtin/runtime/managers/dma_engine.py", line 87 in _loop\n'
    '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n'
    "\n"
)
SCRIPT_MAIN = (
    "Thread 0x1 (most recent call first):\n"
    '  File "/x/hicache_diag/engines/builtin/runtime/distributed/ps.py", line 62 in _recv_bytes\n'
    '  File "/x/hicache_diag/engines/builtin/rank_main.py", line 9 in <module>\n'
)
# As a real rank forked from `python -m hicache_diag.cli.main run` writes it: the main thread
# starts in runpy, not at `<module>`.
FORKED_MAIN = (
    "Current thread 0x1 (most recent call first):\n"
    '  File "/x/hicache_diag/engines/builtin/runtime/distributed/parallel_state.py", '
    "line 71 in _recv_bytes\n"
    '  File "/x/hicache_diag/engines/builtin/runtime/managers/scheduler.py", '
    "line 59 in recv_requests\n"
    '  File "/x/hicache_diag/engines/builtin/rank_main.py", line 194 in <module>\n'
    '  File "<frozen runpy>", line 88 in _run_code\n'
    '  File "/x/cli/main.py", line 95 in <module>\n'
    '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
)


@pytest.mark.parametrize(
    ("main", "where"),
    [
        (SCRIPT_MAIN, "_recv_bytes (ps.py:62)"),
        (FORKED_MAIN, "_recv_bytes (parallel_state.py:71) <- recv_requests (scheduler.py:59)"),
    ],
)
def test_faulthandler_text_names_the_main_thread_not_the_first_block(tmp_path, main, where):
    rd = _hang(RunDir(tmp_path))
    rd.launcher["stacks"] = {"tool": "faulthandler", "error": "ptrace denied"}
    rd.stacks = dict.fromkeys((0, 1), DMA_THREAD + main)
    v = classify_run(rd.write())
    assert {r.where for r in v.ranks} == {where}
