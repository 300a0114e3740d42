"""Real-SGLang scenarios (samples/scenarios/sglang/): each replays its release and its [expect]
holds, through `run --check` (exit 0), a rate scenario's trials on a warm server
(`--warm-server`). Slow: one SGLang launch per file (and per restart), 1-3 minutes each here.

A file whose release is not held (our interpreter, or $HICACHE_DIAG_SGLANG_VENVS/sglang-X) is
skipped with the install command, not failed: holding several releases is a set-up choice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hicache_diag.engines.sglang.release import probe_sglang, release_command, venv_python_for
from hicache_diag.errors import UsageError
from hicache_diag.faults import load_scenario
from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "samples" / "scenarios" / "sglang").glob("*.toml"))


def _held(version: str) -> bool:
    try:
        return probe_sglang(venv_python_for(version)).version == version
    except UsageError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_sglang_scenario_meets_its_expectation(path, tmp_path):
    scenario = load_scenario(path)
    assert scenario.expect is not None, "every real-SGLang sample says what it must produce"
    version = scenario.options["sglang_version"]
    if not _held(version):
        pytest.skip(f"sglang {version} is not held here; {release_command(version)}")
    cmd = [
        sys.executable,
        "-m",
        "hicache_diag.cli.main",
        "run",
        "--engine",
        "sglang",
        "--scenario",
        str(path),
        "--check",
        "--out",
        str(tmp_path / "run"),
        # A rate scenario's trials share a kept server when it proves clean, as a user's would.
        *(["--warm-server"] if scenario.expect.is_rate else []),
    ]
    timeout = 900 * scenario.expect.trials  # a rate scenario runs its trials
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    said = "check: ok, " if scenario.expect.is_rate else "check: ok, the verdict matches [expect]"
    assert said in proc.stderr
    assert_no_children()


def test_every_sglang_sample_names_its_release_and_expectation():
    """Cheap and always run: the files parse, name a release, and expect something."""
    assert FILES, "samples/scenarios/sglang/ holds the real-SGLang scenarios"
    for path in FILES:
        scenario = load_scenario(path)
        assert scenario.options.get("engine") == "sglang", path
        assert isinstance(scenario.options.get("sglang_version"), str), path
        assert scenario.expect is not None, path
        assert path.read_text().startswith("#"), f"{path} comments what it replays"


# Committed run directories (samples/runs/) of real-SGLang scenarios: their verdicts still meet
# the files' [expect] (the classifier or the file changing would show here, without SGLang).
SAMPLE_RUNS = {
    "form_a_dma_delay_0.5.12.post1": "sglang-0.5.12.post1-form-a",
    "dma_delay_load_0.5.23": "sglang-0.5.23-dma-delay",
    "form_a_host_alloc_pp0_0.5.23": "sglang-0.5.23-form-a",
    "form_b_host_alloc_0.5.23": "sglang-0.5.23-form-b",
    "form_c_tp_host_alloc_0.5.13": "sglang-0.5.13-form-c-tp",
    "form_c_tp_host_alloc_0.5.14": "sglang-0.5.14-form-c-tp",
    "form_c_tp_host_alloc_0.5.23": "sglang-0.5.23-form-c-tp",
    "session_close_0.5.23": ("sglang-0.5.23-session-close", "sglang-0.5.23-session-close-sources"),
    "session_timeout_0.5.23": "sglang-0.5.23-session-timeout",
    "flush_clock_0.5.23": "sglang-0.5.23-flush-clock",
    "waiting_timeout_0.5.19": "sglang-0.5.19-waiting-timeout",
    "l3_no_fault_0.5.18": (
        "sglang-0.5.18-l3-no-fault",
        "sglang-0.5.18-l3-no-fault-b",
        "sglang-0.5.18-l3-no-fault-sources",
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLE_RUNS))
def test_committed_sglang_run_meets_its_scenarios_expectation(name):
    import json

    from hicache_diag.diagnosis.classify import classify_run
    from hicache_diag.evidence.verdict import Verdict

    expect = load_scenario(ROOT / "samples" / "scenarios" / "sglang" / f"{name}.toml").expect
    dirs = SAMPLE_RUNS[name]
    for run_name in (dirs,) if isinstance(dirs, str) else dirs:
        run = ROOT / "samples" / "runs" / run_name
        verdict = Verdict.from_json(json.loads((run / "verdict.json").read_text()))
        assert expect.mismatches(verdict) == [], f"the verdict {run_name} gave"
        assert expect.mismatches(classify_run(run)) == [], "today's classifier on its evidence"
        manifest = json.loads((run / "manifest.json").read_text())
        assert load_scenario(ROOT / "samples" / "scenarios" / "sglang" / f"{name}.toml").options[
            "sglang_version"
        ] in json.dumps(manifest)
