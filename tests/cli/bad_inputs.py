"""Every malformed input found so far (issue 13 and before), as data: argv, the exit code, and
a fragment of the one line it must print. `{root}` is a scratch directory that `make_files`
fills with the files some cases need. Used by tests/cli/test_bad_input.py (in process) and
bench/bad_input.py (as real subprocesses, timed)."""

from __future__ import annotations

import json
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
    (["run", "--fix", "ack-count=nope"], 2, "unknown mode 'nope'"),
    (["run", "--fault", "no-such-fault"], 2, "no-such-fault"),
    (["run", "--fault", "dma-delay:rank=9,ms=5"], 2, "rank"),
    (["run", "--storage-backend", "s3"], 2, "unknown storage backend 's3'"),
    (["run", "--device", "tpu"], 2, "unknown device 'tpu'"),
    # flag combinations that do nothing
    (["run", "--storage-dir", "{root}/l3"], 2, "does nothing without --hicache-storage-backend"),
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
    (["bisect", "--switch", "host-alloc=local,two-phase", "--trial-timeout", "nan"], 2,
     "--trial-timeout"),
    # triage
    (["triage", "--pid", "-5"], 2, "--pid must be a positive process id, got -5"),
    (["triage", "--pid", "0"], 2, "--pid must be a positive process id, got 0"),
    (["triage", "--pid", "1", "--deadline", "nan"], 2, "must be finite"),
    (["triage"], 2, "nothing to triage"),
    # report: damaged or wrong run directories, bad output paths
    (["report", "{root}/nope"], 2, "does not exist"),
    (["report", "{root}/empty"], 2, "is not a run directory"),
    (["report", "{root}/list_verdict"], 2, "verdict.json is damaged: it holds a JSON list"),
    (["report", "{root}/list_launcher"], 2, "launcher.json is damaged: it holds a JSON list"),
    (["report", "{root}/list_verdict", "--plots", "{root}/afile"], 2, "is a file"),
]


def make_files(root: Path) -> None:
    """The files and directories the cases above point at."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "afile").write_text("")
    (root / "nonempty").mkdir()
    (root / "nonempty" / "old.txt").write_text("an earlier run")
    (root / "empty").mkdir()
    (root / "pp_two.toml").write_text('pp = "two"\n')
    (root / "unknown_key.toml").write_text("pp = 2\nbogus = 1\n")
    (root / "fix_str.toml").write_text('fix = "ack-count=leader"\n')
    for name in ("list_verdict", "list_launcher"):
        shutil.copytree(SAMPLE_RUN, root / name)
    (root / "list_verdict" / "verdict.json").write_text(json.dumps([1, 2]))
    (root / "list_launcher" / "launcher.json").write_text(json.dumps([]))
    (root / "list_launcher" / "verdict.json").unlink()


def expand(argv: list[str], root: Path) -> list[str]:
    return [a.replace("{root}", str(root)) for a in argv]
