"""Every malformed input found so far (issue 13 and before), as data: argv, the exit code, and
a fragment of the one line it must print. `{root}` is a scratch directory that `make_files`
fills with the files some cases need. Used by tests/cli/test_bad_input.py (in process) and
bench/bad_input.py (as real subprocesses, timed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

SAMPLE_RUN = Path(__file__).resolve().parents[2] / "samples" / "runs" / "healthy"

# (argv, exit code, fragment of the one error line)
BAD_INPUTS: list[tuple[list[str], int, str]] = [
    # topology against the model (5 layers, 4 heads)
    (["run", "--tp", "3"], 2, "does not divide the model's 4 attention heads"),
    (["run", "--pp", "6"], 2, "exceeds the model's 5 layers"),
    (["run", "--pp", "0"], 2, "--pp must be >= 1"),
    (["run", "--tp", "0"], 2, "--tp must be >= 1"),
    (["run", "--async-depth", "-1"], 2, "--async-depth must be between 0 and 8"),
    # sizes: positive, finite, big enough for one request
    (["run", "--max-total-tokens", "7"], 2, "cannot hold one request"),
    (["run", "--max-total-tokens", "0"], 2, "smaller than one page"),
    (["run", "--page-size", "0"], 2, "--page-size must be >= 1"),
    (["run", "--hicache-ratio", "-1"], 2, "--hicache-ratio must be a finite number > 0"),
    (["run", "--hicache-ratio", "0"], 2, "--hicache-ratio must be a finite number > 0"),
    (["run", "--hicache-ratio", "nan"], 2, "--hicache-ratio must be a finite number > 0"),
    (["run", "--hicache-ratio", "inf"], 2, "--hicache-ratio must be a finite number > 0"),
    (["run", "--hicache-ratio", "0.001"], 2, "holds less than one page"),
    (["run", "--hicache-size", "1B"], 2, "holds fewer tokens than one page"),
    (["run", "--hicache-size", "-1"], 2, "malformed size '-1'"),
    (["run", "--hicache-size", "lots"], 2, "malformed size 'lots'"),
    (["run", "--requests", "0"], 2, "--requests must be > 0"),
    (["run", "--max-new-tokens", "0"], 2, "--max-new-tokens must be > 0"),
    (["run", "--hang-timeout", "0"], 2, "--hang-timeout must be a finite number"),
    (["run", "--hang-timeout", "-3"], 2, "--hang-timeout must be a finite number"),
    (["run", "--hang-timeout", "nan"], 2, "--hang-timeout must be a finite number"),
    (["run", "--hang-timeout", "inf"], 2, "--hang-timeout must be a finite number"),
    # choices and grammar
    (["run", "--workload", "nope"], 2, "unknown workload 'nope'"),
    (["run", "--protocol", "bogus"], 2, "unknown protocol preset 'bogus'"),
    (["run", "--switch", "ack-count=nope"], 2, "unknown mode 'nope'"),
    (["run", "--fault", "no-such-fault"], 2, "no-such-fault"),
    (["run", "--fault", "dma-delay:rank=9,ms=5"], 2, "rank"),
    # past what the tool can act on (a rank's own sleep overflowed): refused, the largest named
    (["run", "--fault", "rank-stall:rank=1,ms=1e300"], 2, "milliseconds from 0 to 86400000"),
    (["run", *["--fault", "rank-stall:ms=1"] * 65], 2, "65 faults in a run; the most is 64"),
    (["run", "--storage-backend", "s3"], 2, "unknown storage backend 's3'"),
    (["run", "--device", "tpu"], 2, "unknown device 'tpu'"),
    (["run", "--device", "cuda"], 2, "--device cuda: the builtin engine runs on the CPU only"),
    # flag combinations that do nothing
    (["run", "--storage-dir", "{root}/l3"], 2, "does nothing without --hicache-storage-backend"),
    (["run", "--pp", "1", "--fault", "p2p-delay:ms=5"], 2, "does nothing with --pp 1"),
    (["triage", "--dumps", "{root}/dumps", "--interval", "2"], 2, "paces live sampling"),
    (["triage", "--dumps", "{root}/dumps", "--deadline", "9"], 2, "paces live sampling"),
    (["run", "--switch", "ack-count=local", "--switch", "ack-count=leader"], 2, "contradict"),
    (["run", "--fault", "dma-delay:ms=5,p=0"], 2, "never fires: p=0"),
    (["run", "--scenario", "{root}/far_culprit.toml", "--check"], 2, "the run has ranks 0-1"),
    (["bisect", "--switch", "ack-count=local,leader", "--check"], 2, "does nothing in bisect"),
    # scenario files: types, unknown keys, missing file
    (["run", "--scenario", "{root}/pp_two.toml"], 2, "pp must be an integer, not 'two'"),
    (["run", "--scenario", "{root}/unknown_key.toml"], 2, "unknown key 'bogus'; valid keys:"),
    (["run", "--scenario", "{root}/fix_str.toml"], 2, "fix must be a list"),
    (["run", "--scenario", "{root}/missing.toml"], 2, "does not exist"),
    # the run directory is written once
    (["run", "--out", "{root}/nonempty"], 2, "is not empty; a run directory is written once"),
    (["run", "--out", "{root}/afile/run"], 2, "is not writable"),
    # bisect
    (["bisect", "--trials", "1"], 2, "bisect needs a matrix"),
    (["bisect", "--switch", "host-alloc=local,two-phase", "--tp", "3"], 2, "attention heads"),
    (["bisect", "--hicache-size", "1B,64MiB"], 2, "fewer tokens than one page"),
    (
        ["bisect", "--switch", "host-alloc=local,two-phase", "--trial-timeout", "nan"],
        2,
        "--trial-timeout",
    ),
    # triage
    (["triage", "--pid", "-5"], 2, "--pid must be a positive process id, got -5"),
    (["triage", "--pid", "0"], 2, "--pid must be a positive process id, got 0"),
    (["triage", "--pid", "1", "--deadline", "nan"], 2, "must be finite"),
    (["triage"], 2, "nothing to triage"),
    # export: not a run directory, not a real-SGLang crash
    (["export", "{root}/nope"], 2, "does not exist"),
    (["export", "{root}/empty"], 2, "is not a run directory"),
    (["export", "{sample}"], 2, "a run of the builtin engine"),
    # report: damaged or wrong run directories, bad output paths
    (["report", "{root}/nope"], 2, "does not exist"),
    (["report", "{root}/empty"], 2, "is not a run directory"),
    (["report", "{root}/list_verdict"], 2, "verdict.json is damaged: it holds a JSON list"),
    (["report", "{root}/list_launcher"], 2, "launcher.json is damaged: it holds a JSON list"),
    (["report", "{root}/list_verdict", "--plots", "{root}/afile"], 2, "is a file"),
    # report of a hunt dir (hunt.json): damaged, or asked for a run dir's outputs
    (["report", "{root}/list_hunt"], 2, "hunt.json is damaged: not a hunt report"),
    (["report", "{root}/torn_hunt"], 2, "hunt.json is damaged: Unterminated"),
    (["report", "{root}/list_hunt", "--plots", "{root}/p"], 2, "--plots renders one run dir"),
    (["report", "{sample}", "--save"], 2, "--save rewrites a hunt's hunt.json"),
]


# ---- generated classes (issue 22) -------------------------------------------------------------
# Each class crosses every flag of a kind with every way its value can be wrong. A value class a
# flag accepts is None in its row (e.g. a float for --hicache-ratio), so the table says why a
# cell is absent instead of leaving it out silently.
HUGE = "99999999999999999999"
NOT_INT = "Invalid value for"  # click's own line for a value that is not an integer
DAY = "(one day)"
# command, flag, extra argv -> {value class: needle of the one error line, or None: accepted}
NUMERIC: dict[tuple[str, str], dict[str, str | None]] = {
    ("run", "--pp"): {
        "negative": "--pp must be >= 1",
        "zero": "--pp must be >= 1",
        "huge": "exceeds the model's 5 layers",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--tp"): {
        "negative": "--tp must be >= 1",
        "zero": "--tp must be >= 1",
        "huge": "does not divide the model's 4 attention heads",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--async-depth"): {
        "negative": "--async-depth must be between 0 and 8",
        "zero": None,
        "huge": "--async-depth must be between 0 and 8",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--page-size"): {
        "negative": "--page-size must be >= 1",
        "zero": "--page-size must be >= 1",
        "huge": "smaller than one page",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--max-total-tokens"): {
        "negative": "smaller than one page",
        "zero": "smaller than one page",
        "huge": "the largest --max-total-tokens that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--requests"): {
        "negative": "--requests must be > 0",
        "zero": "--requests must be > 0",
        "huge": "the largest that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--max-new-tokens"): {
        "negative": "--max-new-tokens must be > 0",
        "zero": "--max-new-tokens must be > 0",
        "huge": "cannot hold one request",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--seed"): {
        "negative": "--seed must be between 0 and",
        "zero": None,
        "huge": "--seed must be between 0 and",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--max-steps"): {
        "negative": "--max-steps must be >= 1",
        "zero": "--max-steps must be >= 1",
        "huge": "the largest that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("run", "--hicache-ratio"): {
        "negative": "--hicache-ratio must be a finite number > 0",
        "zero": "--hicache-ratio must be a finite number > 0",
        "huge": "the largest --max-total-tokens that fits is",
        "float": None,
        "nan": "--hicache-ratio must be a finite number",
    },
    ("run", "--hang-timeout"): {
        "negative": "--hang-timeout must be a finite number",
        "zero": "--hang-timeout must be a finite number",
        "huge": DAY,
        "float": None,
        "nan": "--hang-timeout must be a finite number",
    },
    ("run", "--hicache-size"): {
        "negative": "malformed size '-1'",
        "zero": None,
        "huge": "the largest --max-total-tokens that fits is",
        "float": None,
        "nan": "malformed size 'nan'",
    },
    ("bisect", "--trials"): {
        "negative": "--trials must be >= 1",
        "zero": "--trials must be >= 1",
        "huge": "the largest --trials that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("bisect", "--jobs"): {
        "negative": "--jobs must be >= 1",
        "zero": "--jobs must be >= 1",
        "huge": "--jobs must be between 1 and",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("bisect", "--seed"): {
        "negative": "--seed must be between 0 and",
        "zero": None,
        "huge": "--seed must be between 0 and",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("bisect", "--trial-timeout"): {
        "negative": "--trial-timeout must be a finite number",
        "zero": "--trial-timeout must be a finite number",
        "huge": DAY,
        "float": None,
        "nan": "--trial-timeout must be a finite number",
    },
    ("triage", "--samples"): {
        "negative": "--samples must be at least 1",
        "zero": "--samples must be at least 1",
        "huge": "the largest that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("triage", "--interval"): {
        "negative": "--interval must be >= 0",
        "zero": None,
        "huge": DAY,
        "float": None,
        "nan": "must be finite",
    },
    ("triage", "--deadline"): {
        "negative": "--deadline > 0",
        "zero": "--deadline > 0",
        "huge": DAY,
        "float": None,
        "nan": "must be finite",
    },
    ("triage", "--pid"): {
        "negative": "--pid must be a positive process id",
        "zero": "--pid must be a positive process id",
        "huge": "no such process",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("triage", "--num-heads"): {
        "negative": "--num-heads must be positive",
        "zero": "--num-heads must be positive",
        "huge": None,
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("timeline", "--pp"): {
        "negative": "--pp must be >= 1",
        "zero": "--pp must be >= 1",
        "huge": "exceeds the model's 5 layers",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("timeline", "--async-depth"): {
        "negative": "--async-depth must be between 0 and 8",
        "zero": None,
        "huge": "--async-depth must be between 0 and 8",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("timeline", "--requests"): {
        "negative": "--requests must be >= 6",
        "zero": "--requests must be >= 6",
        "huge": "the largest that fits is",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
    ("timeline", "--seed"): {
        "negative": "--seed must be between 0 and",
        "zero": None,
        "huge": "--seed must be between 0 and",
        "float": NOT_INT,
        "nan": NOT_INT,
    },
}
VALUES = {"negative": "-1", "zero": "0", "huge": HUGE, "float": "1.5", "nan": "nan"}
# What each command needs besides the flag under test to reach that flag's check.
CONTEXT = {
    "run": [],
    "timeline": [],
    "bisect": ["--switch", "host-alloc=local,two-phase", "--out", "{root}/bisect-out"],
    "triage": ["--dumps", "{root}/dumps"],
}
LIVE = {"--samples", "--interval", "--deadline", "--pid"}  # triage flags checked for live targets


def _numeric_cases() -> list[tuple[list[str], int, str]]:
    cases = []
    for (command, flag), row in NUMERIC.items():
        for kind, needle in row.items():
            if needle is None:
                continue
            value = VALUES[kind]
            if flag == "--hicache-size" and kind == "huge":
                value = "99999GiB"
            ctx = list(CONTEXT[command])
            if command == "triage" and flag in LIVE and flag != "--pid":
                ctx = ["--pid", "{self}"]  # a live target, so the sample checks apply
            cases.append(([command, *ctx, f"{flag}={value}"], 2, needle))
    return cases


# Path flags: command, flag, what it takes (in: file/dir to read, out: file/dir to write), extra
PATHS: list[tuple[str, str, str, list[str]]] = [
    ("run", "--scenario", "in-file", []),
    ("run", "--out", "out-dir", []),
    ("run", "--hicache-storage-dir", "out-dir", ["--storage-backend", "file"]),
    ("report", "RUN_DIR", "in-dir", []),
    ("report", "--plots", "out-dir", ["{sample}"]),
    ("report", "--summary", "out-file", ["{sample}"]),
    ("export", "RUN_DIR", "in-dir", []),
    ("export", "--out", "out-dir", ["{sample}"]),
    ("triage", "--logs", "in-file", []),
    ("triage", "LOG", "in-file", []),
    ("triage", "--dumps", "in-dir", []),
    ("triage", "--save", "out-dir", ["--pid", "{self}"]),
    ("bisect", "--out", "out-dir", ["--switch", "host-alloc=local,two-phase"]),
    ("timeline", "--out", "out-dir", []),
]
# value class -> (path, needle) per kind of flag; None: that class does not apply to the kind
PATH_VALUES: dict[str, dict[str, tuple[str, str] | None]] = {
    "missing": {
        "in-file": ("{root}/nope", "does not exist"),
        "in-dir": ("{root}/nope", "does not exist"),
        "out-dir": None,
        "out-file": None,
    },  # a missing output is created
    "file-for-dir": {
        "in-dir": ("{root}/afile", "is a file"),
        "out-dir": ("{root}/afile", "is a file"),
        "in-file": None,
        "out-file": None,
    },
    "dir-for-file": {
        "in-file": ("{root}/empty", "is a directory"),
        "out-file": ("{root}/empty", "is a directory"),
        "in-dir": None,
        "out-dir": None,
    },
    "unwritable": {
        "out-dir": ("/proc/1/hicache-diag-out", "not writable"),
        "out-file": ("/proc/1/report.md", "not writable"),
        "in-file": None,
        "in-dir": None,
    },
    "device": {
        "in-file": ("/dev/zero", "is a device"),
        "in-dir": ("/dev/zero", "is a device"),
        "out-dir": ("/dev/null", "is a device"),
        "out-file": ("/dev/null", "is a device"),
    },
    "fifo": {
        "in-file": ("{root}/fifo", "is a FIFO"),
        "in-dir": ("{root}/fifo", "is a FIFO"),
        "out-dir": ("{root}/fifo", "is a FIFO"),
        "out-file": ("{root}/fifo", "is a FIFO"),
    },
    "empty": dict.fromkeys(("in-file", "in-dir", "out-dir", "out-file"), ("", "is empty")),
}


def _path_cases() -> list[tuple[list[str], int, str]]:
    cases = []
    for command, flag, kind, extra in PATHS:
        for by_kind in PATH_VALUES.values():
            got = by_kind.get(kind)
            if got is None:
                continue
            path, needle = got
            arg = [path] if flag in ("RUN_DIR", "LOG") else [f"{flag}={path}"]
            cases.append(([command, *extra, *arg], 2, needle))
    return cases


# Pairs that contradict each other or do nothing together (README: refused, exit 2).
PAIRS: list[tuple[list[str], int, str]] = [
    (["run", "--hicache-size", "64MiB", "--hicache-ratio", "3"], 2, "both set"),
    (
        ["run", "--hicache-storage-prefetch-policy", "timeout"],
        2,
        "does nothing without --hicache-storage-backend file",
    ),
    (["run", "--fault", "l3-partial-hit:rank=1,keep=0.5"], 2, "acts on L3 storage"),
    (["run", "--fault", "clock-skew:rank=1,jitter-us=5"], 2, "does nothing with lru-clock=logical"),
    (
        [
            "run",
            "--protocol",
            "legacy",
            "--switch",
            "lru-clock=logical",
            "--fault",
            "clock-skew:rank=1,jitter-us=5",
        ],
        2,
        "does nothing with lru-clock=logical",
    ),
    # SGLang's per-rank wall clocks and their workloads: the builtin runtime has neither.
    (
        ["run", "--fault", "session-clock:rank=1,phase-ms=500"],
        2,
        "fault 'session-clock' cannot run on --engine builtin: the builtin runtime has no sessions",
    ),
    (
        ["run", "--fault", "flush-clock:rank=1,offset-ms=3000"],
        2,
        "fault 'flush-clock' cannot run on --engine builtin: the builtin runtime has no "
        "/flush_cache",
    ),
    (
        ["run", "--fault", "session-clock:rank=1,phase-ms=1500"],
        2,
        "is not a phase of SGLang's 1000 ms reap tick",
    ),
    (["run", "--workload", "session-timeout"], 2, "which the builtin runtime does not have"),
    (["run", "--workload", "flush-timeout"], 2, "use --engine sglang"),
    (["run", "--model", "{root}"], 2, "--model applies to --engine sglang only"),
    (["run", "--sglang-arg=--foo"], 2, "--sglang-arg applies to --engine sglang only"),
    (["run", "--sglang-env", "A=1"], 2, "--sglang-env applies to --engine sglang only"),
    (["run", "--engine", "sglang", "--sglang-env", "NOEQUALS"], 2, "expected NAME=VALUE"),
    (["run", "--engine", "sglang", "--sglang-env", "1X=2"], 2, "expected NAME=VALUE"),
    (["run", "--scenario", "{root}/env_bool.toml"], 2, "sglang_env must be a table of NAME"),
    (["run", "--scenario", "{root}/env_builtin.toml"], 2, 'applies to engine = "sglang" only'),
    (["run", "--sglang-python", "python3"], 2, "--sglang-python applies to --engine sglang only"),
    (["run", "--engine", "sglang", "--protocol", "legacy"], 2, "--protocol is a builtin-engine"),
    (
        ["run", "--engine", "sglang", "--switch", "ack-count=local"],
        2,
        "--switch is a builtin-engine",
    ),
    (["run", "--engine", "sglang", "--max-steps", "10"], 2, "--max-steps applies to --engine"),
    (["run", "--nnodes", "2"], 2, "--nnodes applies to --engine sglang only"),
    (["run", "--engine", "sglang", "--nnodes", "3"], 2, "--nnodes 3 is more nodes than ranks"),
    (["run", "--engine", "sglang", "--nnodes", "2", "--pp", "3"], 2, "does not split --pp 3"),
    (["run", "--engine", "sglang", "--nnodes", "0"], 2, "--nnodes must be"),
    (["run", "--engine", "sglang", "--warm-server"], 2, "--warm-server has no effect on one"),
    (
        ["bisect", "--engine", "sglang", "--warm-server", "--nnodes", "2", "--trials", "2"],
        2,
        "a warm server is proven clean on one node only",
    ),
    (["run", "--scenario", "{root}/warm_key.toml"], 2, "unknown key 'warm_server'"),
    (["run", "--check"], 2, "--check needs --scenario"),
    (["run", "--check", "--scenario", "{root}/pp_two.toml"], 2, "has no [expect] table"),
    (["triage", "--save", "{root}/save", "--dumps", "{root}/dumps"], 2, "--save writes live"),
    (["triage", "--parent", "1", "--dumps", "{root}/dumps"], 2, "--parent limits --discover"),
    (["triage", "--native", "--dumps", "{root}/dumps"], 2, "--native adds a live py-spy pass"),
    (["bisect", "--switch", "host-alloc=local"], 2, "has one value"),
    (["bisect", "--switch", "host-alloc=local,local"], 2, "lists 'local' twice"),
    (
        ["bisect", "--storage-backend", "none,file", "--switch", "storage-backend=none,file"],
        2,
        "is given twice",
    ),
    (
        ["bisect", "--switch", "host-alloc=local,two-phase", "--out", "{root}/nonempty"],
        2,
        "is not empty",
    ),
    (
        ["bisect", "--switch", "host-alloc=local,two-phase", "--", "--out", "{root}/x"],
        2,
        "give --out to bisect itself",
    ),
]
# Cases whose check runs a program (the release probe execs --sglang-python): a process test.
PROBE_CASES: list[tuple[list[str], int, str]] = [
    (
        [
            "bisect",
            "--engine",
            "sglang",
            "--sglang-python",
            "/nonexistent",
            "--switch",
            "max-total-tokens=256,512",
        ],
        2,
        "--sglang-python /nonexistent: cannot run it",
    ),
    (
        ["run", "--engine", "sglang", "--sglang-python", "/nonexistent"],
        2,
        "--sglang-python /nonexistent: cannot run it",
    ),
]

GENERATED: dict[str, list[tuple[list[str], int, str]]] = {
    "numeric": _numeric_cases(),
    "paths": _path_cases(),
    "pairs": PAIRS,
}
ALL_CASES = BAD_INPUTS + [c for cases in GENERATED.values() for c in cases]  # in process


def make_files(root: Path) -> None:
    """The files and directories the cases above point at."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "dumps").mkdir()
    (root / "dumps" / "TP0.txt").write_text("not a stack\n")
    os.mkfifo(root / "fifo")
    (root / "afile").write_text("")
    (root / "nonempty").mkdir()
    (root / "nonempty" / "old.txt").write_text("an earlier run")
    (root / "empty").mkdir()
    (root / "pp_two.toml").write_text('pp = "two"\n')
    (root / "unknown_key.toml").write_text("pp = 2\nbogus = 1\n")
    (root / "fix_str.toml").write_text('fix = "ack-count=leader"\n')
    (root / "far_culprit.toml").write_text("pp = 2\n[expect]\nculprit_rank = 5\n")
    (root / "env_bool.toml").write_text('engine = "sglang"\nsglang_env = {X = true}\n')
    (root / "env_builtin.toml").write_text('sglang_env = {SGLANG_X = "1"}\n')
    (root / "warm_key.toml").write_text('engine = "sglang"\nwarm_server = true\n')
    for name, text in (("list_hunt", "[]"), ("torn_hunt", '{"schema": "hicache-diag/hu')):
        (root / name).mkdir()
        (root / name / "hunt.json").write_text(text)
    for name in ("list_verdict", "list_launcher"):
        shutil.copytree(SAMPLE_RUN, root / name)
    (root / "list_verdict" / "verdict.json").write_text(json.dumps([1, 2]))
    (root / "list_launcher" / "launcher.json").write_text(json.dumps([]))
    (root / "list_launcher" / "verdict.json").unlink()


def expand(argv: list[str], root: Path) -> list[str]:
    """`{root}`: the scratch dir; `{sample}`: a sample run dir; `{self}`: a live pid (ours)."""
    subs = {"{root}": str(root), "{sample}": str(SAMPLE_RUN), "{self}": str(os.getpid())}
    out = []
    for a in argv:
        for key, value in subs.items():
            a = a.replace(key, value)
        out.append(a)
    return out
