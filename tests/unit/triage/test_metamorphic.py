"""Metamorphic: every corpus case keeps its verdict (kind, form, culprit) however its logs are
delivered: behind each collector prefix, coloured, CRLF, behind editor numbers, wrapped at
80/100/120 columns, with the operator's teardown appended (hang, busy, healthy cases), split
over per-node files, with the head cut off, gzip'd; behind wrappers nobody listed; and under
issue 38's transforms (generated_deliveries.transforms: an unknown tag, a hard wrap at 60-200,
glued records, JSON-lines shippers, two ranks' dumps shuffled by character, CR-only endings,
a NUL hole, a front cut). In-process, no subprocess per case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.triage.deliveries import DELIVERIES, case_files, triage_case, verdict
from tests.unit.triage.generated_deliveries import (
    EDITOR_NUMBERS,
    cut_stamp,
    generated,
    random_wrapper,
    transforms,
)

CORPUS = Path(__file__).resolve().parents[3] / "samples" / "corpus"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())["cases"]
PAIRS = [
    (case, d)
    for case, want in sorted(EXPECTED.items())
    if want.get("mode") != "dumps"
    for d in DELIVERIES
    if d.kinds is None or want["kind"] in d.kinds
]


@pytest.mark.parametrize(("case", "delivery"), PAIRS, ids=[f"{c}-{d.name}" for c, d in PAIRS])
def test_the_verdict_does_not_depend_on_the_delivery(case, delivery, tmp_path):
    want = EXPECTED[case]
    report = triage_case(CORPUS / case, want.get("mode", "logs"), delivery, tmp_path)
    assert verdict(report) == (want["kind"], want["form"], want["culprit"])


@pytest.mark.parametrize("delivery", DELIVERIES, ids=lambda d: d.name)
def test_each_delivery_changes_the_bytes(delivery):
    # A delivery that wrote the files back unchanged would make its row of the table vacuous.
    files = case_files(CORPUS / "sglang0523-cpu-watchdog-stalled-pp1.log", "logs")
    assert delivery.deliver(files) != files


def test_teardown_is_offered_to_every_stoppable_case():
    stoppable = {c for c, w in EXPECTED.items() if w["kind"] in ("hang", "busy", "healthy")}
    stoppable -= {c for c, w in EXPECTED.items() if w.get("mode") == "dumps"}
    torn = {c for c, d in PAIRS if d.name == "teardown"}
    assert torn == stoppable and len(torn) >= 10


# Wrappers and damage nobody listed: made up from seeds (triage.generated_deliveries).
GENERATED = generated(range(3)) + EDITOR_NUMBERS
GENERATED_PAIRS = [
    (case, d)
    for case, want in sorted(EXPECTED.items())
    if want.get("mode") != "dumps"
    for d in GENERATED
]


@pytest.mark.parametrize(
    ("case", "delivery"), GENERATED_PAIRS, ids=[f"{c}-{d.name}" for c, d in GENERATED_PAIRS]
)
def test_unknown_wrappers_and_cut_stamps_keep_the_verdict(case, delivery, tmp_path):
    want = EXPECTED[case]
    report = triage_case(CORPUS / case, want.get("mode", "logs"), delivery, tmp_path)
    assert verdict(report) == (want["kind"], want["form"], want["culprit"])


@pytest.mark.parametrize("seed", range(20))
def test_generated_wrappers_differ_and_end_in_a_blank(seed):
    wrap = random_wrapper(seed)
    assert wrap(0).endswith(" ") and wrap(0).strip()
    assert wrap(0) != random_wrapper(seed + 100)(0)


def test_a_cut_stamp_loses_its_front_but_keeps_the_rank_tokens():
    import random

    rng = random.Random(0)
    line = "[2026-06-24 15:38:03 PP1 TP0] Decode batch, #running-req: 3"
    cuts = {cut_stamp(line, rng) for _ in range(200)}
    assert len(cuts) > 10
    assert all(c.endswith("PP1 TP0] Decode batch, #running-req: 3") for c in cuts)
    assert all(not c.startswith("[2026") for c in cuts)


SAMPLE_LOGS = sorted((CORPUS.parent / "logs").glob("*.log"))


@pytest.mark.parametrize("log", SAMPLE_LOGS, ids=lambda p: p.name)
def test_a_cloud_agents_fields_that_vary_per_line_keep_the_verdict(log, tmp_path):
    """A logging agent's framing: the severity it picked per line and a hex insert id that
    changes every line, in front of SGLang's label, a traceback's lines and py-spy's dump."""
    import random

    from hicache_diag.triage.session import TriageRequest, run_triage

    rng = random.Random(log.name)
    lines = []
    for line in log.read_text().splitlines():
        sev = "ERROR" if line[:1] == " " or "Error" in line else rng.choice(["INFO", "DEFAULT"])
        ident = f"{rng.getrandbits(40):x}"
        lines.append(f'[severity: {sev}] {{"insertId": "{ident}", "logName": "stdout"}} {line}')
    wrapped = tmp_path / log.name
    wrapped.write_text("\n".join(lines) + "\n")
    want = verdict(run_triage(TriageRequest(logs=(log,))))
    assert verdict(run_triage(TriageRequest(logs=(wrapped,)))) == want


# Issue 38's transforms: what the user's stack did to the text (generated_deliveries.py).
TRANSFORMS = transforms()
TRANSFORM_PAIRS = [
    (case, d)
    for case, want in sorted(EXPECTED.items())
    if want.get("mode") != "dumps"
    for d in TRANSFORMS
]


@pytest.mark.parametrize(
    ("case", "delivery"), TRANSFORM_PAIRS, ids=[f"{c}-{d.name}" for c, d in TRANSFORM_PAIRS]
)
def test_transforms_keep_the_verdict(case, delivery, tmp_path):
    want = EXPECTED[case]
    report = triage_case(CORPUS / case, want.get("mode", "logs"), delivery, tmp_path)
    assert verdict(report) == (want["kind"], want["form"], want["culprit"])


@pytest.mark.parametrize("delivery", TRANSFORMS, ids=lambda d: d.name)
def test_each_transform_changes_the_bytes(delivery):
    case = (
        "sglang-10350-segfault.log"
        if "interleaved" in delivery.name
        else "sglang0523-cpu-form-a-pp2.log"
    )
    files = case_files(CORPUS / case, "logs")
    assert delivery.deliver(files) != files
