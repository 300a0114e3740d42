"""Issue 38 part 1: the framing of a log learned from the file itself, one unit case per kind of
miss the new corpus cases showed (samples/corpus/NEW-CASES-SCORE.md): an unknown per-line tag,
hard-wrapped lines, glued records, JSON-lines shippers, interleaved writers (torchrun, vLLM's
processes, two ranks' dumps shuffled by character), and what the report says it undid."""

from __future__ import annotations

import json
import random

from hicache_diag.logs.interleave import _Shuffle
from hicache_diag.logs.lines import normalise
from hicache_diag.logs.parse import parse_log_lines
from hicache_diag.logs.prefix import learn_prefix
from hicache_diag.triage.classify import classify

WATCHDOG = (
    "[rank14]:[E909 09:55:29.307629539 ProcessGroupNCCL.cpp:607] [Rank 14] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=2070, OpType=REDUCE) ran for 600034 "
    "milliseconds before timing out."
)
FORM_B = [
    "[2026-06-24 15:39:00 PP1 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2710, in run_scheduler_process',
    "    scheduler.event_loop_pp()",
    '  File "/sgl/python/sglang/srt/mem_cache/hiradix_cache.py", line 301, in writing_check',
    "    self.ack_write_queue.pop(0)",
    "IndexError: pop from empty list",
]


def verdict(lines: list[str]):
    report = classify([], parse_log_lines(lines, "x.log"))
    return report.kind, report.form, report.culprit.rank.label if report.culprit else None


def test_an_unknown_runner_tag_is_learned_stripped_and_reported():
    tag = "dinov2-giant-nodes.cn-d00{n}.nolog [stderr] "
    lines = [tag.format(n=i % 2) + s for i, s in enumerate(FORM_B * 3)]
    learned = learn_prefix(lines)
    assert learned is not None and learned.fields == 2
    ev = parse_log_lines(lines, "tagged.log")
    assert verdict(lines) == verdict(FORM_B) == ("crash", "B", "PP1 TP0")
    assert any("2-field prefix" in f and "100%" in f for f in ev.framing)


def test_the_learned_prefix_keeps_a_traceback_indent_and_stops_at_the_message():
    # The wrapper's own blank is one; the rest of the indent is the code line's.
    lines = [f"job=77 seq={i:05d} | {s}" for i, s in enumerate(FORM_B)]
    out = list(normalise(lines))
    assert out[2] == "    scheduler.event_loop_pp()" and out[1].startswith('  File "')
    # A message word shared by every line (a template) is never taken for a field.
    same = [f"Avg prompt throughput: {i}.0 tokens/s" for i in range(20)]
    assert learn_prefix(same) is None


def test_a_prefix_that_names_a_rank_keeps_it_as_a_label():
    body = ["Scheduler hit an exception: Traceback (most recent call last):", *FORM_B[1:]]
    lines = [f"pod-{i:04d} TP3 > {s}" for i, s in enumerate(body)]
    assert verdict(lines) == ("crash", "B", "PP0 TP3")
    assert verdict([f"pod-{i:04d} main > {s}" for i, s in enumerate(body)])[2] is None


def test_a_wrap_at_any_width_is_joined_where_every_line_carries_a_prefix():
    prefix = "(Worker_TP10 pid=281) ERROR 01-31 10:15:44 [multiproc_executor.py:822] "
    body = FORM_B[1:]
    lines = []
    for s in body:
        full = prefix + s
        lines += [full[:97], full[97:]] if len(full) > 97 else [full]
    assert verdict(lines)[0] == "crash"
    assert verdict(lines)[2] == "PP0 TP10"


def test_glued_records_split_at_their_own_stamps_and_markers():
    tqdm = "  1%|          | 24/1752 [01:08<1:22:56,  2.88s/it]"
    assert verdict([tqdm + WATCHDOG])[:2] == ("hang", "C")
    vllm = "INFO 01-22 18:27:20 metrics.py:449] Avg prompt throughput: 0.0 tokens/s, "
    vllm += "Avg generation throughput: 41.7 tokens/s, Running: 1 reqs, Pending: 0 reqs"
    out = list(normalise([vllm + FORM_B[0] + " " + " ".join(FORM_B[1:])]))
    assert out[0].startswith("INFO 01-22") or out[0].startswith("Avg prompt")
    assert any(line.startswith("[2026-06-24 15:39:00 PP1 TP0]") for line in out)
    assert "IndexError: pop from empty list" in out


def test_json_lines_shippers_are_decoded_field_by_field_with_escaped_ansi():
    shapes = (
        lambda s: {"log": s + "\n", "stream": "stderr", "time": "2026-06-24T17:38:03Z"},
        lambda s: {"date": 1719250683.0, "log": s},
        lambda s: {"log": s + "\n", "kubernetes": {"pod_name": "sgl-0"}},
        lambda s: {"textPayload": s, "severity": "ERROR"},
        lambda s: {"line": s, "labels": {"app": "sglang"}},
        lambda s: {"MESSAGE": s, "_PID": "42"},
        lambda s: {"jsonPayload": {"message": s}},
    )
    for shape in shapes:
        lines = [json.dumps(shape(f"\x1b[31m{s}\x1b[0m")) for s in FORM_B]
        assert verdict(lines) == ("crash", "B", "PP1 TP0"), shape
    ev = parse_log_lines([json.dumps(shapes[0](s)) for s in FORM_B], "d.log")
    assert any("docker / containerd json-file" in f for f in ev.framing)


def test_dockers_record_of_a_long_line_split_in_two_is_joined():
    first, second = WATCHDOG[:60], WATCHDOG[60:]
    lines = [json.dumps({"log": first}), json.dumps({"log": second + "\n"})]
    lines += [json.dumps({"log": "x\n"})] * 3
    assert WATCHDOG.split("]:", 1)[1] in "".join(normalise(lines))


def test_double_torchrun_prefixes_and_vllm_process_prefixes_are_peeled():
    assert verdict(["[rank0]:[rank4]:" + WATCHDOG.split("]:", 1)[1]])[:2] == ("hang", "C")
    worker = "(Worker_TP10 pid=281) ERROR 01-31 10:15:44 [multiproc_executor.py:822] "
    assert verdict([worker + s for s in FORM_B[1:]])[::2] == ("crash", "PP0 TP10")
    engine = "(EngineCore_DP0 pid=7630) ERROR 01-31 10:15:44 [core.py:1] "
    assert verdict([engine + s for s in FORM_B[1:]])[2] is None  # the engine core is no rank


def _shuffle(block: str, seed: int) -> str:
    rng = random.Random(seed)
    pos, turn, out = [0, 0], 0, []
    while pos[0] < len(block) or pos[1] < len(block):
        turn ^= rng.random() < 0.05
        if pos[turn] >= len(block):
            turn ^= 1
        out.append(block[pos[turn]])
        pos[turn] += 1
        turn ^= 1
    return "".join(out)


FAULT = (
    "Fatal Python error: Segmentation fault\n\n"
    "Thread 0x00007f3a2c1ff640 (most recent call first):\n"
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1987 in event_loop_normal\n'
    '  File "/usr/lib/python3.10/threading.py", line 953 in run\n'
)


def test_two_ranks_dumps_shuffled_by_character_read_back_as_their_text():
    for seed in range(20):
        mixed = _shuffle(FAULT, seed)
        reading = _Shuffle()
        assert reading.feed(mixed) and reading.whole
        assert reading.text() == FAULT
    lines = ["[2026-06-24 15:39:00 TP0] serving", *_shuffle(FAULT, 3).rstrip("\n").split("\n")]
    ev = parse_log_lines([*lines, "[2026-06-24 15:39:01 TP0] after"], "x")
    assert any(e.exc_type == "Fatal Python error" for e in ev.exceptions)
    assert any("two writers interleaved" in f for f in ev.framing)


def test_line_endings_nul_holes_and_blank_floods_from_a_file(tmp_path):
    from hicache_diag.logs.files import parse_log_file

    text = "\n".join(FORM_B) + "\n"
    cases = {
        "cr.log": text.replace("\n", "\r").encode(),
        "nul.log": (FORM_B[0] + "\n").encode() + b"\x00" * 3000 + "\n".join(FORM_B[1:]).encode(),
        "blank.log": ("\n" * 300_000 + text + "\n" * 300_000).encode(),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        ev = parse_log_file(tmp_path / name)
        report = classify([], ev)
        assert (report.kind, report.form) == ("crash", "B"), name
    blank = parse_log_file(tmp_path / "blank.log")
    assert blank.lines == 600_000 + len(FORM_B)
    assert blank.exceptions[0].lineno == 300_001  # blank lines count, as lines
    assert any("CR-only" in f for f in parse_log_file(tmp_path / "cr.log").framing)


def test_two_incidents_weeks_apart_are_not_joined():
    early = ["[2026-05-01 10:00:00 TP0] RuntimeError: an old failure, since fixed"]
    late = [s.replace("2026-06-24", "2026-06-09") for s in FORM_B]
    ev = parse_log_lines(early + late, "x")
    assert [e.exc_type for e in ev.exceptions] == ["IndexError"]
    assert any("earlier incident" in n for n in ev.notes)
    assert verdict(early + late)[:2] == ("crash", "B")
