"""The slow tier of the issue-41 suite (`-m slow`): the CLI as a real process, attacked the way
the audit did. A full disk mid-run (a small tmpfs, or RLIMIT_FSIZE without root), a stop signal
at a seeded point of run, bisect, triage, report and export (the seed is in the test id: the
same id replays the same point), two processes on one output. After each: no input changed, the
run dir readable by `report`, no process left, stdout one JSON document with --json, no
traceback."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from hicache_diag.evidence.verdict import Outcome
from tests.conftest import tiny_tmpfs
from tests.hostile.invariants import (
    BUILTIN_HANG,
    ROOT,
    SGLANG_CRASH,
    Ran,
    changed,
    check_output,
    one_json_document,
    tree_hashes,
)
from tests.hostile.procs import CLI, SIGNALS, Cli, assert_none_left, seeded_delay

pytestmark = [pytest.mark.slow, pytest.mark.process]
SAMPLES = ROOT / "samples"
RUN = ["run", "--requests", "12", "--json"]  # ~200 steps: a few seconds of stepping


def _report_reads(run_dir: Path, cwd: Path) -> dict:
    """`report RUN --json` as a process: never exit 1; a dir it refuses holds no run yet."""
    ran = Cli(["report", run_dir, "--json"], cwd).wait(120)
    check_output(ran, json_out=True)
    doc = one_json_document(ran.out)
    if ran.code == 2:
        assert "is not a run directory" in doc["error"], doc
    return doc


def _run_dir_is_whole(run_dir: Path, cwd: Path) -> None:
    """A run dir that got its manifest has its verdict, and report reads it."""
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    if (run_dir / "manifest.json").exists():
        assert (run_dir / "verdict.json").is_file(), sorted(p.name for p in run_dir.iterdir())
    _report_reads(run_dir, cwd)


# ---- tool limits ------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", ["0.01", "0.05"])
def test_a_hang_timeout_below_what_the_watch_sees_never_blames_a_rank(tmp_path, timeout):
    cli = Cli([*RUN, "--hang-timeout", timeout, "--out", tmp_path / "run"], tmp_path)
    ran = cli.wait()
    check_output(ran, json_out=True)
    v = one_json_document(ran.out)
    assert (ran.code, v["outcome"], v["culprit_rank"]) == (0, "ok", None), v["evidence"]
    assert any("raised to 1 s" in line for line in v["evidence"]), v["evidence"]
    assert_none_left(cli.mark)


# ---- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, mounted and unmounted here (root); skipped where mount is refused."""
    with tiny_tmpfs(tmp_path / "disk", "4m") as where:
        yield where


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


def _undecided_naming_no_rank(ran: Ran, run_dir: Path, cause: str) -> None:
    check_output(ran, json_out=True)
    v = one_json_document(ran.out)
    assert (ran.code, v["outcome"]) == (3, "undecided"), (ran.code, v.get("evidence"))
    assert v["signature"].startswith(cause), v["signature"]
    assert v["failed_rank"] is None and v["culprit_rank"] is None and v["form"] is None
    on_disk = json.loads((run_dir / "verdict.json").read_text())
    assert on_disk["outcome"] == "undecided" and on_disk["culprit_rank"] is None


def test_a_disk_that_fills_mid_run_leaves_an_undecided_verdict(tmp_path, small_disk):
    run_dir = small_disk / "run"
    cli = Cli([*RUN, "--max-steps", "300", "--out", run_dir], tmp_path)
    deadline = time.time() + 120
    while not (run_dir / "rank0.jsonl").is_file() or not (run_dir / "rank0.jsonl").stat().st_size:
        assert time.time() < deadline and cli.proc.poll() is None, cli.wait().err[-2000:]
        time.sleep(0.02)
    _fill(small_disk)
    ran = cli.wait()
    assert_none_left(cli.mark)
    _undecided_naming_no_rank(ran, run_dir, "disk full")
    (small_disk / "filler").unlink()
    _report_reads(run_dir, tmp_path)


def test_a_file_size_limit_mid_run_leaves_an_undecided_verdict(tmp_path):
    """The same without root: RLIMIT_FSIZE makes the ranks' writes fail (EFBIG)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 << 10, 48 << 10))

    run_dir = tmp_path / "run"
    cli = Cli([*RUN, "--out", run_dir], tmp_path, preexec=limit)
    ran = cli.wait()
    assert_none_left(cli.mark)
    _undecided_naming_no_rank(ran, run_dir, "file size limit reached")
    _report_reads(run_dir, tmp_path)


# ---- a stop signal at any point ---------------------------------------------------------------

# command -> (argv, its outputs under tmp_path, the seconds it typically runs, exits allowed)
_ALWAYS = {0, 3, 130}
COMMANDS = {
    "run": ([*RUN, "--out", "{tmp}/out"], _ALWAYS | set(range(10, 17)), 14.0),
    "bisect": (
        [
            "bisect",
            *("--switch", "host-alloc=local,two-phase", "--trials", "1", "--jobs", "2"),
            *("--requests", "8", "--out", "{tmp}/out", "--json"),
        ],
        _ALWAYS,
        20.0,
    ),
    "triage": (
        ["triage", "--dumps", SAMPLES / "dumps" / "pp_hang_pp_sync", "--json"],
        _ALWAYS | set(range(10, 17)),
        4.0,
    ),
    "report": (["report", BUILTIN_HANG, "--plots", "{tmp}/out", "--json"], _ALWAYS, 6.0),
    "export": (["export", SGLANG_CRASH, "--out", "{tmp}/out"], _ALWAYS, 6.0),
}
SEEDS = (1, 2, 3)


def _cases():
    for command in COMMANDS:
        for name in SIGNALS:
            for seed in SEEDS:
                yield pytest.param(command, name, seed, id=f"{command}-SIG{name}-seed{seed}")


@pytest.mark.parametrize(("command", "sig", "seed"), list(_cases()))
def test_a_stop_signal_at_a_seeded_point(tmp_path, command, sig, seed):
    argv, allowed, typical = COMMANDS[command]
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in argv]
    inputs = tree_hashes(SAMPLES)
    delay = seeded_delay(zlib.crc32(f"{command}-{sig}-{seed}".encode()), 0.2, typical)
    cli = Cli(argv, tmp_path)
    cli.signal_at(SIGNALS[sig], delay)
    ran = cli.wait()
    assert_none_left(cli.mark)
    if ran.code == -SIGNALS[sig] and not ran.out and not ran.err:
        # the signal met the interpreter's own start-up (site-packages), before a line of the
        # tool ran: killed with nothing started and nothing written, as any program is
        assert not (tmp_path / "out").exists(), "killed mid-command"
        return
    check_output(ran, json_out="--json" in argv)
    assert ran.code in allowed, (delay, ran.code, ran.err[-2000:])
    assert not changed(inputs, tree_hashes(SAMPLES)), "a sample (an input) changed"
    out = tmp_path / "out"
    if command == "run":
        _run_dir_is_whole(out, tmp_path)
        if ran.code == 130 and (out / "verdict.json").is_file():
            v = json.loads((out / "verdict.json").read_text())
            assert v["outcome"] == Outcome.INTERRUPTED.value, v
            assert f"SIG{sig}" in v["signature"], v["signature"]
    if command == "bisect" and out.is_dir():
        for trial in out.glob("cell*/trial*"):
            _run_dir_is_whole(trial, tmp_path)
        if ran.out.strip():
            table = one_json_document(ran.out)
            if "cells" in table and not any(c["trials"] for c in table["cells"]):
                assert table["concluded"] is False, table


def test_sighup_mid_run_leaves_a_verdict_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    cli = Cli([*RUN, "--out", run_dir], tmp_path)
    deadline = time.time() + 120
    while not (run_dir / "rank0.jsonl").is_file():
        assert time.time() < deadline and cli.proc.poll() is None
        time.sleep(0.05)
    cli.signal_at(SIGNALS["HUP"], 0)
    ran = cli.wait()
    check_output(ran, json_out=True)
    assert ran.code == 130, ran.err[-2000:]
    v = json.loads((run_dir / "verdict.json").read_text())
    assert v["outcome"] == "interrupted" and "SIGHUP" in v["signature"], v["signature"]
    assert v["failed_rank"] is None and v["culprit_rank"] is None
    assert_none_left(cli.mark)


@pytest.mark.parametrize("after_s", [0.0, 0.3])
def test_bisect_ctrl_c_as_the_last_trial_ends_still_prints_the_table(tmp_path, after_s):
    out = tmp_path / "out"
    argv = ["bisect", "--switch", "host-alloc=local,two-phase", "--trials", "1", "--jobs", "2"]
    cli = Cli([*argv, "--requests", "8", "--out", out, "--json"], tmp_path)
    deadline = time.time() + 180
    while len(list(out.glob("cell*/trial*/verdict.json"))) < 2 and cli.proc.poll() is None:
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(after_s)
    if cli.proc.poll() is None:
        cli.proc.send_signal(SIGNALS["INT"])
    ran = cli.wait()
    check_output(ran, json_out=True)
    table = one_json_document(ran.out)
    assert "cells" in table, table
    assert (out / "table.json").is_file() and (out / "table.md").is_file()
    assert ran.code in (0, 130)
    assert_none_left(cli.mark)


def test_bisect_ctrl_c_before_any_trial_ends_concludes_nothing(tmp_path):
    out = tmp_path / "out"
    argv = ["bisect", "--switch", "host-alloc=local,two-phase", "--trials", "2", "--jobs", "2"]
    cli = Cli([*argv, "--out", out, "--json"], tmp_path)
    deadline = time.time() + 120
    while not list(out.glob("cell*/trial*/rank0.jsonl")):
        assert time.time() < deadline and cli.proc.poll() is None
        time.sleep(0.02)
    cli.proc.send_signal(SIGNALS["INT"])
    ran = cli.wait()
    check_output(ran, json_out=True)
    table = one_json_document(ran.out)
    assert ran.code == 130 and table["interrupted"] is True
    if not any(c["trials"] for c in table["cells"]):
        assert table["concluded"] is False
        assert not any("no failures in 0 trials" in line for line in table["verdict"]), table
    assert_none_left(cli.mark)


# ---- two processes on one output --------------------------------------------------------------


def test_two_reports_on_one_folder_never_both_write(tmp_path):
    other = tmp_path / "other-run"
    shutil.copytree(SAMPLES / "runs" / "form_a", other)
    plots = tmp_path / "plots"
    a = Cli(["report", BUILTIN_HANG, "--plots", plots], tmp_path)
    b = Cli(["report", other, "--plots", plots], tmp_path)
    ran = [a.wait(), b.wait()]
    assert sorted(r.code for r in ran) == [0, 2], [(r.code, r.err[-500:]) for r in ran]
    loser = next(r for r in ran if r.code == 2)
    assert "being written by another hicache-diag" in loser.err or "already holds" in loser.err
    winner_dir = BUILTIN_HANG if ran[0].code == 0 else other
    report = (plots / "report.md").read_text()
    assert winner_dir.name in report and (plots / "report.html").is_file()


def test_two_runs_on_one_out_never_both_write(tmp_path):
    out = tmp_path / "run"
    a = Cli([*RUN, "--out", out], tmp_path)
    time.sleep(0.5)
    b = Cli([*RUN, "--out", out], tmp_path)
    ran = [a.wait(), b.wait()]
    codes = sorted(r.code for r in ran)
    assert codes[0] == 0 and codes[1] == 2, [(r.code, r.err[-500:]) for r in ran]
    assert_none_left(a.mark)
    _report_reads(out, tmp_path)


# ---- the environment and the terminal ---------------------------------------------------------


def test_a_bad_mplbackend_never_stops_the_plots(tmp_path):
    ran = Cli(
        ["report", BUILTIN_HANG, "--plots", tmp_path / "p", "--json"],
        tmp_path,
        env={"MPLBACKEND": "nonsense"},
    ).wait()
    check_output(ran, json_out=True)
    assert ran.code == 0 and (tmp_path / "p" / "report.html").is_file()


def test_columns_zero_on_a_terminal_still_prints(tmp_path):
    import pty

    leader, follower = pty.openpty()
    env = dict(os.environ, COLUMNS="0")
    proc = subprocess.Popen(
        [*CLI, "report", str(BUILTIN_HANG)],
        stdout=follower,
        stderr=follower,
        env=env,
        cwd=tmp_path,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0 and "verdict: hang" in text, text[-1500:]
    assert "COLUMNS='0' is not a positive number; ignored" in text


def test_triage_of_a_live_kernel_thread_is_not_no_such_process(tmp_path):
    if not os.path.exists("/proc/2/comm"):
        pytest.skip("no pid 2 here")
    ran = Cli(["triage", "--pid", "2", "--samples", "1", "--json"], tmp_path).wait(120)
    check_output(ran, json_out=True)
    doc = one_json_document(ran.out)
    assert "no such process" not in json.dumps(doc), doc
