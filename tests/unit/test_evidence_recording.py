"""The production recording's files (evidence/recording.py): written bounded, read back as
written, and a writer that turns itself off on any disk error instead of raising."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat

import pytest

from hicache_diag.evidence import recording as rec

FIELDS = ["extend_num_tokens", "acks_consumed", "tree_digest"]


def _meta(rank: int = 0) -> rec.RankMeta:
    return rec.RankMeta(rank, rank, 0, 1234, "h", "0.5.23", FIELDS, 0.0, {})


def _line(step: int, tokens: int = 8) -> dict:
    return {"step": step, "extend_num_tokens": tokens, "acks_consumed": 1, "tree_digest": "ab"}


def _small(**kw) -> rec.Limits:
    base = {"lines_bytes": 2000, "digest_segment_bytes": 80, "digest_segments": 3}
    return rec.Limits(**{**base, "block_steps": 4, "reserve_bytes": 0, **kw})


def test_steps_read_back_with_their_digests_and_blocks(tmp_path):
    w = rec.RankRecording(tmp_path / "s", _meta(), _small())
    for step in range(1, 10):
        w.write_step(_line(step))
    w.close()
    view = rec.read_rank(tmp_path / "s", 0)
    assert [s for s, _ in view.digests] == list(range(1, 10))
    assert view.digests[0][1] == rec.step_digest(_line(1), FIELDS)
    assert [ln["step"] for ln in view.lines] == list(range(1, 10))
    assert [b["block"] for b in view.blocks] == [0, 1, 2]  # steps 1-3, 4-7, 8-9
    assert view.blocks[1]["n"] == 4 and set(view.blocks[1]["f"]) == set(FIELDS)
    assert view.meta is not None and view.meta.on and view.meta.last_step == 9
    assert view.last_step == 9


def test_a_reader_recomputes_the_writers_digests(tmp_path):
    """Triage may check a line against its digests: both come from the module's own functions."""
    w = rec.RankRecording(tmp_path / "s", _meta(), _small())
    w.write_steps([(_line(step, tokens=step), None) for step in range(4, 8)])
    w.close()
    view = rec.read_rank(tmp_path / "s", 0)
    assert [crc for _, crc in view.digests] == [rec.step_digest(ln, FIELDS) for ln in view.lines]
    (block,) = view.blocks
    crc = 0
    for ln in view.lines:
        crc = rec.field_digest(ln["step"], ln["extend_num_tokens"], crc)
    assert block["f"]["extend_num_tokens"] == crc and block["n"] == 4


def test_files_are_private(tmp_path):
    w = rec.RankRecording(tmp_path / "s", _meta(), _small())
    w.write_step(_line(1))
    w.close()
    for path in (tmp_path / "s").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700


def test_every_file_stays_bounded_however_long_the_server_runs(tmp_path):
    limits = _small()
    w = rec.RankRecording(tmp_path / "s", _meta(), limits)
    for step in range(1, 2000):
        w.write_step(_line(step))
    w.dump({"threads": []}, "asked")
    w.close()
    files = list((tmp_path / "s").iterdir())
    digests = [p for p in files if ".digest." in p.name]
    assert len(digests) <= limits.digest_segments
    assert all(p.stat().st_size <= limits.digest_segment_bytes for p in digests)
    lines = [p for p in files if p.name.startswith("rank0.jsonl")]
    assert len(lines) == 2 and all(p.stat().st_size <= limits.lines_bytes for p in lines)
    view = rec.read_rank(tmp_path / "s", 0)
    # The newest steps are held in full and as digests; the oldest digests were dropped.
    assert view.digests[-1][0] == 1999 and view.digests[0][0] > 1
    assert view.lines[-1]["step"] == 1999


def test_only_the_last_dumps_are_kept(tmp_path):
    w = rec.RankRecording(tmp_path / "s", _meta(), _small(dumps_kept=2))
    for i in range(5):
        w.dump({"i": i}, "asked")
    view = rec.read_rank(tmp_path / "s", 0)
    assert [d["i"] for d in view.dumps] == [3, 4]


def test_a_disk_error_turns_the_rank_off_once_and_never_raises(tmp_path, monkeypatch):
    said = []
    w = rec.RankRecording(tmp_path / "s", _meta(), _small(), on_off=said.append)
    w.write_step(_line(1))
    real_write, failed = os.write, []

    def full_once(fd, data):  # the step's append fails; the meta that says why still fits
        if not failed:
            failed.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(rec.os, "write", full_once)
    w.write_step(_line(2))
    w.write_step(_line(3))
    assert w.dump({}, "asked") is None
    assert not w.on and len(said) == 1 and "No space left" in said[0]
    meta = json.loads(rec.meta_path(tmp_path / "s", 0).read_text())
    assert meta["on"] is False and "No space left" in meta["off_reason"]
    w.close()


def _disk(monkeypatch, total_mib: int, free_mib: int) -> None:
    usage = shutil._ntuple_diskusage(total_mib << 20, (total_mib - free_mib) << 20, free_mib << 20)
    monkeypatch.setattr(rec.shutil, "disk_usage", lambda _path: usage)


def test_a_disk_near_full_is_off_from_the_start(tmp_path, monkeypatch):
    _disk(monkeypatch, total_mib=100_000, free_mib=100)  # under the 256 MiB reserve
    said = []
    w = rec.RankRecording(tmp_path / "s", _meta(), rec.Limits(), said.append)
    w.write_step(_line(1))
    assert not w.on and "disk nearly full" in said[0]


def test_a_small_volume_of_its_own_records(tmp_path, monkeypatch):
    """The reserve is at most a tenth of the disk: a 64 MiB volume mounted for recordings."""
    _disk(monkeypatch, total_mib=64, free_mib=60)
    w = rec.RankRecording(tmp_path / "s", _meta(), rec.Limits())
    w.write_step(_line(1))
    assert w.on and rec.read_rank(tmp_path / "s", 0).last_step == 1


def test_a_record_cut_by_a_crash_is_read_up_to_it(tmp_path):
    w = rec.RankRecording(tmp_path / "s", _meta(), _small())
    for step in (1, 2):
        w.write_step(_line(step))
    w.close()
    seg = rec.digest_path(tmp_path / "s", 0, 0)
    seg.write_bytes(seg.read_bytes() + b"\x01\x02\x03")
    lines = rec.lines_path(tmp_path / "s", 0)
    lines.write_bytes(lines.read_bytes() + b'{"step": 3, "extend')
    view = rec.read_rank(tmp_path / "s", 0)
    assert [s for s, _ in view.digests] == [1, 2] and [ln["step"] for ln in view.lines] == [1, 2]


@pytest.mark.parametrize(
    ("value", "state"),
    [("OFF", False), ("0", False), (" no ", False), ("", True), ("On", True), ("maybe", None)],
)
def test_the_switch_reads_off_in_any_case(value, state):
    assert rec.switch_state(value) is state


def test_sessions_are_listed_newest_first(tmp_path):
    for name in ("a", "b"):
        rec.RankRecording(tmp_path / name, _meta(), _small()).close()
    os.utime(tmp_path / "a", (1, 1))
    assert [p.name for p in rec.sessions_in(tmp_path)] == ["b", "a"]
    assert rec.ranks_in(tmp_path / "b") == [0]
