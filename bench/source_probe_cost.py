"""Source probe cost: CPU time per call that the dynamic `sources` probes add to SGLang's methods
(engines/sglang/plugin/source_probes.py, docs/sources.md "Dynamic"), on
stand-ins with SGLang 0.5.23's
attributes, with a recorder armed and unarmed.

    python bench/source_probe_cost.py [--calls 200000]

Measures process CPU time (immune to other processes' load), the median of 5 rounds. The
scheduler calls each probed method about once per step (maybe_reap, the drain, the ack counts),
so compare the figures with a step's time (milliseconds on CPU). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hicache_diag.engines.sglang.plugin import hook_points, source_probes
from hicache_diag.engines.sglang.plugin.recorder import StepRecorder


class _Hooks:
    step = 0

    def drain_fired(self):
        return []

    def apply(self, point, value, **ctx):
        return value


class _Queue:
    def qsize(self):
        return 0


class _Controller:  # SessionController.maybe_reap's shape (session/session_controller.py)
    def __init__(self):
        self._last_reap_time, self.sessions = 0.0, {}

    def maybe_reap(self, now, interval=1.0):
        if now - self._last_reap_time > interval:
            self._last_reap_time = now


class _Tree:  # UnifiedRadixCache.drain_storage_control_queues' reads
    enable_storage = True

    def __init__(self):
        self.cache_controller = type("CC", (), {})()
        for name in source_probes.CONTROL_QUEUES:
            setattr(self.cache_controller, name, _Queue())

    def drain_storage_control_queues(self):
        cc = self.cache_controller
        return [
            q.qsize()
            for q in (cc.prefetch_hit_queue, cc.ack_backup_queue, cc.host_mem_release_queue)
        ]


def _cpu_ns(fn, calls: int) -> float:
    rounds = []
    for _ in range(5):
        start = time.process_time_ns()
        for _ in range(calls):
            fn()
        rounds.append((time.process_time_ns() - start) / calls)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200_000)
    calls = parser.parse_args().calls
    ctl, tree = _Controller(), _Tree()
    reap = hook_points._wrap_maybe_reap(_Controller.maybe_reap)
    drain = source_probes._wrap_drain(_Tree.drain_storage_control_queues)
    cases = {
        "maybe_reap": (lambda: _Controller.maybe_reap(ctl, 0.5), lambda: reap(ctl, 0.5)),
        "drain_storage_control_queues": (
            lambda: _Tree.drain_storage_control_queues(tree),
            lambda: drain(tree),
        ),
    }
    with tempfile.TemporaryDirectory() as tmp:
        rec = StepRecorder(str(Path(tmp) / "rank0.jsonl"), 0, 0, 0, _Hooks())
        print(f"{'method':32} {'bare ns':>9} {'unarmed ns':>11} {'armed ns':>9}")
        for name, (bare, wrapped) in cases.items():
            hook_points.STATE.recorder = None
            b, u = _cpu_ns(bare, calls), _cpu_ns(wrapped, calls)
            hook_points.STATE.recorder = rec
            a = _cpu_ns(lambda w=wrapped: (w(), rec._reads.clear()), calls)
            hook_points.STATE.recorder = None
            print(f"{name:32} {b:9.0f} {u:11.0f} {a:9.0f}")
        rec.close()


if __name__ == "__main__":
    main()
