"""The CLI's own policies under hostile use (issue 41.3 and 41.5), in this process: --json is
one document on every exit, a flag given twice is refused, terminal control from a file is
shown not obeyed, the environment read one way, tool limits never a rank's fault, --check and
[expect] that cannot decide or match, bisect that concluded nothing."""

from __future__ import annotations

import json
import shutil
import time
from types import SimpleNamespace

import pytest
import typer

from hicache_diag.cli.main import app
from tests.hostile.invariants import BUILTIN_HANG, check_output, one_json_document

COMMANDS = sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_refusal_under_json_is_one_json_document(cli, command):
    ran = cli([command, "--no-such-flag", "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2
    doc = one_json_document(ran.out)
    assert doc["error"] == "No such option: --no-such-flag" and doc["exit_code"] == 2, doc
    assert doc["schema"] == "hicache-diag/error/v1"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--pp", "0", "--json"],
        ["triage", "--json"],
        ["report", "/nonexistent/run", "--json"],
        ["bisect", "--trials", "1", "--json"],
        ["timeline", "--pp", "0", "--json"],
        ["sources", "--diff", "a", "--json"],
    ],
)
def test_a_refusal_in_the_command_itself_is_one_json_document(cli, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = cli(argv)
    check_output(ran, json_out=True)
    doc = one_json_document(ran.out)
    assert set(doc) == {"schema", "error", "exit_code"} and doc["exit_code"] == ran.code == 2, doc


def _single_valued() -> list[tuple[str, str]]:
    """(command, option) for every option that takes one value, of every command."""
    out = []
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
            if not opts or getattr(param, "multiple", False) or getattr(param, "is_flag", False):
                continue
            if getattr(param, "count", False) or opts[0] in ("--help",):
                continue
            out.append((name, opts[0]))
    return out


@pytest.mark.parametrize(("command", "option"), _single_valued(), ids="{0[0]} {0[1]}".format)
def test_a_flag_given_twice_is_refused_never_the_last_kept(cli, command, option):
    ran = cli([command, option, "1", option, "2", "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2, ran.err
    error = one_json_document(ran.out)["error"]
    assert error.startswith(f"{option} 1 and {option} 2: one option given twice"), error


def test_an_alias_given_beside_its_option_is_the_same_option_twice(cli):
    ran = cli(["run", "--storage-dir", "a", "--hicache-storage-dir", "b"])
    assert ran.code == 2 and "given twice" in ran.err, ran.err
    ran = cli(["run", "--fault", "rank-stall:ms=1", "--fault", "dma-delay:ms=1", "--pp", "0"])
    assert "given twice" not in ran.err, "a repeatable flag is not refused"


def test_escape_sequences_from_verdict_json_never_reach_the_terminal(cli, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(BUILTIN_HANG, run)
    data = json.loads((run / "verdict.json").read_text())
    data["signature"] = "boom \x1b]0;PWNED\x07 \x1b[2J\x9b31m"
    data["evidence"].append("\x1b[31mred\x1b[0m \r overwritten")
    (run / "verdict.json").write_text(json.dumps(data))
    ran = cli(["report", run])
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    for raw in ("\x1b]0", "\x1b[2J", "\x07", "\x9b", "\x1b[31mred"):
        assert raw not in text, repr(raw)
    assert "␛]0;PWNED" in text, "shown, as a visible symbol"
    ran = cli(["report", run, "--json"])  # JSON escapes them (\u001b)
    assert one_json_document(ran.out)["signature"] == data["signature"]


def test_a_bad_terminal_size_is_dropped_and_said():
    from hicache_diag.cli.render.console import drop_bad_terminal_size

    env = {"COLUMNS": "0", "LINES": "-3"}
    said = drop_bad_terminal_size(env)
    assert env == {} and len(said) == 2 and "COLUMNS='0'" in said[0]
    env = {"COLUMNS": "100"}
    assert drop_bad_terminal_size(env) == [] and env == {"COLUMNS": "100"}


@pytest.mark.parametrize("value", ["OFF", "Off", "no", " 0 "])
def test_recording_off_reads_the_same_in_the_check_and_the_recorder(monkeypatch, value):
    from hicache_diag.engines.builtin.probes.recorder import recording_on
    from hicache_diag.options.env_vars import check_environment

    monkeypatch.setenv("HICACHE_DIAG_RECORD", value)
    check_environment()  # accepted...
    assert recording_on() is False  # ...and recording is off


def test_a_recording_switch_neither_on_nor_off_is_refused(cli, monkeypatch):
    monkeypatch.setenv("HICACHE_DIAG_RECORD", "maybe")
    ran = cli(["report", BUILTIN_HANG, "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2 and "HICACHE_DIAG_RECORD" in one_json_document(ran.out)["error"]


def test_ssh_config_that_is_a_device_is_blamed_on_the_file(cli):
    ran = cli(["triage", "--live", "--via", "ssh", "--hosts", "n1", "--ssh-config", "/dev/zero"])
    assert ran.code == 2 and "--ssh-config '/dev/zero' is not a regular file" in ran.err


# ---- tool limits are the tool's --------------------------------------------------------------


def test_a_hang_timeout_shorter_than_the_watch_can_see_is_raised_with_a_note():
    from hicache_diag.trials.hang_watch import MIN_HANG_TIMEOUT_S, usable_hang_timeout

    notes: list[str] = []
    assert usable_hang_timeout(0.01, 0.1, notes) == MIN_HANG_TIMEOUT_S
    assert "--hang-timeout 0.01 s is shorter than the engine can show progress in" in notes[0]
    assert usable_hang_timeout(5.0, 0.1, notes) == 5.0 and len(notes) == 1


class _EndedEngine:
    """Ranks that stepped, then ended (the workload done) while the loop still polls."""

    poll_s = 0.05
    busy = None
    line_clock = False

    def __init__(self, live: bool, run_for: float) -> None:
        self.started_at = time.time()
        self._live, self._until = live, time.time() + run_for
        self.stopped = None

    def running(self):
        return time.time() < self._until and self.stopped is None

    def poll(self, now):
        return []

    def activity(self):
        return 0.0

    def kernel_states(self):
        return {}

    def live(self):
        return (
            [SimpleNamespace(rank=0, pid=1), SimpleNamespace(rank=1, pid=1)] if self._live else []
        )

    alive = live

    def ranks(self):
        return self.live()

    def startup_grace(self, timeout):
        return 15.0

    def dump_stacks(self, run_dir, skip):
        from hicache_diag import evidence as ev

        return ev.StacksRecord("test")

    def stop(self, state):
        self.stopped = state


@pytest.mark.parametrize("live", [False, True])
def test_a_hang_needs_a_live_rank_and_never_the_watchs_own_clock(tmp_path, live):
    from hicache_diag.trials.engine import TrialWatch
    from hicache_diag.trials.trial import _watch_loop

    for r in (0, 1):
        (tmp_path / f"rank{r}.jsonl").write_text(json.dumps({"step": 204, "t": 1.0}) + "\n")
    engine = _EndedEngine(live, run_for=2.5)
    watch = TrialWatch()
    t0 = time.time()
    _watch_loop(engine, SimpleNamespace(world_size=2, hang_timeout=0.01), tmp_path, watch, None)
    if not live:  # ranks gone: however long since their last step, no hang
        assert watch.hang is None and engine.stopped is None
    else:  # stalled live ranks: a hang, but only after the raised timeout, not 0.01 s
        assert watch.hang is not None and engine.stopped == "hung"
        assert time.time() - t0 >= 1.0
    assert any("raised to 1 s" in n for n in watch.notes)


# ---- --check and [expect] ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('outcome = "ok"\nform = "A"', "can never match"),
        ('outcome = "crash"\nform = "C"', "can never match"),
        ('outcome = "ok"\nculprit_rank = 1', "names no rank"),
        ('outcome = "ok"\nsource = "host-alloc"', "has no first divergence"),
        ('outcome = "undecided"\nculprit_rank = 0', "names no rank"),
        (
            'outcome = "crash"\ntrials = 5\nrate_at_least = 0.8\nrate_at_most = 0.2',
            "contradict",
        ),
        ('outcome = "crash"\ntrials = 5\nrate_at_least = 0', "checks nothing"),
        ('outcome = "crash"\ntrials = 5\nrate_at_most = 1', "checks nothing"),
    ],
)
def test_an_expect_table_that_can_never_match_is_refused_at_parse_time(
    cli, tmp_path, table, needle
):
    scenario = tmp_path / "s.toml"
    scenario.write_text(f"pp = 2\n[expect]\n{table}\n")
    ran = cli(["run", "--scenario", scenario, "--check", "--json"])
    check_output(ran, json_out=True)
    assert ran.code == 2 and needle in one_json_document(ran.out)["error"], ran.out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("outcome", ["undecided", "interrupted"])
def test_check_never_calls_an_undecided_run_a_mismatch(cli, tmp_path, monkeypatch, outcome):
    from hicache_diag.cli import run as run_cli_module
    from hicache_diag.evidence.verdict import Outcome, Verdict

    verdict = Verdict(Outcome(outcome), signature="step budget exhausted")

    def fake_trial(cfg, argv, on_progress=None):
        return SimpleNamespace(verdict=verdict, run_dir=tmp_path / "r")

    monkeypatch.setattr(run_cli_module, "run_trial", fake_trial)
    scenario = tmp_path / "s.toml"
    scenario.write_text('pp = 2\n[expect]\noutcome = "crash"\nform = "B"\n')
    ran = cli(["run", "--scenario", scenario, "--check", "--out", tmp_path / "r"])
    assert ran.code == int(verdict.exit_code) != 4, ran.err
    assert "not checked, the run decided nothing" in ran.err and "MISMATCH" not in ran.err


def test_bisect_interrupted_before_any_trial_concludes_nothing():
    from hicache_diag.diagnosis.bisect_table import BisectTable, Cell

    table = BisectTable(["ack-count"], [Cell({"ack-count": "local"})], interrupted=True)
    data = table.to_json()
    assert data["concluded"] is False and table.exit_code == 130
    assert not any("no failures in 0 trials" in line for line in data["verdict"]), data


def test_faults_that_never_fired_are_not_called_injected(tmp_path):
    from hicache_diag.diagnosis.classify import classify_run
    from tests.unit.diagnosis.builder import RunDir

    rd = RunDir(tmp_path, steps=4)
    rd.manifest["faults"] = ["dma-delay:rank=1,ms=5", "rank-stall:rank=0,ms=5"]
    rd.set(0, 2, faults_fired=[{"fault": "rank-stall", "step": 2}])
    v = classify_run(rd.write())
    assert "faults injected: rank-stall:rank=0,ms=5" in v.evidence
    assert "faults asked for that never fired: dma-delay:rank=1,ms=5" in v.evidence


def test_a_too_long_name_is_one_line_not_errno_36(cli, tmp_path):
    long = tmp_path / ("n" * 300)
    for argv in (
        ["run", "--out", long],
        ["report", BUILTIN_HANG, "--plots", long],
        ["report", long],
        ["run", "--hicache-storage-backend", "file", "--storage-dir", long / "l3"],
    ):
        ran = cli([*argv, "--json"])
        check_output(ran, json_out=True)
        assert ran.code == 2 and "300 bytes long" in one_json_document(ran.out)["error"], argv
