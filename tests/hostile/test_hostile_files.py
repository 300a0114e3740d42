"""Hostile files per input type (issue 41.4), generated: each file a command reads (a run dir's
evidence for `report` and `export`, the paths `run`, `triage` and `report` take) crossed with
each way a file can be hostile. Every case ends in one line and exit 2, or a correct reading
(exit 0 or 3); never exit 1, a traceback, a hang (the deadline), a changed file, or stdout that
is not one JSON document under --json."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.hostile.invariants import (
    BUILTIN_HANG,
    ROOT,
    SGLANG_CRASH,
    changed,
    check_output,
    one_json_document,
    tree_hashes,
)

FR_SAMPLE = ROOT / "samples" / "flight_recorder"
LONG = "x" * 300  # past NAME_MAX (255): Errno 36 before issue 41


def _deep(levels: int = 5000) -> str:
    return "[" * levels + "]" * levels


def _make(path: Path, kind: str) -> None:
    """Replace `path` by a hostile `kind` of file."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink-loop":
        path.symlink_to(path.name + ".loop")
        path.with_name(path.name + ".loop").symlink_to(path.name)
    elif kind == "deep-json":
        path.write_text(_deep() + "\n")
    elif kind == "huge":  # sparse: past every bound without using the disk
        with open(path, "wb") as fh:
            fh.truncate(600 << 20)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "wrong-type":
        path.write_text(_WRONG_TYPES.get(path.name, '{"ranks": "abc", "faults": 7}') + "\n")
    else:
        raise ValueError(kind)


# A JSON file whose keys hold the wrong JSON type (a hand-edited or damaged file).
_WRONG_TYPES = {
    "launcher.json": '{"ranks": "abc", "hang": 5, "stacks": []}',
    "manifest.json": '{"faults": "dma-delay", "topology": [1, 2], "config": 3}',
    "verdict.json": '{"outcome": "crash", "ranks": "abc", "evidence": 5}',
    "rank0.jsonl": '{"step": "x", "queues": 5, "rids": {"a": 1}}\n'
    '{"step": 3, "queues": 5, "rids": {"a": 1}, "acks_consumed": "x", "must_agree": 7}',
    "rank0.json": '[{"frames": "x", "thread_name": 5}, 7, {"frames": [{"line": "inf"}]}]',
    "requests.json": '{"errors": [1, 2], "aborted": "x"}',
    "outputs.json": '"not outputs"',
    # a production recording (`record`) and a Flight Recorder dump (`triage --fr`)
    "rank0.meta.json": '{"rank": "x", "pid": "abc", "fields": 5, "limits": []}',
    "rank0.dump-1.json": '{"rank": 0, "threads": "x", "steps": 5, "at": "later", "queues": 1}',
    "rank0.blocks.jsonl": '{"step": "x", "crcs": 5}\n{"block": 0, "first": 1, "last": "x"}\n'
    '{"block": 1, "first": 5, "last": 8, "n": 4, "f": {"rids": "x", "evicted": [1]}}',
    "nccl_trace_rank_0": '{"entries": [{"state": 5, "collective_seq_id": "x", "frames": 7}, 3], '
    '"pg_config": [1], "pg_status": 3, "version": {}}',
}
KINDS = (
    "fifo",
    "device",
    "directory",
    "symlink-loop",
    "deep-json",
    "huge",
    "empty",
    "binary",
    "wrong-type",
)
REPORT_FILES = (
    "verdict.json",
    "manifest.json",
    "launcher.json",
    "outputs.json",
    "reference.json",
    "rank0.jsonl",
    "rank0.log",
    "stacks/rank0.json",
)
EXPORT_FILES = (
    "verdict.json",
    "manifest.json",
    "launcher.json",
    "requests.json",
    "rank1.jsonl",
    "rank1.log",
    "server.log",
)
RECORDING_FILES = (
    "rank0.meta.json",
    "rank0.jsonl",
    "rank0.blocks.jsonl",
    "rank0.digest.000000",
    "rank0.dump-1.json",
    "dump-request.json",
)
FR_FILES = ("nccl_trace_rank_0", "nccl_trace_rank_1")
# Not JSON text: deep JSON or types mean nothing (a log; a digest segment is binary records).
_TEXT_ONLY = {"rank0.log", "rank1.log", "server.log", "rank0.digest.000000"}


def _cases(files: tuple[str, ...]) -> list[tuple[str, str]]:
    return [
        (name, kind)
        for name in files
        for kind in KINDS
        if not (name in _TEXT_ONLY and kind in ("deep-json", "wrong-type", "huge"))
    ]


def _ids(files: tuple[str, ...]) -> list[str]:
    return [f"{name}:{kind}" for name, kind in _cases(files)]


def _run_case(cli, argv: list[str], tmp_path: Path) -> None:
    before = tree_hashes(tmp_path)
    ran = cli([*argv, "--json"] if "export" not in argv else argv)
    check_output(ran, json_out="export" not in argv)
    verdicts = range(10, 17) if argv[0] == "triage" else ()  # triage's exit names its verdict
    assert ran.code in (0, 2, 3, *verdicts), (ran.code, ran.err[-1500:])
    assert not changed(before, tree_hashes(tmp_path)), "an input was changed"


@pytest.mark.parametrize(("name", "kind"), _cases(REPORT_FILES), ids=_ids(REPORT_FILES))
def test_report_reads_any_hostile_evidence_file(cli, tmp_path, name, kind):
    run = tmp_path / "run"
    shutil.copytree(BUILTIN_HANG, run)
    _make(run / name, kind)
    _run_case(cli, ["report", run], tmp_path)  # reads every file (diagnosis/load.py)
    if name == "verdict.json":  # the recorded verdict damaged: classified afresh instead
        _run_case(cli, ["report", run, "--reclassify"], tmp_path)


@pytest.mark.parametrize(("name", "kind"), _cases(EXPORT_FILES), ids=_ids(EXPORT_FILES))
def test_export_reads_any_hostile_evidence_file(cli, tmp_path, no_export_probe, name, kind):
    run = tmp_path / "run"
    shutil.copytree(SGLANG_CRASH, run)
    _make(run / name, kind)
    before = tree_hashes(run)
    ran = cli(["export", run, "--out", tmp_path / "out"])
    check_output(ran, json_out=False)
    assert ran.code in (0, 2), (ran.code, ran.err[-1500:])
    assert not changed(before, tree_hashes(run))


def _recording(session: Path) -> None:
    """Two ranks' recording, as the recorder's own writer leaves it, rank 0 with a dump."""
    from hicache_diag.evidence import recording as rec
    from tests.unit.triage.recordings import record, small

    writers = record(session, 2, 40)
    rec.RankRecording(session, writers[0].meta, small()).dump({"request": "q1"}, "asked")
    rec.write_dump_request(session, "q1")


@pytest.mark.parametrize(("name", "kind"), _cases(RECORDING_FILES), ids=_ids(RECORDING_FILES))
def test_triage_reads_any_hostile_recording_file(cli, tmp_path, name, kind):
    """`triage --record-dir`: a recording copied from a node is input like any other."""
    session = tmp_path / "rec" / "node1-20250101T000000Z-7"
    session.mkdir(parents=True)
    _recording(session)
    _make(session / name, kind)
    _run_case(cli, ["triage", "--record-dir", session], tmp_path)
    _run_case(cli, ["triage", "--record-dir", tmp_path / "rec"], tmp_path)  # its record dir


@pytest.mark.parametrize(("name", "kind"), _cases(FR_FILES), ids=_ids(FR_FILES))
def test_triage_reads_any_hostile_flight_recorder_dump(cli, tmp_path, name, kind):
    fr = tmp_path / "fr"
    shutil.copytree(FR_SAMPLE / "gloo-desync-4ranks", fr)
    _make(fr / name, kind)
    _run_case(cli, ["triage", "--fr", fr], tmp_path)


@pytest.mark.parametrize("kind", ["deep", "shared", "a class"])
def test_a_hostile_pickle_in_a_flight_recorder_folder_is_no_dump(cli, tmp_path, kind):
    """Pickles nested past any dump, sharing one list 2^60 ways, or naming a class: each
    is left out (the other ranks read), never a RecursionError, a hang or code run."""
    import pickle

    fr = tmp_path / "fr"
    shutil.copytree(FR_SAMPLE / "gloo-desync-4ranks", fr)
    if kind == "deep":  # written by opcode: pickling it here would recurse
        data = b"\x80\x02" + b"(" * 100_000 + b"]" + b"l" * 100_000 + b"."
    elif kind == "shared":
        value: list = []
        for _ in range(60):
            value = [value, value]
        data = pickle.dumps({"entries": value, "version": "2.10"})
    else:
        data = pickle.dumps({"entries": [Path("x")]})
    (fr / "nccl_trace_rank_0").write_bytes(data)
    _run_case(cli, ["triage", "--fr", fr], tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "damaged", "deep-json", "many"])
def test_export_never_reads_the_run_dirs_beside_it(cli, tmp_path, no_export_probe, kind):
    """A FIFO verdict.json next door hung export, a damaged one made it exit 1, 300 siblings
    were all quoted into REPORT.md: export reads only the run it was given."""
    run = tmp_path / "runs" / "mine"
    shutil.copytree(SGLANG_CRASH, run)
    for i in range(300 if kind == "many" else 1):
        other = tmp_path / "runs" / f"sibling-run{i}"
        shutil.copytree(SGLANG_CRASH, other)
        if kind != "many":
            _make(other / "verdict.json", {"damaged": "binary"}.get(kind, kind))
    ran = cli(["export", run, "--out", tmp_path / "out"])
    check_output(ran, json_out=False)
    assert ran.code == 0, ran.err
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "sibling-run" not in report, "a run beside the exported one was quoted"


PATH_INPUTS = [
    # (argv before the path, argv after it): each takes a file or folder it reads
    (["run", "--scenario"], []),
    (["run", "--engine", "sglang", "--patch"], []),
    (["triage", "--dumps"], []),
    (["triage", "--logs"], []),
    (["triage", "--record-dir"], []),
    (["triage", "--fr"], []),
    (["triage", "--live", "--via", "ssh", "--hosts", "n1", "--ssh-config"], []),
    (["report"], []),
    (["export"], []),
]
PATH_KINDS = ("fifo", "device", "symlink-loop", "long-name", "under-a-file", "missing")


def _hostile_path(tmp_path: Path, kind: str) -> Path:
    if kind == "long-name":
        return tmp_path / LONG
    if kind == "under-a-file":
        (tmp_path / "afile").write_text("x\n")
        return tmp_path / "afile" / "inside"
    if kind == "missing":
        return tmp_path / "nothing-here"
    path = tmp_path / "input"
    _make(path, kind)
    return path


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize(("head", "tail"), PATH_INPUTS, ids=lambda v: " ".join(v) or "-")
def test_every_path_input_refuses_a_hostile_path_in_one_line(
    cli, tmp_path, monkeypatch, head, tail, kind
):
    monkeypatch.chdir(tmp_path)
    path = _hostile_path(tmp_path, kind)
    before = tree_hashes(tmp_path)
    json_out = "export" not in head
    ran = cli([*head, path, *tail, *(["--json"] if json_out else [])])
    check_output(ran, json_out)
    assert ran.code == 2, (ran.code, ran.err)
    assert not changed(before, tree_hashes(tmp_path))
    assert not (tmp_path / "runs").exists(), "refused before any run dir"


OUTPUT_FLAGS = [
    (["report", BUILTIN_HANG, "--plots"], []),
    (["report", BUILTIN_HANG, "--summary"], []),
    (["report", BUILTIN_HANG, "--html"], []),
    (["run", "--out"], []),
    (["triage", "--dumps", BUILTIN_HANG / "stacks", "--save"], []),
    (["record", "--print-env", "--bundle-dir"], []),
    (["record", "--print-env", "--dir"], []),
]


@pytest.mark.parametrize("kind", ["symlink-loop", "long-name", "under-a-file", "fifo"])
@pytest.mark.parametrize(("head", "tail"), OUTPUT_FLAGS, ids=lambda v: " ".join(map(str, v)))
def test_every_output_flag_refuses_a_hostile_path_in_one_line(
    cli, tmp_path, monkeypatch, head, tail, kind
):
    monkeypatch.chdir(tmp_path)
    path = _hostile_path(tmp_path, kind)
    before = tree_hashes(tmp_path)
    ran = cli([*head, path, *tail, "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2, (ran.code, ran.err)
    assert not changed(before, tree_hashes(tmp_path))


def test_a_deep_json_line_among_good_steps_is_damage_said_in_one_line(cli, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(BUILTIN_HANG, run)
    lines = (run / "rank0.jsonl").read_text().splitlines()
    lines.insert(1, _deep())
    (run / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    ran = cli(["report", run, "--reclassify", "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2 and "damaged" in one_json_document(ran.out)["error"]


def test_wrong_types_in_launcher_json_are_named(cli, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(BUILTIN_HANG, run)
    data = json.loads((run / "launcher.json").read_text())
    data["ranks"] = "abc"
    (run / "launcher.json").write_text(json.dumps(data))
    ran = cli(["report", run, "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2
    assert "'ranks' is a JSON string, not array" in one_json_document(ran.out)["error"]
