"""Odd inputs (issue 29.7): well-formed, but they would do nothing or contradict each other. One
row per input over every command, scenario keys and environment variables: each is refused
before anything starts, exit 2, in one line that names the input (the run options' rules,
each command's CHECKS table, env_vars.py's); a `warn` row goes on, and its one warning line
names the input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hicache_diag.cli.main import run_cli
from tests.conftest import live_children

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
DUMPS = str(SAMPLES / "dumps" / "pp_hang_pp_sync")
CRASH_RUN = str(SAMPLES / "runs" / "form_a")  # builtin: form A crash
OK_RUN = str(SAMPLES / "runs" / "healthy")
SWITCH = ["--switch", "ack-count=local,leader"]
SGLANG = ["--engine", "sglang"]


@dataclass(frozen=True)
class Odd:
    id: str
    argv: tuple[str, ...]
    names: str  # what the line must say: the input, as written
    env: tuple[tuple[str, str], ...] = ()
    warn: bool = False  # a warning, then the command goes on (to `code`)
    code: int = 2


def odd(id: str, argv: list[str], names: str, **kw) -> Odd:
    return Odd(id, tuple(argv), names, **kw)


ODD = [
    # run: faults that cannot act, or act as nothing
    odd("p2p-delay-pp1", ["run", "--pp", "1", "--fault", "p2p-delay:ms=5"], "--pp 1"),
    odd("stall-of-0ms", ["run", "--fault", "rank-stall:rank=1,ms=0"], "ms=0"),
    odd("dma-delay-of-0ms", ["run", "--fault", "dma-delay:ms=0"], "ms=0,jitter-ms=0"),
    odd("fault-p0", ["run", "--fault", "dma-delay:ms=5,p=0"], "p=0"),
    odd(
        "window-past-budget",
        ["run", "--fault", "dma-delay:ms=5,after=500", "--max-steps", "100"],
        "after=500, past --max-steps 100",
    ),
    odd("window-never-opens", ["run", "--fault", "dma-delay:ms=5,after=9,until=3"], "until=3"),
    odd("l3-fault-no-l3", ["run", "--fault", "l3-partial-hit:p=1"], "'l3-partial-hit'"),
    odd("50000-faults", ["run", *["--fault", "rank-stall:ms=1"] * 50_000], "50000 faults"),
    # run: flags that contradict or need another
    odd(
        "two-fixes",
        ["run", "--switch", "ack-count=local", "--switch", "ack-count=leader"],
        "--switch ack-count=local and --switch ack-count=leader",
    ),
    odd(
        "size-and-ratio",
        ["run", "--hicache-size", "64MiB", "--hicache-ratio", "3"],
        "--hicache-size and --hicache-ratio",
    ),
    odd("storage-dir-no-l3", ["run", "--storage-dir", "{tmp}"], "storage-dir does nothing"),
    odd("check-no-scenario", ["run", "--check"], "--check needs --scenario"),
    odd("model-builtin", ["run", "--model", "{tmp}"], "--model applies to --engine sglang"),
    odd(
        "list-faults-with-run-flags",
        ["run", "--list-faults", "--pp", "4", "--fault", "rank-stall:ms=1"],
        "it ignores --fault, --pp",
        warn=True,
        code=0,
    ),
    # run across hosts (engines/sglang/remote_nodes.py checks the hosts themselves)
    odd("hosts-builtin", ["run", "--hosts", "a,b"], "--hosts applies to --engine sglang"),
    odd("hosts-no-nnodes", ["run", *SGLANG, "--hosts", "a,b"], "give --nnodes 2"),
    odd(
        "hosts-count",
        ["run", *SGLANG, "--nnodes", "2", "--hosts", "a,b,c"],
        "--hosts names 3 host(s) for --nnodes 2",
    ),
    odd(
        "run-via-slurm",
        ["run", *SGLANG, "--nnodes", "2", "--hosts", "a,b", "--via", "slurm"],
        "run --via slurm: not built",
    ),
    odd(
        "run-via-kubectl",
        ["run", *SGLANG, "--nnodes", "2", "--hosts", "a,b", "--via", "kubectl"],
        "run --via kubectl: not built",
    ),
    odd("run-via-ssh-no-hosts", ["run", *SGLANG, "--nnodes", "2", "--via", "ssh"], "--via ssh"),
    odd(
        "run-ssh-config-no-hosts",
        ["run", *SGLANG, "--nnodes", "2", "--ssh-config", "{tmp}/file"],
        "--ssh-config places",
    ),
    odd(
        "run-warm-server-hosts",
        ["run", *SGLANG, "--nnodes", "2", "--hosts", "a,b", "--warm-server"],
        "--warm-server",
    ),
    # bisect
    odd("bisect-check", ["bisect", *SWITCH, "--check"], "--check does nothing in bisect"),
    odd("bisect-one-value", ["bisect", "--switch", "ack-count=local"], "has one value (local)"),
    odd("bisect-value-twice", ["bisect", "--switch", "ack-count=local,local"], "'local' twice"),
    odd(
        "bisect-idle-jobs",
        ["bisect", *SWITCH, "--trials", "1", "--jobs", "8", "--check"],
        "--jobs 8: the matrix has 2 trial(s)",
        warn=True,
    ),
    # triage
    odd("interval-with-dumps", ["triage", "--dumps", DUMPS, "--interval", "2"], "--interval"),
    odd("samples-with-dumps", ["triage", "--dumps", DUMPS, "--samples", "5"], "--samples"),
    odd(
        "host-timeout-no-live",
        ["triage", "--dumps", DUMPS, "--host-timeout", "5"],
        "--host-timeout",
    ),
    odd("dumps-twice", ["triage", "--dumps", DUMPS, "--dumps", DUMPS], "given twice"),
    odd(
        "jobid-via-ssh",
        ["triage", "--live", "--via", "ssh", "--hosts", "a", "--jobid", "3"],
        "--jobid names a Slurm job: it does nothing with --via ssh",
    ),
    odd("save-with-dumps", ["triage", "--dumps", DUMPS, "--save", "{tmp}/s"], "--save"),
    odd("parent-no-discover", ["triage", "--dumps", DUMPS, "--parent", "1"], "--parent"),
    odd("native-no-live", ["triage", "--dumps", DUMPS, "--native"], "--native"),
    # report, timeline, export, hunt, shrink
    odd("report-force-alone", ["report", CRASH_RUN, "--force"], "--force replaces output files"),
    odd("timeline-no-host-hits", ["timeline", "--requests", "4"], "--requests must be >= 6"),
    odd("export-builtin-run", ["export", CRASH_RUN], "a run of the builtin engine"),
    odd("hunt-p2p-delay-pp1", ["hunt", "--pp", "1", "--fault", "p2p-delay:ms=5"], "--pp 1"),
    odd("shrink-ok-run", ["shrink", OK_RUN], "nothing to shrink"),
    # sources
    odd(
        "sources-builtin-python",
        ["sources", "--engine", "builtin", "--sglang-python", "python"],
        "drop --sglang-python",
    ),
    odd(
        "sources-diff-itself",
        ["sources", "--diff", "builtin", "builtin"],
        "--diff builtin builtin compares a tree with itself",
    ),
    odd("sources-all-with-run", ["sources", "--run", OK_RUN, "--all"], "--all"),
    # scenario TOML keys
    odd(
        "expect-rank-absent",
        ["run", "--scenario", "{tmp}/far_culprit.toml", "--check"],
        "the run has ranks 0-1",
    ),
    odd("toml-p2p-pp1", ["run", "--scenario", "{tmp}/p2p_pp1.toml"], "'p2p-delay'"),
    odd("toml-stall-0", ["run", "--scenario", "{tmp}/stall0.toml"], "ms=0"),
    odd("toml-storage-dir", ["run", "--scenario", "{tmp}/storage_dir.toml"], "storage_dir"),
    # environment variables the tool reads, set to garbage; a HICACHE_DIAG_* it does not read
    odd(
        "env-rank-start",
        ["run"],
        "HICACHE_DIAG_RANK_START='thread'",
        env=(("HICACHE_DIAG_RANK_START", "thread"),),
    ),
    odd(
        "env-ready-timeout",
        ["run"],
        "HICACHE_DIAG_SGLANG_READY_TIMEOUT='nan'",
        env=(("HICACHE_DIAG_SGLANG_READY_TIMEOUT", "nan"),),
    ),
    odd(
        "env-record",
        ["run"],
        "HICACHE_DIAG_RECORD='maybe'",
        env=(("HICACHE_DIAG_RECORD", "maybe"),),
    ),
    odd("env-xdg-file", ["run"], "XDG_CACHE_HOME=", env=(("XDG_CACHE_HOME", "{tmp}/file"),)),
    odd("env-slurm-job", ["run"], "SLURM_JOB_ID='garbage'", env=(("SLURM_JOB_ID", "garbage"),)),
    odd(
        "env-typo",
        ["run", "--list-faults"],
        "HICACHE_DIAG_RANKSTART is not a variable",
        env=(("HICACHE_DIAG_RANKSTART", "spawn"),),
        warn=True,
        code=0,
    ),
    odd(
        "env-internal",
        ["run", "--list-faults"],
        "HICACHE_DIAG_LAUNCHER_PID is set by",
        env=(("HICACHE_DIAG_LAUNCHER_PID", "1"),),
        warn=True,
        code=0,
    ),
]

TOMLS = {
    "far_culprit.toml": "pp = 2\n[expect]\nculprit_rank = 5\n",
    "p2p_pp1.toml": 'pp = 1\n[[fault]]\nname = "p2p-delay"\nms = 5\n',
    "stall0.toml": '[[fault]]\nname = "rank-stall"\nrank = 1\nms = 0\n',
    "storage_dir.toml": 'storage_dir = "/tmp"\n',
}


def test_the_table_covers_every_command_scenarios_and_env():
    commands = {o.argv[0] for o in ODD}
    assert commands >= {"run", "bisect", "triage", "report", "timeline", "export", "hunt"}
    assert commands >= {"shrink", "sources"} and len(ODD) >= 30
    assert any("--scenario" in o.argv for o in ODD) and any(o.env for o in ODD)


@pytest.mark.parametrize("case", ODD, ids=lambda o: o.id)
def test_odd_input_is_refused_in_one_line_naming_it(case, tmp_path, monkeypatch, capsys):
    for name, text in TOMLS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "file").write_text("a file, not a folder\n")
    for name, value in case.env:
        monkeypatch.setenv(name, value.replace("{tmp}", str(tmp_path)))
    monkeypatch.chdir(tmp_path)  # a default run dir would appear here as runs/
    code = run_cli([a.replace("{tmp}", str(tmp_path)) for a in case.argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == case.code, lines
    assert not (tmp_path / "runs").exists(), "refused before any run dir"
    assert not live_children(), "refused before any rank"
    if case.warn:
        warned = [ln for ln in lines if ln.startswith("hicache-diag: warning:")]
        assert len(warned) == 1 and case.names in warned[0], lines
        lines = [ln for ln in lines if ln not in warned and ln.startswith("hicache-diag:")]
        assert len(lines) == (0 if case.code == 0 else 1), lines
        return
    assert len(lines) == 1 and lines[0].startswith("hicache-diag: error:"), lines
    assert case.names in lines[0], lines[0]
