import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hicache_diag.cli import bisect as bisect_cli
from hicache_diag.cli.main import app, run_cli
from hicache_diag.trials.bisect import BisectConfig
from tests.unit.trials.fake_run import FAKE_TRIAL, fake_cells, use_fake


@pytest.fixture
def fake_run(monkeypatch):
    """Trials call the stand-in trial function with the cells' real configs instead of the
    runtime's (real trial processes all the same)."""

    def make(*args, **kw):
        return dataclasses.replace(BisectConfig(*args, **kw), trial=FAKE_TRIAL)

    monkeypatch.setattr(bisect_cli, "BisectConfig", make)
    use_fake(monkeypatch)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--storage-backend", ""], "--hicache-storage-backend needs a comma-separated list"),
        (["--hicache-size", "16MiB,"], "--hicache-size needs a comma-separated list"),
        (["--switch", "ack-count="], "--switch ack-count needs a comma-separated list"),
        (["--switch", "warp=1,2"], "unknown switch 'warp'; valid: ack-count"),
        (["--switch", "lru-clock=monotonic,sundial"], "unknown mode 'sundial'"),
        (["--trials", "0"], "--trials must be >= 1 (got 0)"),
        (["--jobs", "0"], "--jobs must be >= 1 (got 0)"),
        (["--trials", "many"], "Invalid value for '--trials'"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, message):
    assert run_cli(["bisect", "--out", str(tmp_path / "b"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0] and err[0].startswith("hicache-diag: error:")


@pytest.mark.process
def test_bisect_json_schema(fake_run, tmp_path, capsys):
    code = run_cli(
        [
            "bisect",
            "--hicache-size",
            "16MiB,64MiB",
            "--switch",
            "ack-count=local,leader",
            "--trials",
            "4",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "b"),
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "hicache-diag/bisect/v1"
    assert len(data["cells"]) == 4
    keys = {"values", "trials", "failures", "rate", "ci95", "forms", "median_ttf_s", "run_dirs"}
    assert keys <= set(data["cells"][0])
    assert any("removes all failures" in line for line in data["verdict"])


@pytest.mark.process
def test_bisect_table_and_passthrough_flags(fake_run, tmp_path):
    argv = ["bisect", "--storage-backend", "none,file", "--trials", "2", "--protocol", "legacy"]
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "storage-backend" in result.output and "95% CI" in result.output
    assert "verdict: failures with no storage backend" in result.output
    assert "L2-dimension divergence" in result.output


def test_a_bad_passthrough_flag_is_exit_2_before_any_trial(fake_run, tmp_path, capsys):
    argv = ["bisect", "--switch", "ack-count=local,leader", "--bad", "--out", str(tmp_path / "b")]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No such option: --bad" in err[0]
    assert not (tmp_path / "b").exists(), "validated before any trial started"


@pytest.mark.process
def test_switch_over_any_run_option(fake_run, tmp_path, capsys):
    code = run_cli(
        [
            "bisect",
            "--switch",
            "protocol=legacy,full",
            "--switch",
            "async-depth=0,1",
            "--trials",
            "2",
            "--out",
            str(tmp_path / "b"),
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["switches"] == ["protocol", "async-depth"] and len(data["cells"]) == 4
    by = {(c["values"]["protocol"], c["values"]["async-depth"]): c for c in data["cells"]}
    assert by[("legacy", "0")]["failures"] == 1 and by[("full", "1")]["failures"] == 0
    # 0/4 vs 2/4 pooled: the intervals overlap, so the table states no conclusion
    want = "protocol (full: 0/4 (0%) vs legacy: 2/4 (50%)): the 95% intervals overlap"
    assert want in " | ".join(data["verdict"])
    assert not any("removes all failures" in line for line in data["verdict"])
    run_dir = Path(by[("full", "1")]["run_dirs"][0])
    assert run_dir.name == "trial0-seed0" and "async-depth=1" in run_dir.parent.name


@pytest.mark.process
def test_bisect_saves_its_table_in_out(fake_run, tmp_path, capsys):
    out = tmp_path / "b"
    assert (
        run_cli(
            [
                "bisect",
                "--switch",
                "ack-count=local,leader",
                "--trials",
                "2",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((out / "table.json").read_text()) == printed
    md = (out / "table.md").read_text()
    assert "| ack-count | trials |" in md and "| local | 2 | 1 |" in md


@pytest.mark.process
def test_a_trial_timeout_is_undecided_everywhere_and_concludes_nothing(fake_run, tmp_path, capsys):
    """Issue 29: `--trial-timeout` too small once said "no failures in 0 trials", exit 0."""
    out = tmp_path / "b"
    argv = ["bisect", "--switch", "ack-count=local,leader", "--trials", "2"]
    assert run_cli([*argv, "--trial-timeout", "0.001", "--out", str(out), "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"][0].startswith("no trial finished: nothing concluded (4 undecided")
    assert not any("no failures" in line for line in data["verdict"])
    md = (out / "table.md").read_text()
    assert "| local | 0 | 0 | - | - | - | - | 2 (trial timeout 0.001s: 2) |" in md
    verdicts = [json.loads(p.read_text()) for p in out.glob("cell*/trial*/verdict.json")]
    assert len(verdicts) == 4 and {v["outcome"] for v in verdicts} == {"undecided"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--switch", "host-alloc=local"], "has one value (local): nothing to compare"),
        (["--switch", "host-alloc=local,local"], "lists 'local' twice"),
        (["--storage-backend", "none,file", "--out", "{file}"], "is a file"),
    ],
)
def test_flat_axes_and_a_file_out_are_refused(capsys, tmp_path, argv, message):
    (tmp_path / "f").write_text("x")
    argv = [a.replace("{file}", str(tmp_path / "f")) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "b")]
    assert run_cli(["bisect", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "b").exists()


def _venvs(root: Path, *versions: str) -> Path:
    for v in versions:
        py = root / f"sglang-{v}" / "bin" / "python"
        py.parent.mkdir(parents=True)
        py.write_text("")
    return root


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--sglang-version", "0.5.18,0.5.21"], None, "add --engine sglang"),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.18,0.5.21"],
            None,
            "--sglang-version 0.5.18: set $HICACHE_DIAG_SGLANG_VENVS",
        ),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.18,0.5.21"],
            "0.5.18",
            "--sglang-version 0.5.21: no {venvs}/sglang-0.5.21/bin/python; create it with: ",
        ),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.18,"],
            "0.5.18",
            "--sglang-version needs a comma-separated list",
        ),
        (
            ["--engine", "sglang", "--sglang-version", "0.5.18,0.5.18"],
            "0.5.18",
            "bisect axis sglang-python lists",
        ),
        (
            ["--engine", "sglang", "--sglang-python", "/a,/b", "--sglang-version", "0.5.18"],
            None,
            "--sglang-python and --sglang-version both name the releases: give one",
        ),
        (
            ["--engine", "sglang", "--sglang-python", "/a,/b", "--switch", "sglang-python=/c,/d"],
            None,
            "bisect axis sglang-python is given twice",
        ),
    ],
)
def test_release_axis_bad_input_is_one_line_exit_2(
    capsys, tmp_path, monkeypatch, argv, env, message
):
    monkeypatch.delenv("HICACHE_DIAG_SGLANG_VENVS", raising=False)
    venvs = tmp_path / "venvs"
    if env is not None:
        monkeypatch.setenv("HICACHE_DIAG_SGLANG_VENVS", str(_venvs(venvs, env)))
    assert run_cli(["bisect", "--out", str(tmp_path / "b"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message.replace("{venvs}", str(venvs)) in err[0], err[0]
    assert not (tmp_path / "b").exists()


@pytest.mark.process
def test_release_axis_names_the_first_fixed_release(fake_run, tmp_path, monkeypatch, capsys):
    venvs = _venvs(tmp_path / "venvs", "0.5.18", "0.5.21")
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_VENVS", str(venvs))
    monkeypatch.setattr(
        bisect_cli,
        "with_cell_configs",  # no probe
        lambda base, cfg, timeout: (fake_cells(cfg), 2),
    )
    code = run_cli(
        [
            "bisect",
            "--engine",
            "sglang",
            "--sglang-version",
            "0.5.21,0.5.18",
            "--trials",
            "4",
            "--jobs",
            "2",
            "--out",
            str(tmp_path / "b"),
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["switches"] == ["sglang-python"]
    assert set(data["releases"].values()) == {"0.5.18", "0.5.21"}
    by = {data["releases"][c["values"]["sglang-python"]]: c for c in data["cells"]}
    assert (by["0.5.18"]["failures"], by["0.5.21"]["failures"]) == (4, 0)
    assert data["verdict"] == [
        "first release where the failure rate drops: 0.5.21 "
        "(0.5.18: 4/4 (100%) vs 0.5.21: 0/4 (0%))"
    ]
    md = (tmp_path / "b" / "table.md").read_text()
    assert "| 0.5.18 | 4 | 4 |" in md


_FIX = Path(__file__).resolve().parents[2] / "samples" / "exports" / "session-reap" / "fix.patch"


def _needs_0523():
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sglang")
    except PackageNotFoundError:
        found = None
    if found != "0.5.23":
        pytest.skip(f"the committed fix.patch is against sglang 0.5.23 (here: {found})")


@pytest.mark.process
def test_a_patch_is_an_axis_each_cell_on_its_own_overlay_and_server(tmp_path):
    """`--switch patch=none,FILE`: two cells built before any trial, the patched one with the
    overlay first on its launch's path and the patch's sha in its manifest facts; each trial's
    line reproduces its cell, and the two cells' warm servers have different keys."""
    import hashlib

    from hicache_diag.cli.bisect import BisectRequest, plan_bisect
    from hicache_diag.engines.sglang.warm import _key
    from hicache_diag.trials.bisect import trial_argv

    _needs_0523()
    run_args = ["--engine", "sglang", "--pp", "2", "--warm-server"]
    axis = (f"patch=none,{_FIX}",)
    req = BisectRequest(run_args, None, None, axis, 2, 1, 0, str(tmp_path / "b"), None, None, None)
    cfg, _ = plan_bisect(req, quiet=True)
    assert [a.name for a in cfg.axes] == ["patch"] and cfg.warm is not None
    plain, fixed = cfg.cells
    assert plain.spec.pythonpath == () and "patch" not in plain.release
    facts = fixed.release["patch"]
    assert facts["sha256"] == hashlib.sha256(_FIX.read_bytes()).hexdigest()
    assert fixed.spec.pythonpath == (facts["overlay"],)
    assert "sglang/srt/session/session_controller.py" in facts["files"]
    assert _key(plain) != _key(fixed)
    line = trial_argv(cfg, {"patch": str(_FIX)}, 3, tmp_path / "t")
    assert line[line.index("--patch") + 1] == str(_FIX) and "--warm-server" not in line
    line = trial_argv(cfg, {"patch": "none"}, 3, tmp_path / "t")
    assert line[line.index("--patch") + 1] == "none"


@pytest.mark.process
def test_a_patch_axis_value_that_does_not_apply_is_refused_before_any_trial(tmp_path, capsys):
    _needs_0523()
    stale = tmp_path / "stale.patch"
    stale.write_text(_FIX.read_text().replace("     def maybe_reap(", "     def maybe_reaps("))
    argv = ["bisect", "--engine", "sglang", "--switch", f"patch=none,{stale}"]
    assert run_cli([*argv, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not apply to sglang 0.5.23" in err[0], err
    assert not (tmp_path / "b").exists()
