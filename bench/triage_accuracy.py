"""Triage accuracy over the real-world corpus (samples/corpus): kind, form and culprit scores.

Run from the project root:  python bench/triage_accuracy.py
Each case is triaged offline through the same entry point as `hicache-diag triage --logs`
(a folder case passes every file in it, as logs from several nodes); the expected verdicts and
their provenance are in samples/corpus/expected.json and samples/corpus/README.md. Prints one
line per case and the scores, the score per emitter (who printed the evidence that decided the
verdict, triage.emitters: scheduler, a scheduler thread, tokenizer, http-server, client,
launcher; `unknown` when the text does not tell, `none` when nothing decided), then the case x
delivery table (triage.deliveries: each
collector prefix, ANSI, CRLF, editor numbers, terminal wrap, the operator's teardown, per-node
files, a head cut off, gzip), where `.` is the verdict kept, `X` changed, blank not applicable.
Exits 0 (the scores are figures, not a test: tests/unit/rules/test_corpus.py and
tests/unit/triage/test_metamorphic.py pin every verdict).
"""

from __future__ import annotations

import sys

# `python bench/x.py` puts bench/ first on sys.path, where bench/bisect.py would shadow the
# standard library's bisect (imported by random, statistics): drop it before anything else.
sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]
# The deliveries are test code (tests/unit/triage/deliveries.py), not product.
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from hicache_diag.triage import TriageRequest, run_triage  # noqa: E402
from tests.unit.triage.deliveries import DELIVERIES, verdict  # noqa: E402
from tests.unit.triage.deliveries import triage_case as deliver_case  # noqa: E402
from tests.unit.triage.generated_deliveries import transforms  # noqa: E402

CORPUS = Path("samples/corpus")


def triage_case(path: Path, mode: str) -> dict:
    """`mode` "dumps": the folder is a dump directory (`--dumps`); "logs+dumps": its *.log
    files and its dumps/ folder; else log files (`--logs`)."""
    if mode == "dumps":
        report = run_triage(TriageRequest(dumps=(path,)))
    elif mode == "logs+dumps":  # a server log beside the dumps/ folder taken from it
        logs = tuple(sorted(path.glob("*.log")))
        report = run_triage(TriageRequest(dumps=(path / "dumps",), logs=logs))
    else:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        report = run_triage(TriageRequest(logs=tuple(files)))
    data = report.to_json()
    culprit = data["culprit"]["label"] if data["culprit"] else None
    return {
        "kind": data["kind"],
        "form": data["form"],
        "culprit": culprit,
        "exit": data["exit_code"],
        "emitter": _emitter_kind(data.get("emitter")),
    }


def _emitter_kind(emitter: str | None) -> str:
    """The emitter's kind (triage.emitters.Emitter): `scheduler thread X (backup)` ->
    `scheduler-thread`; none named (logs that decide nothing) -> `none`."""
    if not emitter:
        return "none"
    return "scheduler-thread" if emitter.startswith("scheduler thread") else emitter


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args()
    if not CORPUS.is_dir():
        print("run from the project root: samples/corpus not found", file=sys.stderr)
        return 2
    expected = json.loads((CORPUS / "expected.json").read_text())["cases"]
    scores = {"kind": 0, "form": 0, "culprit": 0, "exit": 0}
    whole = 0
    per_emitter: dict[str, list[int]] = {}  # emitter -> [cases, all three right]
    named = named_right = 0
    t0 = time.perf_counter()
    for name, want in sorted(expected.items()):
        got = triage_case(CORPUS / name, want.get("mode", "logs"))
        marks = {k: got[k] == want[k] for k in scores}
        for k, ok in marks.items():
            scores[k] += ok
        if want["culprit"] is not None:
            named += 1
            named_right += marks["culprit"]
        tally = per_emitter.setdefault(got["emitter"], [0, 0])
        tally[0] += 1
        tally[1] += marks["kind"] and marks["form"] and marks["culprit"]
        whole += all(marks.values())
        flag = "ok  " if all(marks.values()) else "MISS"
        print(
            f"{flag} {name:48} kind={got['kind']:7} form={got['form']!s:4} "
            f"culprit={got['culprit']!s:14} exit={got['exit']}"
        )
    n = len(expected)
    elapsed = time.perf_counter() - t0
    print(f"\n{n} cases in {elapsed:.2f} s")
    # Strict: the kind must equal the expected one (no kind is accepted in place of another).
    print(f"kind, strict (no accepted-kind leniency): {scores['kind']}/{n}")
    for k, v in scores.items():
        print(f"{k:8} {v}/{n} = {100 * v / n:.0f}%")
    print(f"whole verdict (kind, form, culprit, exit): {whole}/{n}")
    print(f"culprit where the text names one: {named_right}/{named}")
    print("per emitter (who printed the deciding evidence; kind, form and culprit right):")
    for emitter, (cases, right) in sorted(per_emitter.items()):
        print(f"  {emitter:18} {right}/{cases} = {100 * right / cases:.0f}%")
    public_emitters()
    delivery_table(expected)
    return 0


def public_emitters() -> None:
    """The per-emitter cases from public SGLang / vLLM threads the corpus does not cite
    (tests/unit/triage/public_emitters.py, provenance there): emitter and kind named right."""
    sys.path.insert(0, "tests/unit/triage")
    from public_emitters import CASES  # test data, read for this table only

    from hicache_diag.logs.parse import parse_log_lines
    from hicache_diag.triage.classify import classify

    tally: dict[str, list[int]] = {}
    for case in CASES:
        report = classify([], parse_log_lines(case.text.splitlines(), case.url))
        right = _emitter_kind(report.emitter) == case.emitter and report.kind == case.kind
        t = tally.setdefault(case.emitter, [0, 0])
        t[0], t[1] = t[0] + 1, t[1] + right
    print(f"public threads per emitter ({len(CASES)} cases; emitter and kind right):")
    for emitter, (cases, right) in sorted(tally.items()):
        print(f"  {emitter:18} {right}/{cases}")


def delivery_table(expected: dict) -> None:
    """Every case x every delivery: does the verdict hold?"""
    every = (*DELIVERIES, *transforms())  # issue 38's transforms after the listed deliveries
    heads = [d.name for d in every]
    print(f"\n{'case':48} " + "".join(f"{i:>3}" for i in range(len(heads))))
    held = total = 0
    broken: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, want in sorted(expected.items()):
            mode = want.get("mode", "logs")
            cells = []
            for d in every:
                if mode == "dumps" or (d.kinds is not None and want["kind"] not in d.kinds):
                    cells.append(" ")
                    continue
                report = deliver_case(CORPUS / name, mode, d, Path(tmp) / name / d.name)
                ok = verdict(report) == (want["kind"], want["form"], want["culprit"])
                held, total = held + ok, total + 1
                cells.append("." if ok else "X")
                if not ok:
                    broken.append(f"{name} / {d.name}: {verdict(report)}")
            print(f"{name[:48]:48} " + "".join(f"{c:>3}" for c in cells))
    print("deliveries: " + ", ".join(f"{i}={h}" for i, h in enumerate(heads)))
    print(f"case x delivery held: {held}/{total}")
    for line in broken:
        print(f"  changed: {line}")


if __name__ == "__main__":
    raise SystemExit(main())
