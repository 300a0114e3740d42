"""bench/gpu_check.sh, the prepared GPU check, runs nowhere here; its plumbing does: it parses
(and passes shellcheck where installed), and `--dry-run` goes through the same launch,
readiness, triage, refusal and reaping code with a stand-in server, writing one summary line
per check and its files, leaving no process behind, on a normal end and on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import live_children

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
LINE = re.compile(r"^gpu-check: (\S+): (ok|FAIL|skipped): (.*) \((\d+) s\)$")
CHECKS = ["setup", "gpu", "record", "triage", "dma-delay", "total"]


def _env(out: Path) -> dict[str, str]:
    return {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_script_parses_and_lints():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed here (bash -n passed)")
    done = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_help_and_a_bad_argument():
    done = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Usage: bash bench/gpu_check.sh" in done.stdout
    done = subprocess.run(["bash", str(SCRIPT), "--nope"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "gpu_check: unknown argument '--nope' (--dry-run, --cpu, --wheels DIR)"
    ]


@pytest.mark.process
def test_dry_run_writes_a_line_per_check_and_its_files_and_reaps_the_server(tmp_path):
    out = tmp_path / "gpu-check-out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        env=_env(out),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (out / "summary.txt").read_text().splitlines()
    assert [LINE.match(ln).group(1) for ln in lines] == CHECKS, lines
    assert all(LINE.match(ln).group(2) == "ok" for ln in lines), lines
    assert done.stdout.splitlines()[1:] == lines  # printed as written
    by = {LINE.match(ln).group(1): LINE.match(ln).group(3) for ln in lines}
    assert by["gpu"].startswith("dry run: torch ") and "sees 0 GPU(s)" in by["gpu"]
    assert "--device cuda: torch " in by["dma-delay"] and "needs 1 GPU" in by["dma-delay"]
    # the real CLI answered: the refusal as JSON, triage as JSON (no scheduler under the stand-in)
    refusal = json.loads((out / "dma-delay" / "run.json").read_text())
    assert refusal["schema"] == "hicache-diag/error/v1" and refusal["exit_code"] == 2
    json.loads((out / "record" / "triage.json").read_text())
    assert json.loads((out / "gpu.json").read_text())["count"] == 0
    assert "torch" in (out / "env.txt").read_text()
    assert "would run:" in (out / "setup.log").read_text()
    pid = int((out / "record" / "server.pid").read_text())
    assert _gone(pid), "the stand-in server's group is reaped"
    assert not (out / "dma-delay" / "run").exists(), "the refusal started nothing"
    assert not live_children()


@pytest.mark.process
def test_ctrl_c_reaps_the_server_and_says_so(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--dry-run"],
        env=_env(out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: Ctrl-C reaches the script and its foreground
    )
    try:
        pid_file = out / "record" / "server.pid"
        deadline = time.time() + 120
        while not pid_file.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert pid_file.exists(), proc.communicate(timeout=60)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout
    assert "gpu-check: interrupted" in stdout
    server = int(pid_file.read_text())
    deadline = time.time() + 15
    while not _gone(server) and time.time() < deadline:
        time.sleep(0.2)
    assert _gone(server), "the stand-in server outlived the interrupted script"
