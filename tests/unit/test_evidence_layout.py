"""docs/evidence.md and the layout module (hicache_diag/evidence.py) name the same files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hicache_diag import evidence as ev

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "evidence.md").read_text()


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
    from hicache_diag.engines.builtin.probes import recorder as ours
    from hicache_diag.engines.sglang.plugin import recorder as plugin

    assert ours.MUST_AGREE is ev.MUST_AGREE and ours.CRASH_KEYS is ev.BATCH_KEYS
    assert plugin.MUST_AGREE == ev.MUST_AGREE + ev.MUST_AGREE_SGLANG
    sglang_doc = DOC.split("`must_agree` lists what", 1)[1].split("A scheduler that raised", 1)[0]
    assert set(re.findall(r"`(\w+)`", sglang_doc)) >= set(ev.MUST_AGREE_SGLANG) - {
        "host_loaded_len",
        "l3_hit_len",
    }  # the batch keys the sentence names as "the batch keys"


def _section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _step_sections() -> str:
    """What the doc says of a step line: its own section and the sglang engine's bullet."""
    sglang = DOC.split("## `--engine sglang` run directories", 1)[1]
    title = "rank{r}.jsonl (one line per step; a step is one micro-batch slot of `event_loop_pp`)"
    return _section(title) + sglang.split("- `manifest.json`", 1)[0]


@pytest.mark.parametrize(
    "record, title",
    [
        (ev.Manifest, "manifest.json"),
        (ev.Topology, "manifest.json"),
        (ev.LauncherRecord, "launcher.json"),
        (ev.RankProcess, "launcher.json"),
        (ev.FirstFailure, "launcher.json"),
        (ev.HangRecord, "launcher.json"),
        (ev.StacksRecord, "launcher.json"),
        (ev.Budget, "budget.json"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_every_record_field_is_documented(record, title):
    section = _section(title)
    for name in record.keys():
        assert re.search(rf"(?<![\w]){name}(?![\w])", section), (record.__name__, name)


def test_every_step_key_is_documented_and_every_documented_key_typed():
    """StepRecord's fields are the doc's keys, both ways: a key in the table or named in
    backticks in the sglang engine's bullet is a field, and every field is named there."""
    text = _step_sections()
    # a key alone (`rids`) or inside a snippet (`recorded: false`, `{"recorder_error": ...}`)
    named = {w for span in re.findall(r"`([^`]+)`", text) for w in re.findall(r"\w+", span)}
    missing = [k for k in ev.StepRecord.keys() if k not in named]
    assert not missing, f"StepRecord fields docs/evidence.md does not name: {missing}"
    table = {
        k for row in re.findall(r"^\| (`[^|]+) \|", text, re.M) for k in re.findall(r"`(\w+)`", row)
    }
    assert table <= set(ev.StepRecord.keys()), table - set(ev.StepRecord.keys())
