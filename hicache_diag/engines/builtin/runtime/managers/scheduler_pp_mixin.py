"""Mirrors sglang/srt/managers/scheduler_pp_mixin.py: `event_loop_pp` and the PP transport.

Per slot, in SGLang's order: requests in (PP0 from the workload, others from the previous
stage) and on; ① check_hicache_events + ② get_next_batch_to_run; ③ launch (PP>0 receives the
proxy only when it has a batch; non-last stages send hidden states on); ④ process the result of
mbs[next_mb_id], whose sampled tokens travel the ring last -> PP0 -> PP1 -> ... .
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from hicache_diag.engines.builtin.runtime.managers.schedule_batch import ScheduleBatch


def _commit(work: list) -> None:
    for w in work:
        w.wait()
    work.clear()


class SchedulerPPMixin:
    """The PP loop of `Scheduler`, the one class it is mixed into. The host supplies the rank's
    state (server_args, comm, hooks, recorder, model_runner, tree_cache, allocator, pp_rank,
    pp_size, step, evicted_tokens, waiting_queue, num_active) and the scheduling steps
    (recv_requests, process_input_requests, get_next_batch_to_run, process_batch_result,
    decide_stop). Unannotated `self`, unlike SGLang's `self: Scheduler`: the mixin sits below
    the class that imports it."""

    def init_pp_loop_state(self) -> None:
        sa = self.server_args
        self.pp_loop_size = sa.pp_loop_size
        self.async_depth = sa.pp_async_batch_depth
        self.mbs: list[ScheduleBatch | None] = [None] * self.pp_loop_size
        self.last_mbs: list[ScheduleBatch | None] = [None] * self.pp_loop_size
        self.running_mbs: list[list] = [[] for _ in range(self.pp_loop_size)]
        self.pp_outputs: dict | None = None
        self.last_rank_comm_queue: deque = deque()
        self.send_req_work: list = []
        self.send_proxy_work: list = []
        self.send_output_work: list = []
        self.stopped = False

    def event_loop_pp(self) -> None:
        self.init_pp_loop_state()
        while not self.stopped:
            for mb_id in range(self.pp_loop_size):
                self._pp_loop_step(mb_id)
                if self.stopped:
                    break
        for work in (self.send_req_work, self.send_proxy_work, self.send_output_work):
            _commit(work)
        self.comm.drain_async_work()

    def _pp_loop_step(self, mb_id: int) -> None:
        self.hooks.step = self.step
        if self.hooks.has("host_hold") and hasattr(self.tree_cache, "hold_host"):
            self.tree_cache.hold_host(self.hooks)
        stall = self.hooks.apply("scheduler_step", 0.0)
        if stall:
            time.sleep(stall)
        next_first_rank_mb_id = (mb_id + self.pp_size) % self.pp_loop_size
        next_mb_id = (mb_id + 1) % self.pp_loop_size
        recv = self.recv_requests()
        if not self.comm.is_last_rank:
            _commit(self.send_req_work)
            self.send_req_work = self.comm.send_pyobj_to_next(recv)
        self.process_input_requests(recv)
        cur_batch = self.mbs[mb_id] = self.get_next_batch_to_run(mb_id)
        proxy = None
        if cur_batch and not self.comm.is_first_rank:
            proxy = self.comm.recv_dict_from_prev("proxy")
        # With async depth the last stage buffers outputs, so the exchange goes first.
        exchange_first = self.async_depth > 0
        if exchange_first:
            next_outputs = self._pp_exchange_outputs(next_first_rank_mb_id, next_mb_id)
        _commit(self.send_proxy_work)
        result = self._pp_launch_batch(cur_batch, proxy, mb_id) if cur_batch else None
        if not exchange_first:
            next_outputs = self._pp_exchange_outputs(next_first_rank_mb_id, next_mb_id)
        done = self.mbs[next_mb_id]
        if done is not None:
            self.process_batch_result(done, next_outputs["next_token_ids"])
            self.last_mbs[next_mb_id] = done
        if cur_batch and not self.comm.is_last_rank:
            tensors = {"hidden_states": result.hidden_states}
            self.send_proxy_work = self.comm.send_dict_to_next(tensors, "proxy")
        self.pp_outputs = next_outputs
        self._record_step(mb_id, cur_batch)
        self.stopped = recv.stop
        if self.comm.is_first_rank:
            self.decide_stop()
        self.step += 1

    def _pp_launch_batch(self, batch: ScheduleBatch, proxy: dict | None, mb_id: int = 0) -> Any:
        try:
            result = self.model_runner.forward(batch.build_forward_batch(), proxy)
        except Exception as exc:
            # This step never reaches _record_step: keep its batch and the upstream token count
            # as evidence (form A is a token-count mismatch, whichever op raises).
            self.recorder.record_crash(
                step=self.step,
                slot=mb_id,
                batch=batch,
                proxy=proxy,
                error=exc,
                tree_cache=self.tree_cache,
            )
            raise
        if self.comm.is_last_rank:
            self.last_rank_comm_queue.append({"next_token_ids": result.next_token_ids})
        return result

    def _pp_exchange_outputs(self, next_first_rank_mb_id: int, next_mb_id: int) -> Any:
        """Send this stage's pending outputs on and receive those of mbs[next_mb_id]. Even stages
        send first, odd ones receive first, as SGLang orders them by pp_rank parity."""
        if self.pp_size == 1:  # the ring has one stage: the result is our own
            return self.last_rank_comm_queue.popleft() if self.mbs[next_mb_id] else None
        _commit(self.send_output_work)
        received = None
        if self.pp_rank % 2 == 0:
            self.send_output_work = self._pp_send_output(next_first_rank_mb_id)
        if self.mbs[next_mb_id] is not None:
            received = self.comm.recv_dict_from_prev("output")
        if self.pp_rank % 2 == 1:
            self.send_output_work = self._pp_send_output(next_first_rank_mb_id)
        return received

    def _pp_send_output(self, next_first_rank_mb_id: int) -> list:
        if self.comm.is_last_rank:
            if self.mbs[next_first_rank_mb_id] is None:
                return []
            return self.comm.send_dict_to_next(self.last_rank_comm_queue.popleft(), "output")
        if self.pp_outputs:
            return self.comm.send_dict_to_next(self.pp_outputs, "output")
        return []

    def _record_step(self, mb_id: int, batch: ScheduleBatch | None) -> None:
        self.recorder.record(
            step=self.step,
            slot=mb_id,
            batch=batch,
            tree_cache=self.tree_cache,
            allocator=self.allocator,
            hooks=self.hooks,
            comm=self.comm,
            extra={
                "evicted_by_scheduler": self.evicted_tokens,
                "num_waiting": len(self.waiting_queue),
                "num_running": self.num_active,
            },
        )
        self.evicted_tokens = 0
