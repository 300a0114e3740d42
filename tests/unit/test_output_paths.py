"""output_paths: the one rule every output path goes through (the CLI suite is generated in
tests/cli/test_output_paths.py); here the pieces: evidence recognised, atomic writes."""

from __future__ import annotations

import os

import pytest

from hicache_diag.errors import UsageError
from hicache_diag.evidence.output_paths import claim_dir, claim_file, evidence_file, write_atomic


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "stacks").mkdir(parents=True)
    for name in ("manifest.json", "rank0.jsonl", "rank0.log", "verdict.json", "stacks/rank0.json"):
        (run / name).write_text("{}\n")
    return run


def test_evidence_is_known_by_name_in_a_run_dir_only(run_dir, tmp_path):
    names = ("manifest.json", "rank0.jsonl", "rank12.log", "verdict.json", "requests.json")
    for name in (*names, "stacks/rank0.json", "stacks/anything"):
        assert evidence_file(run_dir / name), name
    assert not evidence_file(run_dir / "report.md")
    assert not evidence_file(tmp_path / "verdict.json"), "not a run dir: a plain name"
    (tmp_path / "link.json").symlink_to(run_dir / "verdict.json")
    assert evidence_file(tmp_path / "link.json"), "through a symlink too"


def test_write_atomic_replaces_a_symlink_never_its_target(tmp_path):
    target = tmp_path / "mine.txt"
    target.write_text("mine\n")
    link = tmp_path / "out.md"
    link.symlink_to(target)
    write_atomic(link, "report\n")
    assert not link.is_symlink() and link.read_text() == "report\n"
    assert target.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt", "out.md"], "no temp left"
    assert oct(link.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_atomic_refuses_evidence_as_a_last_guard(run_dir):
    with pytest.raises(UsageError, match="a run directory's evidence"):
        write_atomic(run_dir / "verdict.json", "# markdown\n")
    assert (run_dir / "verdict.json").read_text() == "{}\n"


def test_claims(run_dir, tmp_path):
    assert claim_file("--summary", str(tmp_path / "new.md")) == tmp_path / "new.md"
    (tmp_path / "old.md").write_text("x")
    with pytest.raises(UsageError, match="exists; give a new path, or --force"):
        claim_file("--summary", str(tmp_path / "old.md"))
    assert claim_file("--summary", str(tmp_path / "old.md"), force=True)
    with pytest.raises(UsageError, match="never overwritten"):
        claim_file("--summary", str(run_dir / "rank0.jsonl"), force=True)
    assert claim_dir("--plots", str(run_dir), ("queues.png",)) == run_dir, "new files beside"
    with pytest.raises(UsageError, match="would overwrite verdict.json"):
        claim_dir("--out", str(run_dir), ("verdict.json",), force=True)
    with pytest.raises(UsageError, match="is not empty; a run directory is written once"):
        claim_dir("--out", str(run_dir), fresh=True)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(UsageError, match="is read-only"):
            claim_file("--html", str(ro / "deep" / "r.html"))
    finally:
        ro.chmod(0o755)
