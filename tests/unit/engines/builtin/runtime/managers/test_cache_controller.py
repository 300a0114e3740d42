"""HiCacheController, DMA thread and LayerDoneCounter with real pools and a real copy thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hicache_diag.engines.builtin.runtime.managers.cache_controller import (
    HiCacheController,
    LayerDoneCounter,
)
from hicache_diag.engines.builtin.runtime.managers.dma_engine import DmaEvent
from hicache_diag.engines.builtin.runtime.mem_cache.allocator import TokenToKVPoolAllocator
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool import MHATokenToKVPool
from hicache_diag.engines.builtin.runtime.mem_cache.memory_pool_host import HostKVCache
from hicache_diag.faults.hooks import Hooks


@pytest.fixture
def ctrl():
    made = []

    def factory(hooks=None, host_tokens=8):
        alloc = TokenToKVPoolAllocator(16, 2)
        pool = MHATokenToKVPool(16, range(3), head_num=1, head_dim=2)
        host = HostKVCache(host_tokens, 2, 3, 1, 2, hooks=hooks)
        c = HiCacheController(alloc, pool, host, hooks)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.shutdown()
        assert not c.dma._thread.is_alive(), "DMA thread left running"


def test_write_copies_every_layer_and_acks_in_order(ctrl):
    c = ctrl()
    dev = c.mem_pool_device_allocator.alloc(4)
    for i, k in enumerate(c.mem_pool_device.k_buffer):
        k[dev] = float(i + 1)
    h1 = c.write(dev[:2], node_id=5)
    h2 = c.write(dev[2:], node_id=6)
    assert [a.node_ids for a in c.ack_write_queue] == [[5], [6]]
    c.ack_write_queue[-1].finish_event.synchronize()
    assert c.ack_write_queue[0].finish_event.query(), "FIFO: the earlier op is done too"
    for i in range(3):
        assert torch.all(c.mem_pool_host.k_buffer[i][torch.cat([h1, h2])] == i + 1)
    assert [e["phase"] for e in c.events] == ["issued", "queued"] * 2


def test_write_returns_none_when_host_short(ctrl):
    c = ctrl(host_tokens=2)
    dev = c.mem_pool_device_allocator.alloc(4)
    assert c.write(dev, node_id=1) is None
    assert c.write_queue == [] and c.ack_write_queue == []


def test_load_waits_for_start_loading_and_layers_gate_the_forward(ctrl):
    hooks = Hooks()
    hooks.register("dma_complete", lambda v, ctx: 0.2 if ctx["direction"] == "load" else 0.0)
    c = ctrl(hooks=hooks)
    host = c.mem_pool_host.alloc(2)
    c.mem_pool_host.k_buffer[:, host] = 9.0
    dev = c.load(host, node_id=3)
    assert c.load_queue and c.ack_load_queue == [], "nothing starts before start_loading"
    producer = c.start_loading()
    c.layer_done_counter.set_consumer(producer)
    t0 = time.monotonic()
    k, _ = c.mem_pool_device.get_kv_buffer(2)  # the last layer completes after the delay
    assert time.monotonic() - t0 >= 0.15
    assert torch.all(k[dev] == 9.0)
    assert c.ack_load_queue[0].finish_event.query()


def test_layer_done_counter_rotates_three_slots():
    counter = LayerDoneCounter(2)
    ids = [counter.update_producer() for _ in range(3)]
    assert ids == [0, 1, 2]
    for ev in counter.events[0].load_events:
        ev.complete()
    assert counter.update_producer() == 0, "slot 0 is reused once its load finished"
    done = []
    counter.set_consumer(1)
    t = threading.Thread(target=lambda: (counter.wait_until(0), done.append(1)))
    t.start()
    time.sleep(0.05)
    assert not done, "the forward waits for layer 0 of producer 1"
    counter.events[1].load_events[0].complete()
    t.join(2)
    assert done == [1]


def test_dma_error_surfaces_at_synchronize(ctrl):
    c = ctrl()
    bad = torch.tensor([1000, 1001])
    c.write(bad, node_id=1, host_indices=torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="DMA op failed"):
        c.ack_write_queue[0].finish_event.synchronize()


def test_event_semantics():
    ev = DmaEvent()
    assert not ev.query()
    ev.complete()
    assert ev.query()
    ev.synchronize()


def test_dma_hook_gets_the_submitting_step_not_the_copy_threads_now(ctrl):
    """Issue 14: a DMA op carries the step that submitted it, so a fault's window and draws
    do not depend on when the copy thread gets to the op."""
    hooks = Hooks()
    gate, seen = threading.Event(), []

    def on_dma(value, ctx):
        if not seen:
            gate.wait(5)  # hold the copy thread until the scheduler has moved on
        seen.append((ctx["direction"], ctx["step"]))
        return value

    hooks.register("dma_complete", on_dma)
    c = ctrl(hooks=hooks)
    dev = c.mem_pool_device_allocator.alloc(4)
    hooks.step = 3
    c.write(dev[:2], node_id=1)
    hooks.step = 4
    c.write(dev[2:], node_id=2)
    hooks.step = 9  # the scheduler is far ahead when the copies run
    gate.set()
    c.ack_write_queue[-1].finish_event.synchronize()
    assert seen == [("write", 3), ("write", 4)]
