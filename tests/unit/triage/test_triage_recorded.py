"""A production recording read by triage (triage/recorded*.py): the ranks aligned by step, the
first divergent step and field found in the full lines, in the step digests once the lines
rotated out, in the block crcs before the digests; blind ranks named, never compared."""

from __future__ import annotations

import json

from hicache_diag.evidence import recording as rec
from hicache_diag.evidence.recording_scan import read_session
from hicache_diag.triage.recorded import Facts, offline_facts, read_recording
from hicache_diag.triage.recorded_align import align
from tests.unit.triage.recordings import record, small


def _part_at(step: int, **over):
    """Rank 1 takes `over` at `step` only; rank 0's reap tick closed a session there."""

    def change(s: int, r: int) -> dict:
        if s != step:
            return {}
        return over if r == 1 else {"sessions_closed": 1}

    return change


def test_a_divergence_in_the_held_lines_is_named_with_its_values_and_source(tmp_path):
    record(tmp_path, 2, 40, _part_at(25, extend_num_tokens=5))
    found = align(read_session(tmp_path))
    assert found is not None and found.reach == "lines"
    assert (found.step, found.field) == (25, "extend_num_tokens")
    assert found.values == {"0": 8, "1": 5}
    assert found.source == "session-clock" and found.culprit_rank == 0


def test_ranks_that_agree_name_no_divergence(tmp_path):
    record(tmp_path, 2, 40)
    assert align(read_session(tmp_path)) is None


def test_a_step_one_rank_alone_wrote_is_not_compared(tmp_path):
    """A heartbeat (or a slot folded idle on the other rank) is written on one rank only."""
    record(tmp_path, 2, 40, lambda s, r: None if (s % 7 == 0 and r == 1) else {})
    assert align(read_session(tmp_path)) is None


def test_values_rotated_out_leave_the_step_from_the_digests_and_the_field_from_the_blocks(
    tmp_path,
):
    # Lines of ~330 bytes in a 2 x 2000-byte ring: only the last dozen steps stay in full.
    record(tmp_path, 2, 200, _part_at(30, evicted=3), small(lines_bytes=2000))
    reads = read_session(tmp_path)
    assert min(rr.first_held for rr in reads.values()) > 30
    found = align(reads)
    assert found is not None and found.reach == "digests"
    assert (found.step, found.field) == (30, "evicted")  # block 7 (steps 28-31) differs there
    assert set(found.values) == {"0", "1"}
    assert all(v.startswith("crc32:") for v in found.values.values())
    assert found.values["0"] != found.values["1"]
    assert any("rotated out" in line for line in found.evidence)


def test_a_divergence_older_than_every_digest_is_named_by_its_block(tmp_path):
    # 8-byte digests, 160-byte segments, 2 kept: only the last 20-40 steps keep a digest.
    limits = small(lines_bytes=2000, digest_segment_bytes=160, digest_segments=2)
    record(tmp_path, 2, 300, _part_at(30, evicted=3), limits)
    reads = read_session(tmp_path)
    assert min(int(rr.steps[0]) for rr in reads.values()) > 30
    found = align(reads)
    assert found is not None and found.reach == "blocks"
    assert (found.step, found.last_step, found.field) == (28, 31, "evicted")


def test_a_field_the_blocks_cannot_tell_is_said_unknown(tmp_path):
    """One rank wrote a step of that block the other did not: the blocks are not comparable."""

    def change(s: int, r: int) -> dict | None:
        if s == 29 and r == 1:
            return None
        return {"evicted": 3} if (s == 30 and r == 1) else {}

    record(tmp_path, 2, 200, change, small(lines_bytes=2000))
    found = align(read_session(tmp_path))
    assert found is not None and found.reach == "digests" and found.step == 30
    assert found.field is None and any("not comparable" in ln for ln in found.evidence)


def test_a_rank_whose_digests_stop_early_is_behind_its_peers_never_a_divergence(tmp_path):
    record(tmp_path, 2, 100, lambda s, r: None if (r == 1 and s > 60) else {})
    reads = read_session(tmp_path)
    facts = Facts(asked="q1", answered={0}, silent={1: "its process is stopped (kernel state T)"})
    got = read_recording(reads, [tmp_path.name], facts)
    assert got.parting is None
    by_rank = {r.rank: r for r in got.ranks}
    assert (by_rank[0].last_step, by_rank[1].last_step) == (100, 60)
    assert by_rank[1].blind == "no answer: its process is stopped (kernel state T)"
    assert by_rank[0].blind is None
    assert any("60, 40 step(s) behind its peers' (100)" in ln for ln in got.evidence)


def test_a_rank_whose_recorder_turned_off_is_blind_with_its_reason(tmp_path):
    writers = record(tmp_path, 2, 30)
    meta = writers[1].meta
    meta.on, meta.off_reason = False, "OSError: [Errno 28] No space left on device"
    rec.meta_path(tmp_path, 1).write_text(json.dumps(meta.to_json()))
    got = read_recording(read_session(tmp_path), [tmp_path.name], Facts())
    blind = {r.rank: r.blind for r in got.ranks}
    assert blind == {0: None, 1: "recorder off: OSError: [Errno 28] No space left on device"}
    assert got.parting is None  # what it wrote before is compared: it agrees


def test_a_rank_missing_from_the_folder_is_blind_never_guessed(tmp_path):
    record(tmp_path, 3, 20, _part_at(10, extend_num_tokens=1))
    for path in tmp_path.glob("rank1.*"):
        path.unlink()
    reads = read_session(tmp_path)
    got = read_recording(reads, [tmp_path.name], offline_facts(reads, None))
    missing = [r for r in got.ranks if r.blind and r.blind.startswith("missing")]
    assert [(r.pp, r.tp, r.rank) for r in missing] == [(1, 0, None)]
    assert got.parting is None  # rank 1 parted; ranks 0 and 2 agree: nothing is made up


def test_a_live_rank_with_another_process_files_is_stale(tmp_path):
    record(tmp_path, 2, 20, pids=[11, 12])
    facts = Facts(live={(0, 0): 11, (1, 0): 99})
    got = read_recording(read_session(tmp_path), [tmp_path.name], facts)
    assert {r.rank: r.blind for r in got.ranks}[1].startswith("stale: its recording is pid 12")
    assert got.parting is None and any("fewer than two" in ln for ln in got.evidence)


def test_the_unanswered_last_request_names_the_silent_rank_offline(tmp_path):
    writers = record(tmp_path, 2, 20)
    (tmp_path / rec.DUMP_REQUEST).write_text(json.dumps({"id": "q7", "at": 1.0}))
    writers[0].meta.on = True
    rec.RankRecording(tmp_path, writers[0].meta, small()).dump({"request": "q7"}, "asked")
    reads = read_session(tmp_path)
    got = read_recording(reads, [tmp_path.name], offline_facts(reads, {"id": "q7"}))
    blind = {r.rank: r.blind for r in got.ranks}
    assert blind[0] is None and blind[1].startswith("no answer: the last dump request (q7)")
    assert {r.rank: r.dumped_at is not None for r in got.ranks} == {0: True, 1: False}


def test_the_json_carries_each_rank_and_the_first_divergence(tmp_path):
    record(tmp_path, 2, 40, _part_at(25, extend_num_tokens=5))
    reads = read_session(tmp_path)
    got = read_recording(reads, [tmp_path.name], offline_facts(reads, None))
    assert got.first_divergence_json() == {
        "step": 25,
        "field": "extend_num_tokens",
        "values": {"0": 8, "1": 5},
        "source": "session-clock",
        "source_rank": 0,
        "reach": "lines",
        "last_step": None,
        "fields": ["extend_num_tokens"],
    }
    assert [r["label"] for r in got.recorded_json()] == ["PP0 TP0", "PP1 TP0"]
    assert got.recorded_json()[1]["last_step"] == 40


def test_two_launches_holding_the_same_ranks_keep_the_later_one(tmp_path):
    """Two recorded servers on one node (or a restart into a new session): never mixed."""
    from hicache_diag.evidence.recording_scan import read_session as read
    from hicache_diag.triage.recorded import join

    record(tmp_path / "old", 2, 20, _part_at(5, extend_num_tokens=1))
    record(tmp_path / "new", 2, 30)
    old, new = read(tmp_path / "old"), read(tmp_path / "new")
    for rr in new.values():
        rr.meta.started_at, rr.session = 10.0, "new"
    for rr in old.values():
        rr.session = "old"
    notes: list[str] = []
    reads = join([new, old], notes)
    assert {r: rr.session for r, rr in reads.items()} == {0: "new", 1: "new"}
    assert notes == [f"rank {r} is in new and old: the later kept" for r in (0, 1)]
    assert align(reads) is None  # the old launch's parting is not this one's


def test_a_slot_one_rank_folded_idle_while_its_peer_ran_a_batch_is_found(tmp_path):
    """Diagnosis' idle-slot rule (diagnosis/idle_slots.py) on the recorded lines: rank 1 wrote
    no line at step 20 and its next line says it folded one idle slot; rank 0 ran r20 there."""

    def change(step: int, rank: int) -> dict | None:
        if rank == 1 and step == 20:
            return None
        return {"idle_polls": 1} if (rank == 1 and step == 21) else {}

    record(tmp_path, 2, 3000, change)  # a long recording: only the odd steps are searched
    found = align(read_session(tmp_path))
    assert found is not None and (found.step, found.field) == (20, "rids")
    assert found.values == {"0": ["r20"], "1": []}
