import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hicache_diag.engines.builtin.runtime.protocol import SWITCHES
from hicache_diag.errors import UsageError
from hicache_diag.trials.bisect import (
    Axis,
    BisectConfig,
    matrix,
    parse_switch,
    parse_values,
    run_bisect,
    trial_argv,
)
from tests.unit.trials.fake_run import FAKE_TRIAL, fake_cells, use_fake


@pytest.fixture(autouse=True)
def _fake(monkeypatch):
    use_fake(monkeypatch)


def cfg(tmp_path, axes, **kw):
    return fake_cells(BisectConfig(tuple(axes), out=tmp_path / "b", trial=FAKE_TRIAL, **kw))


def test_parse_values_and_switches():
    assert parse_values("--x", "none, file") == ("none", "file")
    for bad in ("", " ", "a,,b", "a,"):
        with pytest.raises(UsageError, match="comma-separated"):
            parse_values("--x", bad)
    got = parse_switch("ack-count=local,leader", switches=SWITCHES)
    assert (got.name, got.values) == ("ack-count", ("local", "leader")) and got.switch
    with pytest.raises(UsageError, match="unknown mode 'nope'.*valid: local, leader-batched"):
        parse_switch("ack-count=local,nope", switches=SWITCHES)
    with pytest.raises(UsageError, match="unknown switch 'warp'; valid: ack-count"):
        parse_switch("warp=1,2", run_options={"async-depth": "async_depth"}, switches=SWITCHES)
    axis = parse_switch("async-depth=0,1", {"async-depth": "async_depth"})
    assert (axis.values, axis.field) == (("0", "1"), "async_depth")
    with pytest.raises(UsageError, match="malformed"):
        parse_switch("ack-count")


def test_config_rejects_bad_counts(tmp_path):
    with pytest.raises(UsageError, match="--trials must be >= 1"):
        cfg(tmp_path, [], trials=0)
    with pytest.raises(UsageError, match="--jobs must be >= 1"):
        cfg(tmp_path, [], jobs=0)


def test_matrix_and_trial_argv(tmp_path):
    axes = (
        Axis("storage-backend", ("none", "file")),
        Axis("ack-count", ("local", "leader"), "ack counts (#27285)"),
    )
    assert len(matrix(axes)) == 4
    c = cfg(tmp_path, axes, run_args=("--protocol", "legacy"))
    argv = trial_argv(c, {"storage-backend": "file", "ack-count": "leader"}, 3, tmp_path / "o")
    assert argv[:2] == ["hicache-diag", "run"]
    assert argv[2:] == [
        "--protocol",
        "legacy",
        "--storage-backend",
        "file",
        "--switch",
        "ack-count=leader",
        "--seed",
        "3",
        "--out",
        str(tmp_path / "o"),
        "--json",
    ]


@pytest.mark.process
def test_bisect_over_real_subprocesses(tmp_path):
    axes = [
        Axis("hicache-size", ("16MiB", "64MiB")),
        Axis("ack-count", ("local", "leader"), "ack counts (#27285)"),
    ]
    seen = []
    table = run_bisect(cfg(tmp_path, axes, trials=4, jobs=2), lambda c, r: seen.append(r))
    assert len(seen) == 16
    data = table.to_json()
    assert data["schema"] == "hicache-diag/bisect/v1"
    assert data["switches"] == ["hicache-size", "ack-count"]
    cells = {(c["values"]["hicache-size"], c["values"]["ack-count"]): c for c in data["cells"]}
    small = cells[("16MiB", "local")]
    assert (small["trials"], small["failures"], small["rate"]) == (4, 2, 0.5)
    assert small["forms"] == {"A": 2} and small["median_ttf_s"] == 2.0  # seeds 0, 2 failed
    assert cells[("64MiB", "local")]["ci95"] == [0.5101, 1.0]
    assert cells[("16MiB", "leader")]["failures"] == 0
    assert len(small["run_dirs"]) == 4 and all(Path(d).is_dir() for d in small["run_dirs"])
    verdict = " | ".join(data["verdict"])
    # pooled 2/8 vs 4/8: the intervals overlap, so no host-size conclusion is stated
    assert "host size (16MiB: 2/8 (25%) vs 64MiB: 4/8 (50%)): the 95% intervals overlap" in verdict
    assert "eviction-pressure related" not in verdict
    assert "ack-count=leader removes all failures" in verdict and "#27285" in verdict


@pytest.mark.process
def test_failures_without_storage_backend_name_the_l2_dimension(tmp_path):
    axes = [Axis("storage-backend", ("none", "file"))]
    table = run_bisect(cfg(tmp_path, axes, trials=2, run_args=("--protocol", "legacy")))
    assert any("L2-dimension divergence" in line for line in table.verdict())


@pytest.mark.process
def test_bad_trial_arguments_abort_with_one_line(tmp_path):
    with pytest.raises(UsageError, match="trial rejected its arguments: .*unknown fault"):
        run_bisect(cfg(tmp_path, [], run_args=("--bad",), trials=3))


def _alive(pid_file: Path) -> bool:
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


@pytest.mark.process
def test_trial_timeout_kills_the_trial(tmp_path):
    table = run_bisect(cfg(tmp_path, [], run_args=("--sleep",), trial_timeout_s=1.0))
    cell = table.cells[0].to_json()
    assert cell["trials"] == 0 and "timed out after 1s" in cell["errors"][0]
    assert not any(_alive(p) for p in (tmp_path / "b").rglob("pid"))
    # undecided, with the cause, in the table and in every trial's own verdict.json
    assert (cell["undecided"], cell["undecided_causes"]) == (3, {"trial timeout 1s": 3})
    assert table.exit_code == 3 and table.verdict()[0].startswith("no trial finished")
    for run_dir in cell["run_dirs"]:
        verdict = json.loads((Path(run_dir) / "verdict.json").read_text())
        assert verdict["outcome"] == "undecided" and "--trial-timeout" in verdict["signature"]


@pytest.mark.process
def test_ctrl_c_returns_the_partial_table_and_leaves_no_trial(tmp_path, monkeypatch):
    """Trials forked by the warm trial server (the default), killed group by group."""
    monkeypatch.delenv("HICACHE_DIAG_TRIAL_START")
    script = (
        "import json, sys; from pathlib import Path\n"
        "from hicache_diag.trials.bisect import BisectConfig, run_bisect\n"
        "from tests.unit.trials.fake_run import FAKE_TRIAL, fake_cells\n"
        f"c = fake_cells(BisectConfig((), trials=4, jobs=2, out=Path({str(tmp_path / 'b')!r}), "
        "trial=FAKE_TRIAL, run_args=('--sleep',)))\n"
        "print(json.dumps(run_bisect(c).to_json()))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60  # the server imports torch first
    while len(list((tmp_path / "b").rglob("pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = list((tmp_path / "b").rglob("pid"))
    assert len(pids) == 2
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    data = json.loads(out)
    assert data["interrupted"] is True and data["cells"][0]["trials"] == 0
    assert "interrupted: partial table" in data["verdict"]
    assert len(list((tmp_path / "b").rglob("pid"))) == 2  # no new trial started after Ctrl-C
    assert not any(_alive(p) for p in pids)


@pytest.mark.process
def test_failures_no_axis_explains_still_get_a_verdict_line(tmp_path):
    table = run_bisect(cfg(tmp_path, [], trials=2, run_args=("--protocol", "legacy")))
    assert table.verdict() == [
        "1/2 trials failed and no axis here removes the failures: vary a protocol switch "
        "(--switch NAME=legacy,fixed)"
    ]
