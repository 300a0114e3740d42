"""export's parts on the committed 0.5.23 form-B run and on tiny synthetic source trees: which
runs it takes, the test it writes (SGLang-only imports, the run's numbers), the launch script's
flags and requests, the mechanism's file:line and the release range from source."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

from hicache_diag.errors import RunDirError
from hicache_diag.export import launch
from hicache_diag.export.case import load_case
from hicache_diag.export.export import export_run
from hicache_diag.export.recipes import URC_WRITE_THROUGH, find_recipe
from hicache_diag.export.report import range_lines
from hicache_diag.export.source_lines import Step, locate, present
from tests.unit.sources.tree import write_tree

RUNS = Path(__file__).resolve().parents[3] / "samples" / "runs"
FORM_B = RUNS / "sglang-0.5.23-form-b"

URC_NEW = """
class UnifiedRadixCache:
    def _sync_hicache_ready_counts(self):
        if cc is None or (self.pp_rank > 0 and x):
            pass

    def writing_check(self, finish_count=None):
        while finish_count > 0:
            ack = cc.ack_write_queue.pop(0)
"""
URC_OLD = """
class UnifiedRadixCache:
    def _sync_hicache_ready_counts(self):
        pass

    def writing_check(self, finish_count=None):
        if finish_count is None:
            if self.pp_rank == 0:
                pass
        while finish_count > 0:
            ack = cc.ack_write_queue.pop(0)
"""
URC_GUARDED = """
class UnifiedRadixCache:
    def writing_check(self, finish_count=None):
        for ack in cc.ack_write_queue[:finish_count]:
            pass
"""
F = "srt/mem_cache/unified_radix_cache.py"
STEPS = (
    Step(
        F,
        "UnifiedRadixCache",
        "_sync_hicache_ready_counts",
        "self.pp_rank > 0",
        "follower",
        alt=(("writing_check", "if self.pp_rank == 0:"),),
    ),
    Step(F, "UnifiedRadixCache", "writing_check", "ack = cc.ack_write_queue.pop(0)", "pop"),
)


def test_locate_finds_the_line_in_that_release_and_the_alternative_place(tmp_path):
    new = write_tree(tmp_path / "new", {"mem_cache/unified_radix_cache.py": URC_NEW})
    old = write_tree(tmp_path / "old", {"mem_cache/unified_radix_cache.py": URC_OLD})
    assert locate(new, STEPS[0]) == ("_sync_hicache_ready_counts", 4)
    assert locate(old, STEPS[0]) == ("writing_check", 8)
    assert locate(new, STEPS[1]) == ("writing_check", 9)
    assert present(new, STEPS) and present(old, STEPS)


def test_release_range_says_where_the_code_shape_is_and_is_not(tmp_path):
    trees = {
        "1.0": write_tree(tmp_path / "a", {"mem_cache/unified_radix_cache.py": URC_OLD}),
        "1.1": write_tree(tmp_path / "b", {"mem_cache/unified_radix_cache.py": URC_NEW}),
        "1.2": write_tree(tmp_path / "c", {"mem_cache/unified_radix_cache.py": URC_GUARDED}),
    }
    recipe = URC_WRITE_THROUGH.__class__(
        **{
            **{f: getattr(URC_WRITE_THROUGH, f) for f in URC_WRITE_THROUGH.__slots__},
            "steps": STEPS,
        }
    )
    text = "\n".join(range_lines(recipe, trees))
    assert "| 1.0 | yes |" in text and "| 1.1 | yes |" in text and "| 1.2 | no |" in text
    assert "Present in 1.0 .. 1.1" in text


def test_recipe_matches_form_function_file_and_stage():
    # the write-through backup is chosen by its evidence (host-shortage), never by a crash line
    urc = find_recipe("B", "writing_check", "unified_radix_cache.py", 1, tags={"host-shortage"})
    assert urc is URC_WRITE_THROUGH
    assert find_recipe("B", "writing_check", "unified_radix_cache.py", 1) is None
    # by source: only when the release has that code (and the run injected nothing)
    hr = find_recipe(
        "C",
        "_pp_commit_comm_work",
        "scheduler_pp_mixin.py",
        0,
        storage=True,
        shape=lambda recipe: True,
    )
    assert hr.name == "hiradix-pp-storage-control-drain"
    assert find_recipe("C", "x", "y.py", 0, storage=True, shape=lambda recipe: False) is None
    assert find_recipe("C", "x", "y.py", 0, storage=True) is None  # no source at hand
    assert find_recipe("B", "loading_check", "hiradix_cache.py", 1, shape=lambda r: True) is None
    assert find_recipe("B", "writing_check", "unified_radix_cache.py", 0) is None  # PP0
    assert find_recipe("A", "writing_check", "unified_radix_cache.py", 1) is None
    assert find_recipe("B", "loading_check", "unified_radix_cache.py", 1) is None


def test_case_of_the_committed_form_b_run():
    case = load_case(FORM_B)
    assert (case.version, case.form, case.failed_rank, case.failed_pp) == ("0.5.23", "B", 1, 1)
    assert (case.function, case.file, case.line) == (
        "writing_check",
        "unified_radix_cache.py",
        3508,
    )
    # PP0's first backup: 56 tokens out of 516 free host slots (rank0.jsonl step 2795)
    assert case.numbers == {"kv_tokens": 56, "leader_host_free": 516}
    assert case.traceback[-1] == "IndexError: pop from empty list"
    assert not [ln for ln in case.traceback if "hicache_diag" in ln]
    assert any('File "sglang/srt/mem_cache/unified_radix_cache.py"' in ln for ln in case.traceback)


@pytest.mark.parametrize(
    ("sample", "needle"),
    [
        ("form_b", "builtin engine"),
        ("healthy", "builtin engine"),
    ],
)
def test_runs_export_cannot_take_are_refused_by_name(sample, needle):
    with pytest.raises(RunDirError, match=needle):
        load_case(RUNS / sample)


def _copy(tmp_path: Path, edit) -> Path:
    run = tmp_path / "run"
    shutil.copytree(FORM_B, run)
    verdict = json.loads((run / "verdict.json").read_text())
    edit(verdict)
    (run / "verdict.json").write_text(json.dumps(verdict))
    return run


def test_a_run_that_did_not_crash_or_crashed_elsewhere_is_refused(tmp_path, no_release):
    ok = _copy(tmp_path / "a", lambda v: v.update(outcome="ok", failed_rank=None))
    with pytest.raises(RunDirError, match="outcome .ok., not a crash, hang or divergence"):
        load_case(ok)

    def elsewhere(v):
        v["ranks"][1]["where"] = "loading_check (unified_radix_cache.py:3554)"

    other = _copy(tmp_path / "b", elsewhere)
    # and no mechanism in its evidence: the step lines without the recorded shortage
    for path in other.glob("rank*.jsonl"):
        path.write_text(path.read_text().replace('"host_shortages"', '"host_shortages_off"'))
    with pytest.raises(
        RunDirError,
        match="no export for form B in loading_check "
        r"\(unified_radix_cache.py\) on PP1, without L3",
    ):
        export_run(other, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "refused before writing anything"


@pytest.fixture
def no_release(monkeypatch):
    """No SGLang source at hand (and no probe of an interpreter: a unit test starts nothing)."""
    from hicache_diag.export import export

    monkeypatch.setattr(export, "run_release", lambda version, python: None)
    monkeypatch.setattr(export, "releases", dict)


def test_exported_test_imports_only_sglang_and_carries_the_runs_numbers(tmp_path, no_release):
    done = export_run(FORM_B, tmp_path / "out")
    assert done.lines_from is None
    names = sorted(p.name for p in done.files)
    assert names == sorted(
        [
            "REPORT.md",
            "conftest.py",
            "launch.sh",
            "model_config.json",
            "requests.json",
            "send_requests.py",
            "test_write_through_rank_symmetry.py",
        ]
    )
    source = done.test.read_text()
    tree = ast.parse(source)
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    } | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {
        "unittest",
        "types",
        "torch",
        "sglang",
        "array",
        "multiprocessing",
        "os",
        "tempfile",
        "time",
        "traceback",
    }
    assert "KV_TOKENS = 56" in source and "ROOMY_HOST_FREE = 516" in source
    assert 'TOPOLOGY = "pp"' in source and "SHORT_RANK = 1" in source
    assert "UnifiedRadixCache(params=params)" in source  # its constructor, on real groups
    compile(source, "t.py", "exec")
    compile((tmp_path / "out" / "send_requests.py").read_text(), "s.py", "exec")


def test_launch_script_has_the_runs_flags_and_cpu_flags_apart():
    case = load_case(FORM_B)
    flags, cpu = launch.split_flags(case.server_argv)
    assert flags[:4] == ["--pp-size", "2", "--tp-size", "1"]
    assert "--model-path" not in flags and "--port" not in flags and "--host" not in flags
    assert "--enable-hierarchical-cache" in flags and "write_through" in flags
    assert cpu == [
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--disable-cuda-graph",
        "--hicache-io-backend",
        "direct",
        "--hicache-mem-layout",
        "layer_first",
    ]
    text = launch.script(case, "t")
    assert "--wave 2" in text and "sglang.launch_server" in text


def test_launch_script_exports_the_servers_own_switches(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FORM_B, run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert "export SGLANG_REQ_WAITING_TIMEOUT" not in launch.script(load_case(run), "t")
    manifest["config"]["spec"]["env"] = [["SGLANG_REQ_WAITING_TIMEOUT", "1.5"]]
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert "export SGLANG_REQ_WAITING_TIMEOUT=1.5\n" in launch.script(load_case(run), "t")


def test_requests_are_the_runs_workload_regenerated_from_its_seed():
    case = load_case(FORM_B)
    reqs = launch.requests(case)
    assert len(reqs) == 24 and reqs[0]["rid"] == "r0000" and reqs[0]["max_new_tokens"] == 8
    assert reqs == launch.requests(case)  # deterministic
    assert all(0 <= t < 512 for r in reqs for t in r["input_ids"])


def test_releases_at_hand_are_found_in_both_layouts_in_version_order(tmp_path, monkeypatch):
    from hicache_diag.export.trees import releases

    write_tree(tmp_path / "wheels" / "0.5.10", {"x.py": ""})
    write_tree(tmp_path / "wheels" / "0.5.9", {"x.py": ""})
    site = tmp_path / "venvs" / "sglang-0.5.12.post1" / "lib" / "python3.11" / "site-packages"
    write_tree(site, {"x.py": ""})
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_RELEASES", str(tmp_path / "wheels"))
    monkeypatch.setenv("HICACHE_DIAG_SGLANG_VENVS", str(tmp_path / "venvs"))
    found = releases()
    assert list(found) == ["0.5.9", "0.5.10", "0.5.12.post1"]
    assert found["0.5.12.post1"] == site / "sglang"


def test_report_names_the_mechanism_with_lines_from_the_release(tmp_path, monkeypatch):
    from hicache_diag.export import export

    pkg = write_tree(
        tmp_path / "rel", {"mem_cache/unified_radix_cache.py": URC_NEW}, version="0.5.23"
    )
    monkeypatch.setattr(export, "run_release", lambda version, python: pkg)
    monkeypatch.setattr(export, "releases", lambda: {"0.5.23": pkg})
    done = export_run(FORM_B, tmp_path / "out")
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert done.lines_from == pkg
    assert (
        "`UnifiedRadixCache.writing_check` (sglang/srt/mem_cache/unified_radix_cache.py:9)" in text
    )
    assert "(not found in this release)" in text  # the synthetic tree lacks the backup steps
    assert "[#29109](https://github.com/sgl-project/sglang/pull/29109)" in text
    assert "host-shortage:leave=0,rank=1" in text and "IndexError" in text


HUNT_518_HOST_POOL = RUNS.parent / "hunt" / "sglang-0.5.18" / "runs" / "host-pool"


def test_the_tree_cache_class_is_read_from_the_ranks_logs_or_the_traceback():
    from hicache_diag.export.case import cache_class

    assert load_case(FORM_B).cache_class == "UnifiedRadixCache"
    assert load_case(HUNT_518_HOST_POOL).cache_class == "HiRadixCache"
    frame = '  File "sglang/srt/mem_cache/hiradix_cache.py", line 1060, in writing_check'
    assert cache_class({}, [frame]) == "HiRadixCache"
    assert cache_class({0: "no such line"}, []) is None


def test_a_run_of_another_cache_class_than_the_recipe_drives_is_refused(tmp_path, no_release):
    """The 0.5.18 host-pool hunt run: the write-through evidence, in HiRadixCache; the recipe
    drives UnifiedRadixCache, so it would cite and test a class the run never ran."""
    with pytest.raises(RunDirError, match="ranks ran HiRadixCache, but the recipe it matches "):
        export_run(HUNT_518_HOST_POOL, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_patched_run_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FORM_B, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["sglang"]["patch"] = {"file": "/x/fix.patch", "sha256": "ab" * 32}
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RunDirError, match="with --patch /x/fix.patch: its code is not the"):
        load_case(run)


def test_a_missing_release_source_names_the_release_and_its_install_command(tmp_path, no_release):
    """The L3 drain is picked by the release's code shape: without 0.5.18's source the export
    cannot choose, and says how to get it."""
    run = RUNS / "sglang-0.5.18-l3-no-fault"
    with pytest.raises(RunDirError) as err:
        export_run(run, tmp_path / "out")
    said = str(err.value)
    assert "SGLang 0.5.18's source" in said, said
    assert "hicache_diag.engines.sglang.install" in said and "--version 0.5.18" in said, said


def test_report_describes_only_the_hand_made_patches_beside_it(tmp_path, no_release):
    bare = export_run(FORM_B, tmp_path / "bare").out / "REPORT.md"
    assert "nonfix.patch" not in bare.read_text() and "fix.patch" not in bare.read_text()
    (tmp_path / "with").mkdir()
    (tmp_path / "with" / "nonfix.patch").write_text("x")
    (tmp_path / "with" / "fix.patch").write_text("x")
    text = (export_run(FORM_B, tmp_path / "with").out / "REPORT.md").read_text()
    assert "## A fix, told from a non-fix" in text and "## A candidate fix (`fix.patch`)" in text
