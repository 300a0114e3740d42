"""`hicache-diag triage` through the CLI: every sample, bad input, and live real processes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from hicache_diag.cli.main import app, run_cli

ROOT = Path(__file__).resolve().parents[2]
DUMPS, LOGS = ROOT / "samples" / "dumps", ROOT / "samples" / "logs"
sys.path.insert(0, str(ROOT / "tests" / "unit" / "triage"))
from triage_cluster import FakeCluster  # noqa: E402

runner = CliRunner()


def triage_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["triage", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


# sample -> (exit code, kind, form, cause, culprit label, culprit wait site)
PD = "protocol-deadlock"
SAMPLES = {
    "dumps/pp_hang_pp_sync": (12, "hang", "C", PD, "PP1 TP0", "hicache-pp-sync-recv"),
    "dumps/tp_hang_allreduce": (12, "hang", "C", PD, "PP0 TP0", "hicache-tp-allreduce"),
    "dumps/network_suspect": (12, "hang", "C", "network-suspect", None, None),
    "dumps/healthy_busy": (0, "busy", None, None, None, None),
    # a real run directory of our runtime: stacks/rank{r}.json, ranks mapped by manifest.json
    "dumps/runtime_hang_dma": (12, "hang", "C", PD, "PP1 TP1", "ack-event-synchronize"),
    "logs/form_a_cascade.log": (10, "crash", "A", None, "PP1 TP0", None),
    "logs/form_b_pop_empty.log": (11, "crash", "B", None, "PP1 TP1", None),
    "logs/form_c_watchdog.log": (12, "hang", "C", PD, "PP1 TP0", "storage-queue-get"),
    "logs/nccl_timeout.log": (12, "hang", "C", None, None, None),
    "logs/healthy_busy.log": (0, "busy", None, None, None, None),
    # a real crash of our runtime (legacy protocol, host-alloc-fail on one TP rank): gloo aborts
    # on the mismatched TP collective where NCCL would hang; a crash of no form A/B exits 16.
    # The abort's `terminate called` line carries no rank label: the PP0 TP0 line before it
    # does not make it PP0 TP0's (issue 38: a culprit comes from evidence, never adjacency)
    "logs/runtime_gloo_mismatch.log": (16, "crash", None, None, None, None),
}


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_sample_is_classified(sample):
    code, kind, form, cause, culprit, site = SAMPLES[sample]
    flag = "--dumps" if sample.startswith("dumps/") else "--logs"
    exit_code, data = triage_json(flag, str(ROOT / "samples" / sample))
    assert data["schema"] == "hicache-diag/triage/v1"
    assert (exit_code, data["kind"], data["form"], data["cause"]) == (code, kind, form, cause)
    assert (data["culprit"] or {}).get("label") == culprit
    if site:
        [row] = [r for r in data["ranks"] if r["label"] == culprit]
        assert row["wait_site"] == site and row["state"] == "blocked"


def test_samples_cover_every_file():
    files = {f"dumps/{p.name}" for p in DUMPS.iterdir() if p.is_dir()}
    files |= {f"logs/{p.name}" for p in LOGS.glob("*.log")}
    assert files == set(SAMPLES)


def test_form_a_decodes_token_counts_and_marks_the_cascade():
    _, data = triage_json("--logs", str(LOGS / "form_a_cascade.log"), "--num-heads", "64")
    text = "\n".join(data["evidence"])
    assert "1000 upstream tokens x 64 heads" in text
    assert "secondary (cascade): PP0 TP0" in text


def test_rich_report_has_verdict_table_tree_and_next_steps():
    result = runner.invoke(app, ["triage", "--dumps", str(DUMPS / "tp_hang_allreduce")])
    assert result.exit_code == 12
    out = result.stdout
    assert "HANG · form C · protocol-deadlock — culprit PP0 TP0" in out
    assert "hicache-tp-allreduce" in out and "request-broadcast" in out
    assert "[PP0 TP0]" in out and "[PP0 TP1-3]" in out  # rank-set labels in the tree
    assert "next steps:" in out


def test_several_log_files_after_one_flag_and_markup_safe_text():
    logs = [str(LOGS / "form_a_cascade.log"), str(LOGS / "runtime_gloo_mismatch.log")]
    result = runner.invoke(app, ["triage", "--logs", *logs])
    assert result.exit_code == 10, result.output  # form A's traceback is first in time
    assert "[/pytorch/third_party/gloo" in result.stdout  # printed verbatim, not as markup


def test_collective_mismatch_is_explained():
    _, data = triage_json("--logs", str(LOGS / "runtime_gloo_mismatch.log"))
    text = "\n".join(data["evidence"])
    assert "mismatched collectives" in text and text.count("secondary (cascade)") == 3


def test_merged_stack_tree_in_json():
    _, data = triage_json("--dumps", str(DUMPS / "pp_hang_pp_sync"))
    tree = data["stack_tree"]
    assert tree["count"] == 4 and tree["ranks"] == "PP0 TP0-1, PP1 TP0-1"


# --- bad input: one line on stderr, exit 2, never a traceback ---------------------------------


def one_line_error(argv: list[str], capsys) -> str:
    code = run_cli(["triage", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_no_input(capsys):
    assert "nothing to triage" in one_line_error([], capsys)


def test_empty_and_missing_dump_dirs(tmp_path, capsys):
    assert "no py-spy or faulthandler stacks" in one_line_error(["--dumps", str(tmp_path)], capsys)
    missing = tmp_path / "nope"
    assert "does not exist" in one_line_error(["--dumps", str(missing)], capsys)
    (tmp_path / "afile").write_text("x")
    assert "is a file; give a directory" in one_line_error(
        ["--dumps", str(tmp_path / "afile")], capsys
    )


def test_dump_dir_with_junk_and_unreadable_files(tmp_path, capsys):
    (tmp_path / "junk.txt").write_text("not a stack\n")
    secret = tmp_path / "secret.json"
    secret.write_text("[]")
    secret.chmod(0)
    err = one_line_error(["--dumps", str(tmp_path)], capsys)
    expected = "2 files" if os.geteuid() == 0 else "1 unreadable"
    assert expected in err


def test_logs_with_nothing_recognisable_or_missing(tmp_path, capsys):
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    exit_code, data = triage_json("--logs", str(junk))  # readable, says nothing: undecided
    assert (exit_code, data["kind"]) == (3, "unknown")
    assert "does not exist" in one_line_error(["--logs", str(tmp_path / "none.log")], capsys)
    assert "is a directory" in one_line_error(["--logs", str(tmp_path)], capsys)


def test_positional_files_are_logs_as_the_usage_line_says(tmp_path):
    junk = tmp_path / "junk.log"
    junk.write_text("hello\nworld\n")
    assert triage_json(str(junk)) == triage_json("--logs", str(junk))


def test_bad_numbers(capsys):
    one_line_error(["--pid", "1", "--samples", "0"], capsys)
    one_line_error(["--pid", "1", "--deadline", "0"], capsys)
    one_line_error(["--dumps", str(DUMPS), "--save", "/tmp/x"], capsys)
    one_line_error(["--pid", "abc"], capsys)


def test_dead_pid_is_bad_input(capsys):
    err = one_line_error(["--pid", str(2**22 + 4321)], capsys)
    assert f"--pid {2**22 + 4321}: no such process" in err


@pytest.mark.process
def test_non_python_pid_is_unknown_with_reason(no_leftover_processes):
    import subprocess

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        exit_code, data = triage_json("--pid", str(sleeper.pid), "--samples", "1")
        assert exit_code == 3 and data["kind"] == "unknown"
        assert "not a Python process" in data["reason"]
        assert sleeper.poll() is None  # never signalled
    finally:
        sleeper.kill()
        sleeper.wait()


# --- live: real gloo processes parked in real waits, real py-spy ----------------------------


@pytest.mark.process
def test_live_pp_hang_names_culprit_and_site(no_leftover_processes, tmp_path, capsys):
    with FakeCluster("pp-hang", 2) as cluster:
        pids = [a for pid in cluster.pids for a in ("--pid", str(pid))]
        exit_code, data = triage_json(*pids, "--interval", "0.2", "--save", str(tmp_path))
        first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        # a second save into the same folder is refused before sampling: the bundle is kept
        err = one_line_error([*pids, "--save", str(tmp_path)], capsys)
        assert "--save bundle is written once" in err
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == first
        assert all(psutil.pid_exists(p) for p in cluster.pids)  # read-only
    assert (exit_code, data["kind"], data["cause"]) == (12, "hang", "protocol-deadlock")
    assert data["culprit"]["label"] == "PP1 TP0" and data["samples"] == 2
    culprit = [r for r in data["ranks"] if r["label"] == "PP1 TP0"][0]
    assert culprit["wait_site"] == "hicache-pp-sync-recv" and culprit["progressed"] is False
    # --save then --dumps gives the same verdict offline (dumps from several nodes merge)
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert len(saved) == 4 and saved[0].startswith("PP0_TP0_pid")
    exit_code, offline = triage_json("--dumps", str(tmp_path))
    assert (exit_code, offline["culprit"]["label"]) == (12, "PP1 TP0")


@pytest.mark.process
def test_live_idle_cluster_is_healthy_via_discover(no_leftover_processes):
    with FakeCluster("idle", 2) as cluster:
        # other engineers' clusters run on this host too: only our own tree
        me = str(os.getpid())
        exit_code, data = triage_json("--discover", "--parent", me, "--interval", "0.2")
    assert {r["pid"] for r in data["ranks"]} == set(cluster.pids)
    assert (exit_code, data["kind"]) == (0, "healthy")


@pytest.mark.process
def test_live_busy_cluster_is_not_a_hang(no_leftover_processes):
    with FakeCluster("busy", 2) as cluster:
        pids = [a for pid in cluster.pids for a in ("--pid", str(pid))]
        exit_code, data = triage_json(*pids, "--interval", "0.3", "--samples", "3")
    assert (exit_code, data["kind"]) == (0, "busy")


@pytest.mark.slow
@pytest.mark.process  # starts a fake cluster of real processes
@pytest.mark.parametrize(
    ("scenario", "world", "culprit", "site", "cause"),
    [
        ("tp-hang", 4, "PP0 TP0", "hicache-tp-allreduce", "protocol-deadlock"),
        ("queue-hang", 3, "PP2 TP0", "storage-queue-get", "protocol-deadlock"),
        ("sync-hang", 3, "PP2 TP0", "ack-event-synchronize", "protocol-deadlock"),
        ("straggler", 3, "PP2 TP0", "local-wait", "straggler"),
    ],
)
def test_live_hang_scenarios(no_leftover_processes, scenario, world, culprit, site, cause):
    with FakeCluster(scenario, world) as cluster:
        pids = [a for pid in cluster.pids for a in ("--pid", str(pid))]
        exit_code, data = triage_json(*pids, "--interval", "0.3", "--native")
    assert (exit_code, data["kind"], data["cause"]) == (12, "hang", cause)
    assert data["culprit"]["label"] == culprit
    assert [r["wait_site"] for r in data["ranks"] if r["label"] == culprit] == [site]


def test_watchdog_first_then_cascades_is_a_hang(tmp_path):
    log = tmp_path / "w.log"
    log.write_text(
        "[2026-08-19 21:08:11 PP1 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300)\n"
        "[2026-08-19 21:08:16 PP0 TP0] Scheduler hit an exception: Traceback (most recent call"
        ' last):\n  File "x.py", line 1, in recv_object\nRuntimeError: [pair.cc:547] Connection'
        " closed by peer [1.2.3.4]:1\n"
    )
    exit_code, data = triage_json("--logs", str(log))
    assert (exit_code, data["kind"], data["form"]) == (12, "hang", "C")


def test_server_ready_log_is_healthy(tmp_path):
    log = tmp_path / "r.log"
    log.write_text("[2026-08-19 21:08:11] The server is fired up and ready to roll!\n")
    exit_code, data = triage_json("--logs", str(log))
    assert (exit_code, data["kind"]) == (0, "healthy")


def test_dumps_from_several_nodes_merge(tmp_path):
    import shutil

    for node, pp in (("node0", 0), ("node1", 1)):
        (tmp_path / node).mkdir()
        for f in (DUMPS / "pp_hang_pp_sync").glob(f"pyspy_pp{pp}_*.txt"):
            shutil.copy(f, tmp_path / node / f.name)
    exit_code, data = triage_json(
        "--dumps", str(tmp_path / "node0"), "--dumps", str(tmp_path / "node1")
    )
    assert (exit_code, data["culprit"]["label"], len(data["ranks"])) == (12, "PP1 TP0", 4)


def test_a_run_directory_brings_its_rank_logs(tmp_path):
    (tmp_path / "manifest.json").write_text('{"topology": {"ranks": []}}')
    (tmp_path / "stacks").mkdir()  # a crashed run: no stacks were taken
    (tmp_path / "rank1.log").write_text((LOGS / "form_b_pop_empty.log").read_text())
    exit_code, data = triage_json("--dumps", str(tmp_path))
    assert (exit_code, data["kind"], data["form"]) == (11, "crash", "B")


@pytest.mark.process  # real ranks, one stopped
def test_live_stopped_rank_is_named_the_culprit(no_leftover_processes):
    """A rank stopped with SIGSTOP cannot be suspended by py-spy: its peers wait for it."""
    import signal

    with FakeCluster("pp-hang", 2) as cluster:
        os.kill(cluster.pids[1], signal.SIGSTOP)
        try:
            pids = [a for pid in cluster.pids for a in ("--pid", str(pid))]
            exit_code, data = triage_json(*pids, "--interval", "0.2")
        finally:
            os.kill(cluster.pids[1], signal.SIGCONT)
    assert (exit_code, data["kind"], data["cause"]) == (12, "hang", "straggler")
    assert data["culprit"]["label"] == "PP1 TP0"
    [row] = [r for r in data["ranks"] if r["label"] == "PP1 TP0"]
    assert "could not suspend" in row["error"] and "stopped" in row["error"]


def test_a_binary_log_is_one_line_naming_what_it_looks_like(tmp_path, capsys):
    png = tmp_path / "server.log"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    assert "not a log: a PNG image" in one_line_error(["--logs", str(png)], capsys)
    elf = tmp_path / "scheduler"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    assert "not a log: an ELF binary" in one_line_error([str(elf)], capsys)
