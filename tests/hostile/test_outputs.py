"""Nothing owned by someone else changes (issue 41.2): --force never reaches a run's evidence,
through any path or link; an output claimed by one invocation is refused to another; no command
writes into another run's dir (--storage-dir included)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from hicache_diag.evidence.claims import lock_dir
from tests.hostile.invariants import (
    BUILTIN_HANG,
    SGLANG_CRASH,
    changed,
    check_output,
    one_json_document,
    tree_hashes,
)


@pytest.fixture
def runs(tmp_path):
    """A builtin run and an SGLang run (its script.json, requests.json, server.log...)."""
    shutil.copytree(BUILTIN_HANG, tmp_path / "builtin")
    shutil.copytree(SGLANG_CRASH, tmp_path / "sglang")
    (tmp_path / "sglang" / "script.json").write_text('{"events": []}\n')
    (tmp_path / "sglang" / "first_divergence").mkdir()
    (tmp_path / "sglang" / "first_divergence" / "rank0.json").write_text("{}\n")
    (tmp_path / "user").mkdir()
    return tmp_path


def _targets(root: Path) -> list[tuple[str, Path]]:
    """(how, path) for each way a --summary path can name a run's evidence."""
    user = root / "user"
    links = {
        "link-to-stack": (user / "stack.md", root / "builtin" / "stacks" / "rank0.json"),
        "link-to-script": (user / "script.md", root / "sglang" / "script.json"),
        "link-to-run-dir": (user / "rundir", root / "sglang"),
        "link-to-stacks-dir": (user / "stacksdir", root / "builtin" / "stacks"),
    }
    for link, target in links.values():
        link.symlink_to(target)
    return [
        ("script.json", root / "sglang" / "script.json"),
        ("plugin.json", root / "sglang" / "plugin.json"),
        ("server.log", root / "sglang" / "server.log"),
        ("first_divergence", root / "sglang" / "first_divergence" / "rank0.json"),
        ("a new .json in a run dir", root / "sglang" / "notes.json"),
        ("stacks", root / "builtin" / "stacks" / "rank0.json"),
        ("a new file in stacks/", root / "builtin" / "stacks" / "new.md"),
        ("dotdot", root / "user" / ".." / "sglang" / "requests.json"),
        ("link-to-stack", links["link-to-stack"][0]),
        ("link-to-script", links["link-to-script"][0]),
        ("through a folder link", user / "rundir" / "script.json"),
        ("through a stacks link", user / "stacksdir" / "rank0.json"),
    ]


@pytest.mark.parametrize("flag", ["--summary", "--html"])
def test_force_never_reaches_evidence_through_any_path_or_link(cli, runs, flag):
    for how, target in _targets(runs):
        before = tree_hashes(runs)
        ran = cli(["report", runs / "builtin", flag, target, "--force", "--json"])
        check_output(ran, json_out=True)
        assert ran.code == 2, (how, ran.err)
        assert "evidence" in one_json_document(ran.out)["error"], (how, ran.out)
        assert not changed(before, tree_hashes(runs)), how


def test_report_plots_into_the_run_dir_itself_adds_files_beside_the_evidence(cli, runs):
    before = tree_hashes(runs / "builtin")
    ran = cli(["report", runs / "builtin", "--plots", runs / "builtin", "--json"])
    assert ran.code == 0, ran.err
    assert not changed(before, tree_hashes(runs / "builtin"))
    assert (runs / "builtin" / "report.md").is_file()


def _hold(path: Path) -> int:
    """Hold `path`'s claim as another hicache-diag process would (evidence/claims.py)."""
    from hicache_diag.evidence.claims import _key

    key = _key(path)
    lock = lock_dir() / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"424242\n")
    return fd


@pytest.mark.parametrize(
    ("argv", "held"),
    [
        (["report", "{run}", "--plots", "{out}"], "{out}"),
        (["report", "{run}", "--plots", "{out}"], "{out}/report.md"),
        (["report", "{run}", "--summary", "{out}/s.md"], "{out}/s.md"),
        (["report", "{run}", "--html", "{out}/r.html", "--force"], "{out}/r.html"),
        (["run", "--out", "{out}"], "{out}"),
        (["export", "{sglang}", "--out", "{out}"], "{out}"),
    ],
)
def test_an_output_another_invocation_holds_is_refused_naming_it(
    cli, runs, no_export_probe, argv, held
):
    values = {
        "run": runs / "builtin",
        "sglang": runs / "sglang",
        "out": runs / "user" / "out",
    }
    fd = _hold(Path(held.format(**values)))
    try:
        before = tree_hashes(runs)
        ran = cli([a.format(**values) for a in argv])
    finally:
        os.close(fd)
    assert ran.code == 2, ran.err
    assert "is being written by another hicache-diag (pid 424242)" in ran.err, ran.err
    assert not changed(before, tree_hashes(runs))
    from hicache_diag.evidence.claims import claim, release_all

    claim("--out", Path(held.format(**values)))  # the holder let go: free again
    release_all()


def test_claims_are_given_back_when_the_command_ends(cli, runs):
    from hicache_diag.evidence.claims import held

    ran = cli(["report", runs / "builtin", "--plots", runs / "user" / "p"])
    assert ran.code == 0, ran.err
    assert held() == []
    ran = cli(["report", runs / "builtin", "--plots", runs / "user" / "p"])
    assert ran.code == 2 and "already holds" in ran.err, "a second report: refused, not replaced"


@pytest.mark.parametrize("where", ["the run dir", "its stacks", "a new folder in it"])
def test_storage_dir_never_inside_another_runs_dir(cli, runs, monkeypatch, where):
    monkeypatch.chdir(runs)
    inside = {
        "the run dir": runs / "builtin",
        "its stacks": runs / "builtin" / "stacks",
        "a new folder in it": runs / "builtin" / "l3",
    }[where]
    before = tree_hashes(runs)
    argv = ["run", "--hicache-storage-backend", "file", "--storage-dir", inside, "--json"]
    ran = cli(argv)
    check_output(ran, json_out=True)
    assert ran.code == 2, ran.err
    assert "inside the run directory" in one_json_document(ran.out)["error"]
    assert not changed(before, tree_hashes(runs))
    assert not (runs / "builtin" / "l3").exists()
    assert not (runs / "runs").exists()
