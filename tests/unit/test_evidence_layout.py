"""docs/evidence.md and the layout module (hicache_diag/evidence.py) name the same files."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from hicache_diag import evidence as ev

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "evidence.md").read_text()
RUNS = ROOT / "samples" / "runs"


def _tree() -> set[str]:
    """The file names of the doc's run-directory tree (`├── manifest.json   written first`)."""
    block = DOC.split("```", 2)[1]
    return {m for m in re.findall(r"[├└]── (\S+)", block) if not m.endswith("/")}


def test_the_docs_tree_is_the_layout():
    assert _tree() == set(ev.LAYOUT)


def test_every_sglang_engine_file_is_documented():
    for name in ev.SGLANG_LAYOUT:
        assert f"`{name}`" in DOC, name


def test_paths_are_built_from_the_layout(tmp_path):
    assert ev.rank_jsonl(tmp_path, 3).name == "rank3.jsonl"
    assert ev.stack_json(tmp_path, 1).relative_to(tmp_path).as_posix() == "stacks/rank1.json"
    assert ev.stack_txt(tmp_path, 1).relative_to(tmp_path).as_posix() == "stacks/rank1.txt"


def _must_agree_sentence() -> str:
    return DOC.split("`must_agree` always holds", 1)[1].split("\n\n", 1)[0]


def test_the_docs_must_agree_is_the_one_list():
    """The builtin recorder's keys, in the doc's order, then its conditional ones."""
    named = re.findall(r"`(\w+)`", _must_agree_sentence())
    assert named == [*ev.MUST_AGREE, *ev.MUST_AGREE_HOST, *ev.MUST_AGREE_L3]


def test_both_recorders_use_the_one_list():
    from hicache_diag.probes import recorder as ours
    from hicache_diag.sglang_plugin import recorder as plugin

    assert ours.MUST_AGREE is ev.MUST_AGREE and ours.CRASH_KEYS is ev.BATCH_KEYS
    assert plugin.MUST_AGREE == ev.MUST_AGREE + ev.MUST_AGREE_SGLANG
    sglang_doc = DOC.split("`must_agree` lists what", 1)[1].split("A scheduler that raised", 1)[0]
    assert set(re.findall(r"`(\w+)`", sglang_doc)) >= set(ev.MUST_AGREE_SGLANG) - {
        "host_loaded_len", "l3_hit_len"}  # the batch keys the sentence names as "the batch keys"


def _section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(
    "record, title",
    [(ev.ManifestHead, "manifest.json"), (ev.LauncherRecord, "launcher.json"),
     (ev.FirstFailure, "launcher.json"), (ev.HangRecord, "launcher.json"),
     (ev.StacksRecord, "launcher.json")],  # fmt: skip
    ids=lambda x: getattr(x, "__name__", x),
)
def test_every_record_field_is_documented(record, title):
    section = _section(title)
    for f in dataclasses.fields(record):
        assert re.search(rf"(?<![\w]){f.name}(?![\w])", section), (record.__name__, f.name)


@pytest.mark.parametrize("run", sorted(p for p in RUNS.iterdir() if (p / ev.LAUNCHER).is_file()),
                         ids=lambda p: p.name)  # fmt: skip
def test_records_read_every_committed_run_and_write_its_keys_back(run):
    """from_json takes what every committed run wrote; to_json writes those keys back (and may
    add the ones a newer writer knows)."""
    launcher = json.loads((run / ev.LAUNCHER).read_text())
    manifest = json.loads((run / ev.MANIFEST).read_text())
    written = ev.LauncherRecord.from_json(launcher).to_json()
    assert set(launcher) - {"engine"} <= set(written)
    assert all(written[k] == v for k, v in launcher.items() if k in written)
    records = {"first_failure": ev.FirstFailure, "hang": ev.HangRecord,
               "interrupt_stall": ev.HangRecord, "stacks": ev.StacksRecord}  # fmt: skip
    for key, record in records.items():
        if launcher.get(key):
            again = record.from_json(launcher[key]).to_json()
            assert {k: again[k] for k in launcher[key]} == launcher[key], key
    head = ev.ManifestHead.from_json(manifest).to_json()
    assert all(manifest[k] == head[k] for k in head if k in manifest)
