"""Shared helpers for the HiCache tier tests: a recording fake HiCacheComm and a tiny bundle."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hicache_diag.engines.builtin.runtime.mem_cache.kv_cache_builder import build_kv_cache
from hicache_diag.engines.builtin.runtime.protocol import build_protocol
from hicache_diag.engines.builtin.runtime.server_args import ServerArgs
from hicache_diag.faults.hooks import Hooks

PAGE = 2


@dataclass
class FakeComm:
    """Records every call. `relay` scripts what PP>0 receives from pp_sync; `peers` scripts the
    other ranks' contributions to all_reduce_pp."""

    pp_rank: int = 0
    pp_size: int = 2
    tp_rank: int = 0
    tp_size: int = 1
    relay: list[list[int]] = field(default_factory=list)
    peers: list = field(default_factory=list)
    calls: list[tuple] = field(default_factory=list)
    kept: int = 0

    def all_reduce_tp(self, tensor: torch.Tensor, op: str = "min") -> None:
        self.calls.append(("all_reduce_tp", tensor.tolist(), op))

    def all_reduce_pp(self, tensor: torch.Tensor, op: str = "min") -> None:
        self.calls.append(("all_reduce_pp", tensor.tolist(), op))
        if self.peers:  # a scalar, or one value per element
            tensor.copy_(torch.minimum(tensor, torch.tensor(self.peers.pop(0))))

    def pp_sync(self, tensor: torch.Tensor) -> None:
        if self.pp_rank > 0:
            tensor.copy_(torch.tensor(self.relay.pop(0)))
        self.calls.append(("pp_sync", tensor.tolist()))
        if self.pp_rank + 1 < self.pp_size:
            self.kept += 1

    def drain_async_work(self) -> None:
        self.calls.append(("drain_async_work",))
        self.kept = 0

    def all_reduce_thread_group(self, name, tensor, op="min") -> None:
        self.calls.append(("thread_group", name))

    def inflight_sends(self) -> int:
        return self.kept

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def make_bundle(*fixes: str, comm=None, hooks=None, preset="full", **args):
    server = ServerArgs(
        pp_size=1,
        page_size=PAGE,
        max_total_tokens=args.pop("max_total_tokens", 32),
        hicache_ratio=args.pop("hicache_ratio", 1.0),
        **args,
    )
    comm = comm or FakeComm(pp_size=1)
    # host-alloc=local unless asked: two-phase defers every write-through to the next ①
    fixes = ("host-alloc=local", *fixes)
    return build_kv_cache(server, build_protocol(preset, list(fixes)), comm, hooks or Hooks(), 0, 0)


def put(bundle, key: list[int]) -> int:
    value = bundle.allocator.alloc(len(key))
    assert value is not None, f"device pool short for {len(key)} tokens"
    prefix = bundle.tree_cache.insert(key, value)
    bundle.allocator.free(value[:prefix])
    return prefix


def settle(bundle) -> None:
    """Wait until every queued DMA op has finished (the thread is FIFO)."""
    c = bundle.controller
    for ack in c.ack_write_queue + c.ack_load_queue:
        ack.finish_event.synchronize()


def bundle_factory(*default_fixes: str):
    """Body of a `bundles` fixture: yields make_bundle with `default_fixes` prepended, then
    shuts every bundle it made down (their copy threads must not outlive the test)."""
    made = []

    def factory(*fixes, **kw):
        b = make_bundle(*fixes, *default_fixes, **kw)
        made.append(b)
        return b

    yield factory
    for b in made:
        b.shutdown()
