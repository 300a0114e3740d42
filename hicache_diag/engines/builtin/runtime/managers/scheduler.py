"""Mirrors sglang/srt/managers/scheduler.py: `Scheduler` and `run_scheduler_process`.

One Scheduler per rank. It owns the waiting queue, the per-slot running batches and this rank's
caches; the PP event loop lives in `SchedulerPPMixin`.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hicache_diag.engines.builtin.runtime.managers.io_struct import RecvReqs
from hicache_diag.engines.builtin.runtime.managers.schedule_batch import Req, ScheduleBatch
from hicache_diag.engines.builtin.runtime.managers.schedule_policy import PrefillAdder
from hicache_diag.engines.builtin.runtime.managers.scheduler_pp_mixin import SchedulerPPMixin
from hicache_diag.engines.builtin.runtime.model_executor.forward_batch_info import ForwardMode
from hicache_diag.engines.builtin.runtime.model_executor.model_runner import ModelRunner
from hicache_diag.engines.builtin.runtime.server_args import RunConfig

if TYPE_CHECKING:
    from hicache_diag.engines.builtin.probes.recorder import RankRecorder
    from hicache_diag.engines.builtin.runtime.distributed.comm import HiCacheComm
    from hicache_diag.engines.builtin.runtime.mem_cache.kv_cache_builder import KVCacheBundle
    from hicache_diag.faults.hooks import Hooks

logger = logging.getLogger("hicache_diag.scheduler")


class Scheduler(SchedulerPPMixin):
    """Runs on the rank's main thread. `request_source(step) -> list[TokenizedGenerateReqInput]`
    feeds PP0 (None on other stages); `recorder.record(...)` writes one jsonl line per step."""

    def __init__(
        self,
        run_config: RunConfig,
        comm: HiCacheComm,
        bundle: KVCacheBundle,
        hooks: Hooks,
        recorder: RankRecorder,
        request_source: Any = None,
        stop_after: int = 0,
        on_budget_exhausted: Callable[[int, int], None] | None = None,
    ) -> None:
        self.server_args = sa = run_config.server_args
        self.max_steps = run_config.step_budget
        self.on_budget_exhausted = on_budget_exhausted  # (steps, unfinished requests)
        self.comm, self.hooks, self.recorder = comm, hooks, recorder
        self.pp_rank, self.pp_size = comm.pp_rank, comm.pp_size
        self.tree_cache, self.allocator = bundle.tree_cache, bundle.allocator
        self.model_runner = ModelRunner(sa, comm.pp_rank, comm.tp_rank, bundle.kv_pool, comm)
        self.request_source, self.stop_after = request_source, stop_after
        self.waiting_queue: list[Req] = []
        self.num_active = 0  # admitted, not finished (in a running batch or in flight)
        self.finished_outputs: dict[str, list[int]] = {}
        self.step = 0
        self.evicted_tokens = 0
        self._stop_next = False

    # ---- requests ----------------------------------------------------------------------------
    def recv_requests(self) -> RecvReqs:
        """PP0 takes this step's arrivals and decides when to stop; others get PP0's object."""
        if not self.comm.is_first_rank:
            return self.comm.recv_pyobj_from_prev()
        stop = self._stop_next
        reqs = tuple(self.request_source(self.step)) if not stop else ()
        return RecvReqs(reqs=reqs, stop=stop)

    def decide_stop(self) -> None:
        """PP0, at the end of a step: stop once every request is done. The stop travels with the
        next step's requests, so that step's output relay still runs on every stage."""
        done = self.step >= self.stop_after and not self.waiting_queue and self.num_active == 0
        stopping, self._stop_next = self._stop_next, done or self.step + 1 >= self.max_steps
        if self._stop_next and not (done or stopping) and self.on_budget_exhausted is not None:
            # The budget is the tool's limit: say so, so the verdict is `undecided`, not a form.
            self.on_budget_exhausted(self.step + 1, len(self.waiting_queue) + self.num_active)

    def process_input_requests(self, recv: RecvReqs) -> None:
        for r in recv.reqs:
            req = Req(r.rid, list(r.input_ids), r.max_new_tokens)
            self.waiting_queue.append(req)
            if getattr(self.tree_cache, "enable_storage", False):
                # L3 prefetch on arrival; admission matches fill_ids[:-1], so fetch that much
                self.tree_cache.prefetch_from_storage(req.rid, req.origin_input_ids[:-1])

    # ---- scheduling --------------------------------------------------------------------------
    def get_next_batch_to_run(self, mb_id: int) -> ScheduleBatch | None:
        self.tree_cache.check_hicache_events()  # ① consume DMA acks per the protocol switches
        running = self.running_mbs[mb_id]
        last = self.last_mbs[mb_id]
        if last is not None and last.forward_mode.is_extend():
            running.extend(r for r in last.reqs if not r.finished)
        self.last_mbs[mb_id] = None
        running[:] = [r for r in running if not r.finished]
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch
        if running:
            return ScheduleBatch(list(running), ForwardMode.DECODE)
        return None

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if not self.waiting_queue:
            return None
        sa = self.server_args
        adder = PrefillAdder(
            self.tree_cache,
            self.allocator,
            sa.page_size,
            rem_reqs=sa.max_running_requests - self.num_active,
            rem_input_tokens=sa.chunked_prefill_size,
        )
        storage = getattr(self.tree_cache, "enable_storage", False)
        for req in list(self.waiting_queue):
            if storage and not self.tree_cache.check_prefetch_progress(req.rid):
                continue  # its L3 prefetch goes on; later requests may still run (SGLang)
            if not adder.add_one_req(req):
                break
        self.evicted_tokens += adder.evicted
        if not adder.can_run_list:
            return None
        admitted = set(map(id, adder.can_run_list))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        self.num_active += len(adder.can_run_list)
        batch = ScheduleBatch(adder.can_run_list, ForwardMode.EXTEND, adder.prefix_lens)
        batch.hicache_consumer_index = self.tree_cache.ready_to_load_host_cache()
        return batch

    # ---- results -----------------------------------------------------------------------------
    def process_batch_result(self, batch: ScheduleBatch, next_token_ids: Any) -> None:
        for req, tok in zip(batch.reqs, next_token_ids.tolist(), strict=True):
            req.output_ids.append(int(tok))
            if req.check_finished():
                self.cache_finished_req(req)
                self.finished_outputs[req.rid] = list(req.output_ids)
                self.num_active -= 1

    def cache_finished_req(self, req: Req) -> None:
        """Insert the request's KV into the tree, free duplicate and unused slots, unlock."""
        page = self.server_args.page_size
        kv_len = req.seqlen - 1  # the last sampled token never had its KV written
        aligned = kv_len // page * page
        kv = req.kv_indices()
        plen = len(req.prefix_indices)
        cached = self.tree_cache.insert(req.fill_ids[:aligned], kv[:aligned].clone())
        if cached > plen:
            self.allocator.free(kv[plen:cached])
        rest = req.alloc_slots[aligned - plen :]
        if len(rest):
            self.allocator.free(rest)
        self.tree_cache.dec_lock_ref(req.last_node)


def run_scheduler_process(make_scheduler: Callable[[], Scheduler]) -> Scheduler:
    """Build the rank (gloo, caches, model: `make_scheduler`) and run the event loop. On any
    exception, setup included, log SGLang's line with the traceback and exit 1."""
    try:
        scheduler = make_scheduler()
        scheduler.event_loop_pp()
        return scheduler
    except BaseException:
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        for h in logging.getLogger().handlers + logger.handlers:
            h.flush()
        sys.stderr.flush()
        os._exit(1)
