"""py-spy text / JSON and faulthandler stacks parse into one model."""

from __future__ import annotations

import json

import pytest

from hicache_diag.evidence.ranks import RankId
from hicache_diag.evidence.stacks import parse_dump_text

PYSPY_TEXT = """Process 4102: sglang::scheduler_PP1_TP0
Python v3.12.3 (/usr/bin/python3.12)

Thread 4102 (idle): "MainThread"
    c10d::ProcessGroupGloo::RecvWork::wait (libtorch_cpu.so)
    recv (torch/distributed/distributed_c10d.py:2577)
    _pp_sync (sglang/srt/mem_cache/hiradix_cache.py:269)
Thread 4113 (active): "Thread-4 (prefetch_thread_func)"
    get (queue.py:180)
"""


def test_pyspy_text_threads_frames_and_rank():
    [dump] = parse_dump_text(PYSPY_TEXT, "x")
    assert (dump.pid, dump.rank) == (4102, RankId(pp=1, tp=0))
    main = dump.main_thread()
    assert main.name == "MainThread" and main.active is False
    assert [f.name for f in main.frames] == [
        "c10d::ProcessGroupGloo::RecvWork::wait",
        "recv",
        "_pp_sync",
    ]
    assert main.frames[1].line == 2577 and main.frames[0].line == 0
    assert dump.threads[1].active is True


def test_several_processes_in_one_text():
    two = PYSPY_TEXT + PYSPY_TEXT.replace("4102", "4103").replace("PP1_TP0", "PP1_TP1")
    dumps = parse_dump_text(two, "x")
    assert [d.rank for d in dumps] == [RankId(pp=1, tp=0), RankId(pp=1, tp=1)]


def test_pyspy_json_list_and_envelope():
    threads = [
        {
            "pid": 7,
            "thread_name": "MainThread",
            "active": False,
            "frames": [{"name": "recv", "filename": "/t/distributed_c10d.py", "line": 3}],
        }
    ]
    [bare] = parse_dump_text(json.dumps(threads), "x")
    assert bare.pid == 7 and bare.rank is None and bare.main_thread().frames[0].name == "recv"
    env = {"pid": 7, "title": "sglang::scheduler_PP0_TP2", "threads": threads}
    [wrapped] = parse_dump_text(json.dumps(env), "x")
    assert wrapped.rank == RankId(pp=0, tp=2)


SIGNALLED_MAIN = (  # the signal landed on the main thread: faulthandler calls it "Current"
    "Thread 0x00007f1 (most recent call first):\n"
    '  File "/x/queue.py", line 180 in get\n'
    "\n"
    "Current thread 0x00007f2 (most recent call first):\n"
    '  File "/x/hiradix_cache.py", line 618 in writing_check\n'
    '  File "/x/scheduler.py", line 10 in event_loop_pp\n'
)
SIGNALLED_OTHER = (  # SIGUSR1 on the DMA thread; the main thread starts at runpy's entry
    "Current thread 0x00007f1 (most recent call first):\n"
    '  File "/x/queue.py", line 171 in get\n'
    '  File "/x/threading.py", line 1002 in _bootstrap\n'
    "\n"
    "Thread 0x00007f2 (most recent call first):\n"
    '  File "/x/parallel_state.py", line 71 in _recv_bytes\n'
    '  File "/x/cli/main.py", line 95 in <module>\n'
    '  File "<frozen runpy>", line 198 in _run_module_as_main\n'
)


@pytest.mark.parametrize(
    ("text", "innermost", "names"),
    [
        (SIGNALLED_MAIN, "writing_check", [None, "MainThread"]),
        (SIGNALLED_OTHER, "_recv_bytes", [None, "MainThread"]),
    ],
)
def test_faulthandler_fallback_names_the_main_thread(text, innermost, names):
    [dump] = parse_dump_text(text, "x")
    assert dump.main_thread().frames[0].name == innermost
    assert [t.name for t in dump.threads] == names


def test_garbage_gives_nothing():
    assert parse_dump_text("hello\nworld\n", "x") == []
    assert parse_dump_text("{not json", "x") == []
    assert parse_dump_text('{"a": 1}', "x") == []


def test_locals_are_not_frames_and_json_lines_parse():
    text = PYSPY_TEXT.replace(
        "    recv (torch/distributed/distributed_c10d.py:2577)\n",
        "    recv (torch/distributed/distributed_c10d.py:2577)\n"
        "        Arguments:\n            tensor (x): <Tensor at 0x7f>\n",
    )
    [dump] = parse_dump_text(text, "x")
    assert [f.name for f in dump.main_thread().frames][1:] == ["recv", "_pp_sync"]
    thread = {"thread_name": "MainThread", "frames": [{"name": "f", "filename": "a", "line": 1}]}
    lines = "\n".join(
        json.dumps({"pid": p, "title": f"PP{p}", "threads": [thread]}) for p in (0, 1)
    )
    assert [d.pid for d in parse_dump_text(lines, "x")] == [0, 1]


def test_unnamed_main_thread_found_by_os_thread_id():
    def th(tid, name):
        frames = [{"name": name, "filename": "a.py", "line": 1}]
        return {"pid": 50, "thread_name": None, "os_thread_id": tid, "frames": frames}

    [dump] = parse_dump_text(json.dumps([th(51, "worker"), th(50, "event_loop_pp")]), "x")
    assert dump.main_thread().frames[0].name == "event_loop_pp"
