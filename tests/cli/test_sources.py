"""`hicache-diag sources` end to end on tiny synthetic trees: the table, --json against the
schema in docs/sources.md, --diff, the builtin runtime, and bad input (one line, exit 2)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from tests.unit.sources.tree import write_tree

jsonschema = pytest.importorskip("jsonschema")  # in the [test] extra

DOC = Path(__file__).resolve().parents[2] / "docs" / "sources.md"

SCHEDULER = """
import time

class Scheduler:
    def process_input_requests(self, reqs):
        now = time.monotonic()
        self.session_controller.maybe_reap(now)
"""
SESSION = """
class SessionController:
    def maybe_reap(self, now, interval=1.0):
        if now - self._last_reap_time > interval:
            self._last_reap_time = now
            self._close_all()
"""
CACHE_OLD = """
import torch

class Cache:
    def writing_check(self):
        done = 0
        for ack in self.ack_write_queue:
            if not ack.finish_event.query():
                break
            done += 1
        while done > 0:
            done -= 1
"""
CACHE_NEW = """
import torch

class Cache:
    def writing_check(self):
        done = 0
        if self.pp_rank == 0:
            for ack in self.ack_write_queue:
                if not ack.finish_event.query():
                    break
                done += 1
        t = torch.tensor(done)
        if self.pp_rank > 0:
            torch.distributed.recv(t, group_src=self.pp_rank - 1, group=self.pp_group)
        done = int(t.item())
        while done > 0:
            done -= 1
"""


def _schema(name: str) -> dict:
    text = DOC.read_text()
    block = text.split(f"<!-- schema: {name} -->", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)\n```", block, re.S).group(1))


def _tree(root: Path, cache: str) -> Path:
    files = {
        "managers/scheduler.py": SCHEDULER,
        "session/session_controller.py": SESSION,
        "mem_cache/cache.py": cache,
    }
    return write_tree(root, files).parent  # an unzipped wheel: sglang/ inside


def test_table_lists_each_source_with_file_line_and_decision(tmp_path, capsys):
    assert run_cli(["sources", "--source", str(_tree(tmp_path, CACHE_OLD))]) == 0
    out = capsys.readouterr().out
    assert "managers/scheduler.py:6" in out and "session-release" in out
    assert "mem_cache/cache.py:8" in out and "dma-ack-count" in out and "ack-release" in out
    assert "Classic sources" in out


def test_json_matches_the_documented_schema_and_the_tree(tmp_path, capsys):
    assert run_cli(["sources", "--source", str(_tree(tmp_path, CACHE_NEW)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, _schema("hicache-diag/sources/v1"))
    assert data["release"] == {
        "engine": "sglang",
        "version": "9.9.9",
        "root": str((tmp_path / "sglang").resolve()),
    }
    by_fn = {s["function"]: s for s in data["sources"]}
    ack = by_fn["Cache.writing_check"]
    assert ack["classic"] == "dma-ack-count" and ack["alignment"]["mechanism"] == "leader-relay"
    assert ack["alignment"]["covers_pp"] is True
    clock = by_fn["Scheduler.process_input_requests"]
    assert (clock["kind"], clock["line"], clock["decisions"]) == ("clock", 6, ["session-release"])


def test_diff_shows_the_ack_count_becoming_leader_relayed(tmp_path, capsys):
    a, b = _tree(tmp_path / "a", CACHE_OLD), _tree(tmp_path / "b", CACHE_NEW)
    assert run_cli(["sources", "--diff", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, _schema("hicache-diag/sources-diff/v1"))
    ack = next(c for c in data["classic"] if c["classic"] == "dma-ack-count")
    assert ack == {**ack, "a": {"none": 1}, "b": {"leader-relay": 1}, "changed": True}
    assert [r["key"].split("::")[1] for r in data["realigned"]] == ["Cache.writing_check"]
    assert data["pp_relays"] == {"a": [], "b": ["writing_check"]}
    assert run_cli(["sources", "--diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "Classic sources, sglang 9.9.9 -> sglang 9.9.9" in out and "leader-relay" in out


def test_builtin_engine_scans_our_runtime(capsys):
    assert run_cli(["sources", "--engine", "builtin", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, _schema("hicache-diag/sources/v1"))
    assert data["release"]["engine"] == "builtin"
    ack = [s for s in data["sources"] if s["classic"] == "dma-ack-count"]
    assert ack and all(s["alignment"]["covers_pp"] for s in ack)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--source", "{tmp}/missing"], "no such directory"),
        (["--source", "{tmp}/w.whl"], "a file, not a directory"),
        (["--source", "{tmp}"], "no SGLang source there"),
        (["--source", "{tmp}", "--sglang-python", "python"], "give one"),
        (["--engine", "vllm"], "choose one of builtin, sglang"),
        (["--engine", "builtin", "--source", "{tmp}"], "drop --source"),
        (["--diff", "{tmp}/missing", "builtin"], "neither a directory"),
        (["--diff", "builtin", "{tmp}", "--source", "{tmp}"], "--diff names both trees"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, needle):
    (tmp_path / "w.whl").write_bytes(b"PK")
    rc = run_cli(["sources", *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("hicache-diag: error:"), err
    assert needle in err[0], err[0]


@pytest.mark.process
def test_a_python_without_sglang_is_one_line_exit_2(tmp_path, capsys):
    # -S: no site-packages, so this interpreter finds no sglang wherever the tests run.
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    rc = run_cli(["sources", "--sglang-python", str(py)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "SGLang is not installed" in err[0], err


def _run_dir(root: Path) -> Path:
    """Two PP ranks: equal L3 queue reads, then PP0 drains a storage hit PP1 has not seen."""
    rows = {
        0: [
            {
                "step": 1,
                "sources_armed": ["l3-control-queues"],
                "sources": {"l3-control-queues": {"n": 1, "v": [[0, 0, 0]]}},
            },
            {
                "step": 2,
                "sources": {"l3-control-queues": {"n": 1, "v": [[1, 0, 0]], "d": [[1, 0, 0]]}},
            },
        ],
        1: [
            {
                "step": 1,
                "sources_armed": ["l3-control-queues"],
                "sources": {"l3-control-queues": {"n": 1, "v": [[0, 0, 0]]}},
            },
            {"step": 2, "sources": {"l3-control-queues": {"n": 1, "v": [[0, 0, 0]]}}},
        ],
    }
    root.mkdir(parents=True, exist_ok=True)
    for rank, lines in rows.items():
        (root / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def test_run_marks_the_source_that_differed_where_its_decision_acted(tmp_path, capsys):
    run = _run_dir(tmp_path / "run")
    assert run_cli(["sources", "--run", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, _schema("hicache-diag/sources-run/v1"))
    (src,) = data["sources"]
    assert (src["name"], src["marked"], src["steps_marked"], src["steps_apart"]) == (
        "l3-control-queues",
        True,
        1,
        1,
    )
    assert src["first_marked"]["values"] == {"0": [[1, 0, 0]], "1": [[0, 0, 0]]}
    assert src["first_marked"]["outcomes"] == {"0": [[1, 0, 0]], "1": []}
    assert run_cli(["sources", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "(dynamic)" in out and "l3-control-queues" in out and "storage-queue-drain" in out
    assert "first marked at step 2: r0: [[1,0,0]] -> [[1,0,0]]; r1: [[0,0,0]]" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--run", "{tmp}/missing"], "no such run directory"),
        (["--run", "{tmp}"], "no rank*.jsonl"),
        (["--run", "{tmp}/run", "--diff", "builtin", "{tmp}"], "drop --diff"),
        (["--run", "{tmp}/run", "--engine", "builtin"], "drop --engine"),
    ],
)
def test_run_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, needle):
    _run_dir(tmp_path / "run")
    rc = run_cli(["sources", *(a.replace("{tmp}", str(tmp_path)) for a in argv)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_run_with_the_release_names_where_each_probed_read_is(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for rank, closed in ((0, {"d": [1]}), (1, {})):
        line = {
            "step": 7,
            "sources_armed": ["session-clock"],
            "sources": {"session-clock": {"n": 1, "v": [5.0 + rank], **closed}},
        }
        (run / f"rank{rank}.jsonl").write_text(json.dumps(line) + "\n")
    tree = _tree(tmp_path / "w", CACHE_OLD)
    assert run_cli(["sources", "--run", str(run), "--source", str(tree), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, _schema("hicache-diag/sources-run/v1"))
    (clock,) = data["sources"]
    assert (clock["steps_marked"], clock["steps_apart"]) == (1, 1)
    assert [(r["file"], r["line"], r["alignment"]) for r in clock["static"]] == [
        ("managers/scheduler.py", 6, "none")
    ]
    assert data["release"]["version"] == "9.9.9"
    assert run_cli(["sources", "--run", str(run), "--source", str(tree)]) == 0
    assert "managers/scheduler.py:6" in capsys.readouterr().out
