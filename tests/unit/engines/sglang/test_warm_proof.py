"""The warm server's clean-state proof without SGLang: the facts read off scheduler-shaped
objects (0.5.2x names and older ones, "unknown" where a release lacks one), the comparison
with the fresh server's, the boundary round trip through real files (a rank thread answering
the harness), and the manifest record read back losslessly."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.clean_proof import SETTLE_S, Control, differences, not_empty
from hicache_diag.engines.sglang.plugin.clean_state import Boundary, read_facts, tree_nodes
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder
from hicache_diag.faults.hooks import Hooks


class _Pool:
    def __init__(self, available: int, size: int) -> None:
        self.available, self.size = available, size

    def available_size(self) -> int:
        return self.available


def _node(*children):
    return SimpleNamespace(children=dict(enumerate(children)))


def _scheduler(nodes=(), sessions=0, running=0, ack_write=0, new_names=True):
    tree = SimpleNamespace(
        evictable_size=lambda: 4 * len(nodes),
        protected_size=lambda: 0,
        total_size=lambda: (4 * len(nodes), 0),
        all_values_flatten=lambda: [0] * (4 * len(nodes)),
        ongoing_write_through={},
        ongoing_load_back={},
        cache_controller=SimpleNamespace(
            mem_pool_host=_Pool(512, 512),
            write_queue=[],
            load_queue=[],
            ack_write_queue=[object()] * ack_write,
            ack_load_queue=[],
            storage_backend=None,
        ),
    )
    root = _node(*nodes)
    table = {str(i): None for i in range(sessions)}
    if new_names:  # 0.5.2x: UnifiedRadixCache's tree_core, the session controller
        tree.tree_core = SimpleNamespace(root_node=root)
        controller = SimpleNamespace(sessions=table, _last_reap_time=time.monotonic())
        extra = {"session_controller": controller}
    else:
        tree.root_node = root
        extra = {"sessions": table}
    return SimpleNamespace(
        token_to_kv_pool_allocator=_Pool(252, 256),
        req_to_token_pool=_Pool(8, 8),
        waiting_queue=[],
        running_batch=SimpleNamespace(reqs=[object()] * running),
        tree_cache=tree,
        random_seed=7,
        **extra,
    )


def test_facts_are_read_off_both_generations_of_names():
    new = read_facts(_scheduler(nodes=(_node(_node()),), sessions=1))
    old = read_facts(_scheduler(nodes=(_node(_node()),), sessions=1, new_names=False))
    for facts in (new, old):
        assert facts["tree_nodes"] == 2 and facts["sessions"] == 1
        assert facts["device_available"] == 252 and facts["device_size"] == 256
        assert facts["host_available"] == facts["host_size"] == 512
        assert facts["ack_write_queue"] == 0 and facts["ongoing_load_back"] == 0
    assert new == old


def test_a_rust_tree_core_is_read_by_its_values():
    class RustCore:  # 0.5.23's rust_tree_core adapter: no Python nodes
        @property
        def root_node(self):
            raise NotImplementedError("root_node: not yet ported to the Rust tree core")

    scheduler = _scheduler(nodes=(_node(),))
    scheduler.tree_cache.tree_core = RustCore()
    facts = read_facts(scheduler)
    assert "tree_nodes" not in facts and facts["tree_values"] == 4
    assert "rank0: tree_values 4 (fresh server: 0)" in differences(
        {0: facts}, {0: {**facts, "tree_values": 0, "evictable_size": 0, "total_size": [0, 0]}}
    )


def test_what_a_release_lacks_reads_unknown_and_is_never_clean():
    bare = SimpleNamespace(tree_cache=SimpleNamespace(), running_batch=None)
    facts = read_facts(bare)
    assert facts["tree_nodes"] == facts["tree_values"] == ev.UNKNOWN
    assert facts["sessions"] == ev.UNKNOWN
    assert facts["device_available"] == ev.UNKNOWN and facts["host_available"] == ev.UNKNOWN
    assert tree_nodes(SimpleNamespace()) == ev.UNKNOWN
    diffs = differences({0: facts}, {0: facts})
    assert any("sessions unknown" in d for d in diffs)


def test_a_clean_warm_server_equals_the_fresh_one():
    fresh = {r: read_facts(_scheduler()) for r in (0, 1)}
    assert differences({r: read_facts(_scheduler()) for r in (0, 1)}, fresh) == []
    assert not_empty(fresh) == []


@pytest.mark.parametrize(
    ("dirty", "expected"),
    [
        ({"nodes": (_node(),)}, "rank1: tree_nodes 1 (fresh server: 0)"),
        ({"nodes": (_node(),)}, "rank1: tree_values 4 (fresh server: 0)"),
        ({"sessions": 1}, "rank1: sessions 1 (fresh server: 0)"),
        ({"running": 1}, "rank1: running_reqs 1 (fresh server: 0)"),
        ({"ack_write": 2}, "rank1: ack_write_queue 2 (fresh server: 0)"),
    ],
)
def test_any_fact_off_on_any_rank_is_a_difference(dirty, expected):
    fresh = {r: read_facts(_scheduler()) for r in (0, 1)}
    now = {0: read_facts(_scheduler()), 1: read_facts(_scheduler(**dirty))}
    assert expected in differences(now, fresh)


def test_a_missing_rank_or_an_unreadable_one_differs():
    fresh = {r: read_facts(_scheduler()) for r in (0, 1)}
    assert differences({0: fresh[0]}, fresh) == ["ranks [0] answered; the fresh server had [0, 1]"]
    broken = {0: fresh[0], 1: {"error": "AttributeError: x"}}
    assert differences(broken, fresh) == ["rank1: its facts could not be read: AttributeError: x"]


def test_a_fresh_server_that_is_not_empty_is_no_reference():
    fresh = {0: read_facts(_scheduler(sessions=1))}
    assert not_empty(fresh) == ["rank0: sessions 1 on the fresh server"]
    assert differences(fresh, fresh) == ["rank0: sessions 1, on the fresh server too (not empty)"]


def _rank_thread(control_dir, scheduler, recorder, stop):
    boundary = Boundary(str(control_dir), 0)

    def loop():
        while not stop.is_set():
            recorder.begin_step()
            recorder.end_step(scheduler, None)
            boundary.poll(scheduler, recorder)
            time.sleep(0.005)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_the_boundary_round_trip_through_real_files(tmp_path):
    first, second = tmp_path / "trial0", tmp_path / "trial1"
    first.mkdir()
    recorder = StepRecorder(str(ev.rank_jsonl(first, 0)), 0, 0, 0, Hooks(rank=0))
    scheduler, stop = _scheduler(), threading.Event()
    control = Control(tmp_path / "control", world_size=1)
    thread = _rank_thread(control.dir, scheduler, recorder, stop)
    try:
        proofs = control.ask(second, None, timeout_s=10)
        assert proofs == {0: read_facts(scheduler)}
        proof = ev.read_record(ev.CleanStateProof, ev.clean_state_json(second, 0))
        assert proof.seq == 1 and proof.info["rng_reseeded"] in (7, ev.UNKNOWN)
        assert proof.info["session_reap_reset"] is True
        assert scheduler.session_controller._last_reap_time == 0.0  # a new controller's phase
        assert not ev.rank_jsonl(second, 0).exists()  # a proof alone moves no steps
        assert control.ask(None, second, timeout_s=10) == {}
        time.sleep(1.2)  # one heartbeat line lands in the new run dir
    finally:
        stop.set()
        thread.join(5)
        recorder.close()
    moved = ev.read_steps(ev.rank_jsonl(second, 0)) if hasattr(ev, "read_steps") else None
    assert ev.rank_jsonl(second, 0).stat().st_size > 0, moved
    assert "sources_armed" in ev.rank_jsonl(second, 0).read_text()  # a new file's first line


def test_a_rank_that_never_answers_is_reported_not_waited_for(tmp_path):
    control = Control(tmp_path / "control", world_size=2)
    assert control.ask(tmp_path / "trial", None, timeout_s=0.3) is None


def test_the_manifest_keeps_the_warm_server_record_losslessly():
    record = ev.WarmServerRecord(
        reused=False,
        why="restarted: not clean",
        server_trial=2,
        server_pid=123,
        boundary_s=0.4,
        proof={"0": {"sessions": 1}},
        fresh={"0": {"sessions": 0}},
        differences=["rank0: sessions 1 (fresh server: 0)"],
    )
    data = {"tool": "hicache-diag", "warm_server": record.to_json()}
    manifest = ev.Manifest.from_json(data)
    assert manifest.warm_server == record
    assert manifest.to_json() == data
    assert "warm_server" not in ev.Manifest.from_json({"tool": "hicache-diag"}).to_json()


def test_a_move_to_a_new_dir_creates_it_and_a_failed_one_keeps_the_old_file(tmp_path):
    first = tmp_path / "trial0"
    first.mkdir()
    recorder = StepRecorder(str(ev.rank_jsonl(first, 0)), 0, 0, 0, Hooks(rank=0))
    boundary = Boundary(str(tmp_path / "control"), 0)
    (tmp_path / "control").mkdir()
    parked = tmp_path / "between-trials"  # not there yet
    boundary.answer(_scheduler(), recorder, {"seq": 1, "steps_dir": str(parked)})
    recorder.begin_step()
    recorder.end_step(_scheduler(), None)
    assert ev.rank_jsonl(parked, 0).stat().st_size > 0
    with pytest.raises(OSError):
        recorder.switch(str(tmp_path / "control" / "ack-rank0.json" / "rank0.jsonl"))
    recorder._last_write = 0.0  # the next idle step writes its heartbeat
    recorder.begin_step()
    recorder.end_step(_scheduler(), None)  # still writing, to the old file
    assert ev.rank_jsonl(parked, 0).read_text().count("\n") == 2
    recorder.close()


def test_a_new_server_watches_a_new_control_dir(tmp_path):
    from hicache_diag.engines.sglang.warm import WarmSglang

    pool = WarmSglang(tmp_path)
    before = pool.control_dir
    pool.server = SimpleNamespace(close=lambda: 0.0)
    pool.stop()
    assert pool.server is None and pool.control_dir != before  # no stale request is seen


def _pool_with_server(tmp_path):
    from hicache_diag.engines.sglang.warm import WarmSglang

    pool = WarmSglang(tmp_path)
    closed = []
    pool.server = SimpleNamespace(
        close=lambda: closed.append(1) or 0.0,
        alive=lambda: True,
        popen=SimpleNamespace(pid=4242),
        url="http://127.0.0.1:9",
    )
    return pool, closed


def _cfg(faults=(), backend=None, storage_dir=None, patch=None):
    spec = SimpleNamespace(hicache_storage_backend=backend, hicache_storage_dir=storage_dir)
    release = {"patch": {"sha256": patch}} if patch else {}
    return SimpleNamespace(
        python="p",
        sglang_version="v",
        spec=spec,
        cpu_kernel_names={},
        faults=faults,
        world_size=2,
        release=release,
    )


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        (_cfg(faults=("dma-delay",)), "restarted: this trial has faults"),
        (_cfg(backend="nixl"), "restarted: the L3 backend 'nixl'"),
        (_cfg(backend="file", storage_dir="/data"), "restarted: a user's --hicache-storage-dir"),
        (_cfg(), "restarted: this trial's launch differs"),
        (_cfg(patch="ab12"), "restarted: this trial's release or --patch"),
    ],
)
def test_a_server_is_not_reused_for_faults_an_unproven_l3_or_another_launch(tmp_path, cfg, why):
    from hicache_diag.engines.sglang.warm import _key

    pool, closed = _pool_with_server(tmp_path)
    pool.key = _key(_cfg(backend="other"))
    record = pool.boundary(cfg, tmp_path / "trial")
    assert not record.reused and record.why.startswith(why) and record.server_pid == 4242
    assert closed == [1] and pool.server is None


def test_a_warm_server_never_serves_another_patch(tmp_path):
    """The key leads with (release, patch sha): an unpatched server is not reused for a patched
    trial, nor a server of one patch for another's, even with every other fact equal."""
    from hicache_diag.engines.sglang.warm import _key

    keys = [_key(_cfg(patch=p)) for p in (None, "ab12", "cd34")]
    assert all(a != b for i, a in enumerate(keys) for b in keys[i + 1 :])
    pool, closed = _pool_with_server(tmp_path)
    pool.key = _key(_cfg(patch="ab12"))
    record = pool.boundary(_cfg(patch="cd34"), tmp_path / "trial")
    assert not record.reused and "--patch differs" in record.why and closed == [1]


def test_a_trial_with_faults_or_a_failure_is_always_followed_by_a_restart(tmp_path):
    from hicache_diag.trials.engine import TrialWatch

    pool, closed = _pool_with_server(tmp_path)
    assert not pool.release(_cfg(faults=("dma-delay",)), TrialWatch(), done=True)
    assert "faults" in pool.reusable
    failed = TrialWatch(first_failure=ev.FirstFailure(1, 0.0, 7, 1))
    assert not pool.release(_cfg(), failed, done=True) and "failed or hung" in pool.reusable
    assert not pool.release(_cfg(), TrialWatch(), done=False)
    record = pool.boundary(_cfg(), tmp_path / "trial")
    assert record.why == "restarted: the previous trial left requests unanswered"


def test_an_empty_python_tree_holds_no_values_without_asking_it():
    def flatten():  # 0.5.18 RadixCache.all_values_flatten: torch.cat([]) on an empty tree
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")

    scheduler = _scheduler(new_names=False)
    scheduler.tree_cache.all_values_flatten = flatten
    facts = read_facts(scheduler)
    assert facts["tree_nodes"] == facts["tree_values"] == 0 and "error" not in facts
    scheduler.tree_cache.root_node = _node(_node())  # a tree with nodes is still asked
    with pytest.raises(ValueError):
        read_facts(scheduler)


@pytest.mark.parametrize(("outcome", "reused"), [("diverged", False), (None, False), ("ok", True)])
def test_a_trial_judged_not_ok_after_release_still_restarts_the_server(
    tmp_path, monkeypatch, outcome, reused
):
    """A silent divergence is known only from the verdict, after the server was released: the
    next boundary reads it (None: the trial left no verdict)."""
    from hicache_diag.engines.sglang import warm
    from hicache_diag.evidence.verdict import Outcome, Verdict

    pool, closed = _pool_with_server(tmp_path)
    cfg = _cfg()
    pool.key = warm._key(cfg)
    last = tmp_path / "trial0"
    last.mkdir()
    if outcome is not None:
        Verdict(outcome=Outcome(outcome)).write(last / "verdict.json")
    pool.note_trial(last)
    proven = ev.WarmServerRecord(reused=True, why="proven clean on every rank")
    monkeypatch.setattr(warm.WarmSglang, "_prove", lambda self, run_dir: proven)
    record = pool.boundary(cfg, tmp_path / "trial1")
    assert record.reused is reused
    if not reused:
        said = outcome or "no verdict"
        assert record.why == f"restarted: the previous trial's verdict was {said}"
        assert closed == [1]


def _recorded_look(pp1_tokens=0, problems=()):
    """A look as the boundary recorded it: PP1's tree still holding `pp1_tokens` (its flush
    lands a little after PP0's answered /flush_cache), compared with a clean fresh server."""
    from hicache_diag.engines.sglang.clean_proof import Look

    fresh = {r: read_facts(_scheduler()) for r in (0, 1)}
    now = {r: dict(f) for r, f in fresh.items()}
    if pp1_tokens:
        now[1].update(tree_values=pp1_tokens, evictable_size=pp1_tokens)
    return Look(now, list(problems), differences(now, fresh))


def _pool_looking(tmp_path, monkeypatch, looks):
    """A warm pool whose boundary sees `looks` in turn (no SGLang); the waits it would sleep
    are recorded in `pool.waits` instead."""
    from hicache_diag.engines.sglang import clean_proof, warm

    pool, closed = _pool_with_server(tmp_path)
    pool.waits = []
    monkeypatch.setattr(clean_proof.time, "sleep", pool.waits.append)
    seen = iter(looks)
    monkeypatch.setattr(warm.WarmSglang, "_look", lambda self, run_dir, fresh=False: next(seen))
    pool.control = SimpleNamespace(ask=lambda proof_dir, steps_dir: {})
    return pool, closed


def test_a_stage_still_flushing_gets_a_second_look_and_the_first_is_recorded(tmp_path, monkeypatch):
    pool, closed = _pool_looking(tmp_path, monkeypatch, [_recorded_look(234), _recorded_look()])
    record = pool._prove(tmp_path / "trial1")
    assert record.reused and record.why == "proven clean on every rank" and closed == []
    assert record.second_look and record.differences == [] and pool.waits == [SETTLE_S]
    assert record.first_look["proof"]["1"]["tree_values"] == 234
    assert "rank1: tree_values 234 (fresh server: 0)" in record.first_look["differences"]
    assert ev.Manifest.from_json({"warm_server": record.to_json()}).warm_server == record


def test_a_server_still_dirty_on_the_second_look_restarts(tmp_path, monkeypatch):
    pool, closed = _pool_looking(tmp_path, monkeypatch, [_recorded_look(234), _recorded_look(234)])
    record = pool._prove(tmp_path / "trial1")
    assert not record.reused and record.why == "restarted: not clean" and closed == [1]
    assert record.second_look and "rank1: tree_values 234 (fresh server: 0)" in record.differences


@pytest.mark.parametrize(
    "first",
    [_recorded_look(), _recorded_look(234, problems=["/flush_cache refused: HTTP 400"])],
    ids=["clean", "flush-refused"],
)
def test_one_look_decides_a_clean_server_or_a_refused_flush(tmp_path, monkeypatch, first):
    """A refused flush (a request still running) or a rank that did not answer is no race: no
    second look; a clean first look needs none."""
    pool, _ = _pool_looking(tmp_path, monkeypatch, [first])  # a second look would raise
    record = pool._prove(tmp_path / "trial1")
    assert not record.second_look and record.first_look == {} and pool.waits == []
    assert record.reused is first.clean


def _fresh_look(pp1_tokens=0):
    from hicache_diag.engines.sglang.clean_proof import Look

    now = {r: read_facts(_scheduler()) for r in (0, 1)}
    if pp1_tokens:  # the readiness request's prefix, PP1 not yet flushed
        now[1].update(tree_values=pp1_tokens, evictable_size=pp1_tokens)
    return Look(now, [], not_empty(now))


@pytest.mark.parametrize(("second", "reference"), [(0, True), (9, False)])
def test_a_fresh_server_still_flushing_gets_a_second_look(tmp_path, monkeypatch, second, reference):
    from hicache_diag.engines.sglang import clean_proof, warm

    pool, _ = _pool_with_server(tmp_path)
    waits = []
    monkeypatch.setattr(clean_proof.time, "sleep", waits.append)
    seen = iter([_fresh_look(9), _fresh_look(second)])
    monkeypatch.setattr(warm.WarmSglang, "_look", lambda self, run_dir, fresh: next(seen))
    pool.take_fresh_proof(tmp_path / "trial0")
    assert waits == [SETTLE_S]
    assert (pool.fresh_problems == []) is reference
    assert pool.fresh[1]["tree_values"] == second
