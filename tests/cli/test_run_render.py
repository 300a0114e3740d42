"""`run`'s live view and verdict panel, rendered from real objects into a recording console."""

from __future__ import annotations

import json

from rich.console import Console

from hicache_diag.cli.render.progress import LiveProgress, progress_table
from hicache_diag.cli.render.verdict import render_verdict
from hicache_diag.evidence.verdict import (
    CrashForm,
    DivergenceSource,
    FirstDivergence,
    Outcome,
    RankState,
    Verdict,
)
from hicache_diag.trials.hang_watch import HangWatch


def _text(renderable) -> str:
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()


def _line(step: int, fired: list[dict], queues: dict) -> str:
    return json.dumps({"step": step, "faults_fired": fired, "queues": queues}) + "\n"


def test_live_view_shows_step_queues_and_faults_per_rank(tmp_path):
    q = {"write_queue": 2, "load_queue": 1, "ack_write_queue": 5, "ack_load_queue": 3}
    (tmp_path / "rank0.jsonl").write_text(_line(0, [], q) + _line(1, [], q))
    dma = {"fault": "dma-delay", "step": 4}
    (tmp_path / "rank1.jsonl").write_text(
        _line(3, [dma], {}) + _line(4, [dma, {"fault": "host-alloc-fail"}], {})
    )
    watch = HangWatch(tmp_path, world_size=2, hang_timeout=5.0)
    watch.poll()
    text = _text(progress_table({"ranks": watch.snapshot(), "elapsed_s": 2.5}))
    assert "running  2.5 s" in text
    cells = [ln.replace("│", " ").split() for ln in text.splitlines()]
    rows = {c[0]: c for c in cells if c[:1] in (["0"], ["1"])}
    assert rows["0"][1] == "1" and rows["0"][5] == "2/1/5/3"
    assert rows["1"][1] == "4"
    assert "dma-delay x2" in text and "host-alloc-fail x1" in text


def test_live_view_keeps_the_faults_column_whole_at_80_columns():
    fired = {"dma-delay": 120, "host-alloc-fail": 33, "rank-stall": 4}
    snap = {"ranks": {r: {"step": 12345, "faults": fired} for r in range(4)}, "elapsed_s": 1.0}
    console = Console(record=True, width=80)
    console.print(progress_table(snap))
    text = console.export_text()
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    flat = " ".join(text.replace("│", " ").split())
    for word in ("dma-delay x120,", "host-alloc-fail x33,", "rank-stall x4"):
        assert word in flat, text


def test_live_view_shows_the_start_up_phase_before_any_rank_steps():
    snap = {"phase": "SGLang: loading the model", "elapsed_s": 7.4, "log": "/r/server.log"}
    text = _text(progress_table(snap))
    assert "SGLang: loading the model" in text and "7 s" in text and "/r/server.log" in text


def test_live_view_stays_off_when_stderr_is_not_a_terminal():
    console = Console(record=True, force_terminal=False)
    with LiveProgress(console, 2) as live:
        live.update({"ranks": {0: {"step": 1}}, "elapsed_s": 0.1})
    assert console.export_text() == ""


def test_verdict_panel_names_form_ranks_and_divergence():
    v = Verdict(
        Outcome.HANG,
        CrashForm.C,
        failed_rank=1,
        culprit_rank=1,
        signature="hang: no progress for the hang timeout; rank 1 waits",
        first_divergence=FirstDivergence(
            20, "acks_consumed", {"0": 3, "1": 0}, DivergenceSource.DMA_ACK_COUNT
        ),
        ranks=[RankState(1, 1, 0, 42, "blocked", "recv_requests (scheduler.py:59)")],
        evidence=[
            "rank 1 waits in recv_requests",
            "rank 0 secondary (cascade): RuntimeError: [/pytorch/gloo/pair.cc:553] Connection "
            "closed by peer [127.0.0.1]:902",
        ],
        seed=1,
        steps=21,
        duration_s=3.2,
        run_dir="/tmp/x",
    )
    console = Console(record=True, width=160)
    render_verdict(console, v)
    text = console.export_text()
    assert "hang (form C)   exit 12" in text
    assert "step 20, acks_consumed (dma-ack-count)" in text
    assert "blocked at recv_requests (scheduler.py:59)" in text
    # The bracketed address survives (no rich markup); gloo's source path is dropped as noise.
    assert "RuntimeError: Connection closed by peer [127.0.0.1]:902" in text
    assert "pair.cc" not in text
    assert text.rstrip().splitlines()[-2].split()[1:4] == ["next", "hicache-diag", "report"]
    assert "hicache-diag report /tmp/x" in text
    assert "device" not in text  # a verdict that does not say (one from before the key)


def test_verdict_panel_and_json_say_which_device_ran():
    v = Verdict(Outcome.OK, seed=0, steps=3, run_dir="/tmp/x", device="cuda")
    console = Console(record=True, width=120)
    render_verdict(console, v)
    (row,) = [ln for ln in console.export_text().splitlines() if " device " in ln]
    assert row.split()[1:3] == ["device", "cuda"]
    assert v.to_json()["device"] == "cuda" and Verdict.from_json(v.to_json()) == v
    old = {k: val for k, val in v.to_json().items() if k != "device"}
    assert "device" not in Verdict.from_json(old).to_json()  # an old verdict writes back as it was


def test_status_line_only_on_a_terminal_and_never_with_json():
    from hicache_diag.cli.render.status import PhaseStatus

    assert not PhaseStatus(Console(force_terminal=False)).enabled  # piped: nothing
    assert not PhaseStatus(Console(force_terminal=True), quiet=True).enabled  # --json
    console = Console(force_terminal=True, record=True, width=80)
    with PhaseStatus(console, first="SGLang 0.5.23: launching") as status:
        assert status.enabled
        status.phase("SGLang 0.5.23: loading the model")
        status._progress.refresh()
    assert "loading the model" in console.export_text()


def test_reading_status_only_for_big_inputs(tmp_path):
    from hicache_diag.cli.render.status import BIG_READ_BYTES, reading_status

    small = tmp_path / "small.log"
    small.write_text("x")
    assert not reading_status(Console(force_terminal=True), [small]).enabled
    big = tmp_path / "big.log"
    with open(big, "wb") as fh:
        fh.truncate(BIG_READ_BYTES + 1)  # sparse: no real bytes written
    assert reading_status(Console(force_terminal=True), [big]).enabled


def test_a_run_across_nodes_names_the_node_of_each_rank():
    ranks = [RankState(0, 0, 0, 11, "crashed", node="node-0")]
    ranks.append(RankState(1, 1, 0, 12, "crashed", "writing_check", node="node-1"))
    v = Verdict(Outcome.CRASH, CrashForm.B, failed_rank=1, culprit_rank=1, ranks=ranks)
    console = Console(record=True, width=160)
    render_verdict(console, v)
    text = console.export_text()
    assert "1 (node-1 PP1 TP0)" in text.split("culprit rank", 1)[1].splitlines()[0]
    assert "rank 1 node-1 PP1 TP0" in text and "rank 0 node-0 PP0 TP0" in text
    data = v.to_json()
    assert [r["node"] for r in data["ranks"]] == ["node-0", "node-1"]
    assert Verdict.from_json(data).ranks == ranks
    one_node = Verdict(Outcome.OK, ranks=[RankState(0, 0, 0)]).to_json()
    assert "node" not in one_node["ranks"][0]  # a single-node verdict as it always was
