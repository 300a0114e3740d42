"""Generated: every output flag of every command x {a user's existing file, the run dir's own
evidence, a read-only folder, a symlink to a user's file}, with and without --force where the
command has it. Every file there before is hashed before and after: nothing changes unless
--force names a user's file, evidence never; a refusal is one line on stderr, exit 2."""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli

RUNS = Path(__file__).parents[2] / "samples" / "runs"
BUILTIN_RUN = RUNS / "form_a"
SGLANG_RUN = RUNS / "sglang-0.5.23-form-b"  # export takes a real-SGLang crash


@dataclass(frozen=True)
class Flag:
    command: str
    flag: str
    kind: str  # "file" or "dir"
    run: Path | None  # the RUN_DIR argument's sample, when the command takes one
    force: bool  # the command has --force
    writes: str = "notes.txt"  # a name the command writes into a dir flag's folder
    extra: tuple[str, ...] = ()


FLAGS = [
    Flag("report", "--summary", "file", BUILTIN_RUN, True),
    Flag("report", "--html", "file", BUILTIN_RUN, True),
    Flag("report", "--plots", "dir", BUILTIN_RUN, True, writes="report.md"),
    Flag("export", "--out", "dir", SGLANG_RUN, True, writes="REPORT.md"),
    # A run directory is written once: these take only a new or empty folder, no --force.
    Flag("run", "--out", "dir", None, False),
    Flag("bisect", "--out", "dir", None, False, extra=("--switch", "host-alloc=local,two-phase")),
    Flag("timeline", "--out", "dir", None, False),
    Flag("hunt", "--out", "dir", None, False),
    Flag("shrink", "--out", "dir", BUILTIN_RUN, False),
    # A saved triage bundle is written once too (its file names come from the pids sampled),
    # checked before sampling, local and --live alike.
    Flag("triage", "--save", "dir", None, False, extra=("--discover",)),
    Flag("triage", "--save", "dir", None, False, extra=("--live", "--via", "local")),
]
# Every other option that names a path, and why it is not an output the rule guards.
NOT_OUTPUTS = {
    ("run", "--scenario"): "read",
    ("run", "--hicache-storage-dir"): "the L3 store: the backend's own keyed files, shared "
    "across runs on purpose (storage_dir.py checks it is a writable directory)",
    ("run", "--model"): "read",
    ("run", "--sglang-python"): "read: an interpreter to run",
    ("run", "--patch"): "read: a unified diff, applied to a cached overlay of the release "
    "(engines/sglang/patch_overlay.py); the release and the file are never written",
    ("triage", "--dumps"): "read",
    ("triage", "--logs"): "read",
    ("triage", "--fr"): "read: Flight Recorder dumps",
    ("triage", "--ssh-config"): "read",
    ("triage", "--record-dir"): "read; live (--pid/--discover) only the recorder's own protocol "
    "file goes into a live session found there: dump-request.json, replaced whole",
    ("bisect", "--ssh-config"): "read",
    ("run", "--ssh-config"): "read",
    ("triage", "more_logs"): "read",
    ("report", "run_dir"): "read",
    ("report", "--save"): "a switch, not a path: a hunt dir's hunt.json and table.txt, "
    "replaced only with --force (tests/cli/test_report_hunt.py)",
    ("export", "run_dir"): "read",
    ("shrink", "run_dir"): "read",
    ("sources", "--source"): "read",
    ("sources", "--run"): "read",
    ("record", "--dir"): "the recorder's sessions: each launch writes a new folder of its own "
    "inside, never a file it did not make",
    ("record", "--bundle-dir"): "an empty folder or an older copy of the recorder, replaced; "
    "anything else (a file, a symlink, a folder of the user's) is refused "
    "(tests/cli/test_record.py)",
}
# How an option says it names a path: its metavar, or a name outputs have.
PATH_METAVARS = {"DIR", "FILE", "PATH", "RUN_DIR", "LOG"}
OUTPUT_NAMES = {"--out", "--save", "--summary", "--plots", "--html"}
EVIDENCE = ("verdict.json", "rank0.jsonl", "manifest.json", "launcher.json", "rank1.log")
SCENARIOS = ("user-file", "evidence", "evidence-link", "read-only", "symlink")


def _cases():
    for f in FLAGS:
        for scenario in SCENARIOS:
            names = EVIDENCE if scenario == "evidence" and f.kind == "file" else (None,)
            for name in names:
                for force in (False, True) if f.force else (False,):
                    via = "-live" if "--live" in f.extra else ""
                    tag = f"{f.command}{f.flag}{via}-{scenario}{'-' + name if name else ''}"
                    yield pytest.param(f, scenario, name, force, id=f"{tag}-force{int(force)}")


def _snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under `root`: a symlink by its target, a file by its content's hash."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                found[rel] = ("link", os.readlink(p))
            elif p.is_file():
                found[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return found


def _setup(f: Flag, scenario: str, name: str | None, root: Path) -> tuple[str, set[str]]:
    """The flag's value, and the entries --force may replace (a user's file or link)."""
    run = root / "run"
    user = root / "user"
    user.mkdir()
    (user / "mine.txt").write_text("a user's own notes\n")
    if scenario == "user-file":
        target = user / ("mine.txt" if f.kind == "file" else f.writes)
        target.write_text("a user's own notes\n")
        return str(target if f.kind == "file" else user), {str(target.relative_to(root))}
    if scenario == "evidence":
        return str(run / name if f.kind == "file" else run), set()
    if scenario == "evidence-link":
        link = user / ("link.md" if f.kind == "file" else f.writes)
        link.symlink_to(run / "verdict.json")
        return str(link if f.kind == "file" else user), set()
    if scenario == "read-only":
        ro = root / "ro"
        ro.mkdir()
        (ro / "mine.txt").write_text("kept\n")
        ro.chmod(0o555)
        return str(ro / "new.md" if f.kind == "file" else ro), set()
    link = user / ("link.md" if f.kind == "file" else f.writes)
    link.symlink_to(user / "mine.txt")
    return str(link if f.kind == "file" else user), {str(link.relative_to(root))}


def _allowed(f: Flag, scenario: str, force: bool) -> bool:
    """Does the rule let this write happen? Only a user's file with --force, and a folder
    that gains new files beside what it holds (report --plots into the run dir itself)."""
    if force and scenario in ("user-file", "symlink"):
        return True
    return f.command == "report" and f.flag == "--plots" and scenario == "evidence"


@pytest.mark.parametrize(("f", "scenario", "name", "force"), list(_cases()))
def test_nothing_pre_existing_changes_unless_forced(
    f, scenario, name, force, tmp_path, capsys, monkeypatch
):
    from hicache_diag.export import export

    # export without probing an SGLang interpreter (a unit test starts nothing; the rule under
    # test does not depend on the release's source)
    monkeypatch.setattr(export, "run_release", lambda version, python: None)
    monkeypatch.setattr(export, "releases", dict)
    shutil.copytree(f.run or BUILTIN_RUN, tmp_path / "run")  # a run dir beside, always
    value, replaceable = _setup(f, scenario, name, tmp_path)
    before = _snapshot(tmp_path)
    argv = [f.command, *([str(tmp_path / "run")] if f.run else []), *f.extra, f.flag, value]
    argv += ["--force"] if force else []
    try:
        code = run_cli(argv)
    finally:
        for ro in tmp_path.glob("ro"):
            ro.chmod(0o755)
    after = _snapshot(tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    allowed = _allowed(f, scenario, force)
    if allowed:
        assert code == 0, err
    else:
        assert code == 2, err
        assert len(err) == 1 and err[0].startswith("hicache-diag: error:"), err
        assert after == before, "a refusal writes nothing"
    changed = {k for k in before if after.get(k) != before[k]}
    assert changed <= (replaceable if allowed else set()), changed
    if scenario == "symlink" and allowed:  # the link was replaced, never its target
        assert (tmp_path / "user" / "mine.txt").read_text() == "a user's own notes\n"
    if scenario in ("evidence", "evidence-link"):
        run_before = {k: v for k, v in before.items() if k.startswith("run")}
        assert {k: after[k] for k in run_before} == run_before, "evidence is never touched"


def _path_options() -> set[tuple[str, str]]:
    """(command, flag) of every option or argument of every command that names a path."""
    import typer

    from hicache_diag.cli.main import app

    found = set()
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            flag = next((o for o in param.opts if o.startswith("--")), param.name)
            if param.metavar in PATH_METAVARS or flag in OUTPUT_NAMES:
                found.add((name, flag))
    return found


def test_every_output_flag_of_every_command_is_in_the_suite():
    """A new option naming a path fails here until it is either a FLAGS row (the generated
    suite above) or a NOT_OUTPUTS row saying why it writes nothing a user owns."""
    paths = _path_options()
    suite = {(f.command, f.flag) for f in FLAGS}
    unclassified = paths - suite - set(NOT_OUTPUTS)
    assert not unclassified, f"path options in neither FLAGS nor NOT_OUTPUTS: {unclassified}"
    assert suite <= paths and set(NOT_OUTPUTS) <= paths, "a row names no such option"
    assert not suite & set(NOT_OUTPUTS)
