"""What must hold after every hostile case (issue 41), whatever the case did:

- no user or evidence file changed: `tree_hashes` before and after, compared;
- a run dir left behind is readable by `report` (any exit but 1, one JSON document);
- no process left (tests/conftest.py `live_children`, psutil);
- with --json, stdout is one JSON document, and an error's is `{"error", "exit_code"}`;
- no traceback on stderr, and no control character from an input reaches it raw.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import assert_no_children

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples" / "runs"
BUILTIN_HANG = SAMPLES / "form_c"  # the builtin engine's: stacks, launcher.json, a hang
SGLANG_CRASH = SAMPLES / "sglang-0.5.23-form-b"  # what export takes


@dataclass(frozen=True, slots=True)
class Ran:
    """One CLI invocation: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str


def tree_hashes(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed): a file's sha256, a link's target, a
    FIFO or a folder by kind. A folder that holds a link loop is walked once."""
    found = {}
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[rel] = "link:" + os.readlink(path)
            elif stat.S_ISREG(mode) and path.lstat().st_size > 16 << 20:  # a sparse giant
                st = path.lstat()
                found[rel] = f"big:{st.st_size}:{st.st_mtime_ns}"
            elif stat.S_ISREG(mode):
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[rel] = "kind:" + oct(stat.S_IFMT(mode))
    return found


def changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {k for k in before if after.get(k) != before[k]}


def one_json_document(out: str) -> dict:
    """stdout holds exactly one JSON object (a result, or an error with its exit code)."""
    doc = json.loads(out)  # raises on two documents or on text around one
    assert isinstance(doc, dict), out
    return doc


def check_output(ran: Ran, json_out: bool) -> None:
    """The invariants on what one invocation printed."""
    assert ran.code != 1 or "internal error" not in ran.err, ran.err[-2000:]
    assert "Traceback (most recent call last)" not in ran.err, ran.err[-2000:]
    assert "\x1b]" not in ran.err and "\x1b[2J" not in ran.err, "an input drove the terminal"
    if json_out:
        doc = one_json_document(ran.out)
        if "error" in doc:
            assert doc["exit_code"] == ran.code, doc
    if ran.code == 2:  # a refusal is one line
        lines = [ln for ln in ran.err.strip().splitlines() if ln.startswith("hicache-diag: error")]
        assert len(lines) == 1, ran.err


def assert_no_process_left() -> None:
    assert_no_children()


def report_reads(run_dir: Path, cli) -> dict:
    """`report RUN --json` on a run dir a case left: never an internal error, one document;
    a refusal (exit 2) only for a dir that holds no run (nothing was written yet)."""
    ran = cli(["report", str(run_dir), "--json"])
    check_output(ran, json_out=True)
    doc = one_json_document(ran.out)
    if ran.code == 2:
        assert "is not a run directory" in doc["error"] or "does not exist" in doc["error"], doc
    return doc
