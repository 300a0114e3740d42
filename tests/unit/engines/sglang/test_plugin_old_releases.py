"""The plugin's wrappers on 0.5.1x signatures: run_scheduler_process with attn_cp/moe ranks
before pp_rank, and writing_check/loading_check that count and drain inside the call."""

from types import SimpleNamespace

from hicache_diag.engines.sglang.plugin import boot
from hicache_diag.engines.sglang.plugin.hook_points import STATE


def test_entry_reads_tp_and_pp_rank_by_name(monkeypatch):
    seen = {}
    monkeypatch.setattr(boot, "_arm_rank", lambda sa, tp, pp: seen.update(sa=sa, tp=tp, pp=pp))

    def run_scheduler_process(
        server_args,
        port_args,
        gpu_id,
        tp_rank,
        attn_cp_rank,
        moe_dp_rank,
        moe_ep_rank,
        pp_rank,
        dp_rank,
        pipe_writer,
    ):
        return "ran"

    wrapped = boot._wrap_entry(run_scheduler_process)
    assert wrapped("sa", "pa", 0, 1, 0, 0, 0, 1, None, "w") == "ran"
    assert seen == {"sa": "sa", "tp": 1, "pp": 1}


class _Recorder:
    def __init__(self):
        self.calls = []

    def consumed(self, kind, n):
        self.calls.append((kind, n))

    def source_decided(self, name, outcome):  # the dynamic source probes (source_probes.py)
        self.calls.append((name, outcome))


def test_old_writing_check_counts_what_it_drained(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(STATE, "recorder", recorder)

    class Tree:
        def __init__(self):
            self.cache_controller = SimpleNamespace(ack_write_queue=["a", "b", "c"])

        def writing_check(self, write_back=False):  # 0.5.1x: no finish_count parameter
            del self.cache_controller.ack_write_queue[:2]

    Tree.writing_check = boot._wrap_check("write")(Tree.writing_check)
    Tree().writing_check()
    assert recorder.calls == [("write", 2), ("dma-ack-count.write", 2)]


def test_new_writing_check_keeps_its_finish_count(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(STATE, "recorder", recorder)
    got = {}

    class Tree:
        def writing_check(self, write_back=False, finish_count=None):
            got["finish_count"] = finish_count

    Tree.writing_check = boot._wrap_check("write")(Tree.writing_check)
    Tree().writing_check(finish_count=3)
    assert got == {"finish_count": 3}
    assert recorder.calls == [("write", 3), ("dma-ack-count.write", 3)]
