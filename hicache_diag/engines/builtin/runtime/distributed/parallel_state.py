"""Mirrors sglang/srt/distributed/parallel_state.py: groups, PP p2p transport, HiCache comm.

Every rank creates the same groups in the same order (torch.distributed requires it): the world,
per PP stage one TP `GroupCoordinator` (its device group, then its cpu group), one PP group per
TP column, then the dedicated `THREAD_GROUPS`. Global rank = pp_rank * tp_size + tp_rank, as
SGLang numbers them.

Why two TP communicators: SGLang runs the model's row-parallel all-reduce on the TP device group
(NCCL) and HiCache's `_all_reduce_attn_groups` on the TP cpu group (gloo). When one TP rank skips
the HiCache collective (#28429), its peer waits on the cpu group while it waits on the device
group: neither call can pair with the other, so the ranks hang (form C) instead of pairing two
unrelated all-reduces on one communicator.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hicache_diag.engines.builtin.runtime.distributed.comm import THREAD_GROUPS
from hicache_diag.faults import link_delay
from hicache_diag.faults.hooks import Hooks

Group = dist.ProcessGroup | None  # None: the default (world) group

# sglang/srt/distributed/communication_tags.py: P2PTag.HIRADIX_PP_SYNC
HIRADIX_PP_SYNC = int.from_bytes(b"PpHi", "big")
# Our own tags for the PP channels, so requests, proxies and outputs never cross-match (SGLang
# demultiplexes by `__msg_type__` instead; distinct tags give the same isolation).
MSG_TAGS = {"reqs": 11, "proxy": 12, "output": 13}

_REDUCE_OPS = {"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}
# The device group's backend per `--device` (SGLang: NCCL on CUDA); the cpu group is always gloo.
DEVICE_BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


@dataclass(slots=True)
class P2PWork:
    """An isend handle plus the tensors it reads, kept alive until `wait()`."""

    work: Any
    payload: list[torch.Tensor] = field(default_factory=list)

    def wait(self) -> None:
        self.work.wait()


def init_distributed(
    rank: int, world_size: int, store: dist.Store | None = None, timeout_s: float = 600.0
) -> None:
    """Join the gloo world: from a TCPStore client when the launcher gave one, else env://
    (torchrun sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE)."""
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group("gloo", rank=rank, world_size=world_size, **kwargs)


def _send_bytes(data: Any, dst: int, group: Group, tag: int, works: list[P2PWork]) -> None:
    buf = torch.frombuffer(bytearray(pickle.dumps(data)), dtype=torch.uint8)
    size = torch.tensor([buf.numel()], dtype=torch.long)
    for t in (size, buf):
        works.append(P2PWork(dist.isend(t, dst=dst, group=group, tag=tag), [t]))


def _recv_bytes(src: int, group: Group, tag: int) -> Any:
    size = torch.empty(1, dtype=torch.long)
    dist.recv(size, src=src, group=group, tag=tag)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(buf, src=src, group=group, tag=tag)
    return pickle.loads(buf.numpy().tobytes())


def point_to_point_pyobj(
    data: Any, rank: int, group: Group, src: int, dst: int, *, async_send: bool = True, tag: int = 0
) -> Any:
    """Mirrors utils/common.py: a size tensor then a byte tensor. The sender (rank == src) returns
    its work handles; the receiver (rank == dst) returns the object."""
    if rank == src:
        works: list[P2PWork] = []
        _send_bytes(data, dst, group, tag, works)
        if not async_send:
            for w in works:
                w.wait()
            return []
        return works
    return _recv_bytes(src, group, tag)


def send_tensor_dict(
    tensor_dict: dict[str, torch.Tensor], dst: int, group: Group = None, tag: int = 0
) -> list[P2PWork]:
    """Metadata object first, then each tensor. The receiver allocates what the metadata says,
    so it takes whatever size the sender sent (this is how a token-count mismatch reaches the
    downstream model and becomes form A)."""
    works: list[P2PWork] = []
    meta = [(k, tuple(v.shape), v.dtype) for k, v in tensor_dict.items()]
    _send_bytes(meta, dst, group, tag, works)
    for _, v in tensor_dict.items():
        t = v.detach().contiguous()
        works.append(P2PWork(dist.isend(t, dst=dst, group=group, tag=tag), [t]))
    return works


def recv_tensor_dict(src: int, group: Group = None, tag: int = 0) -> dict[str, torch.Tensor]:
    meta = _recv_bytes(src, group, tag)
    out: dict[str, torch.Tensor] = {}
    for key, shape, dtype in meta:
        t = torch.empty(shape, dtype=dtype)
        dist.recv(t, src=src, group=group, tag=tag)
        out[key] = t
    return out


@dataclass(frozen=True, slots=True)
class GroupCoordinator:
    """Mirrors GroupCoordinator at our scale: this rank's place in one group of ranks and the two
    communicators over it. `device_group` carries the model's collectives (gloo on CPU, NCCL on
    CUDA); `cpu_group` (always gloo) carries control collectives such as HiCache's counts."""

    ranks: tuple[int, ...]
    rank_in_group: int
    device_group: Group
    cpu_group: Group

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def init_model_parallel_group(
    group_ranks: list[list[int]], rank: int, backend: str
) -> GroupCoordinator:
    """Create a device and a cpu group for every rank list (every rank creates all of them, in
    the same order, as torch.distributed requires) and keep the pair that holds `rank`."""
    mine: GroupCoordinator | None = None
    for ranks in group_ranks:
        device_group = dist.new_group(ranks, backend=backend)
        cpu_group = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = GroupCoordinator(tuple(ranks), ranks.index(rank), device_group, cpu_group)
    if mine is None:
        raise ValueError(f"rank {rank} is in none of the groups {group_ranks}")
    return mine


class _TimedWait:
    """An async work handle whose `wait()` adds its blocking time to the rank's sync seconds."""

    def __init__(self, work: Any, done: Any) -> None:
        self.work, self.done = work, done

    def wait(self) -> Any:
        t0 = time.perf_counter()
        try:
            return self.work.wait()
        finally:
            self.done(t0)


class ParallelState:
    """This rank's coordinates and groups. Implements the `HiCacheComm` Protocol of
    `distributed/comm.py`; `pp_sync`/`drain_async_work` run on the scheduler thread only, each
    thread group on its own background thread only."""

    def __init__(
        self,
        pp_rank: int,
        pp_size: int,
        tp_rank: int,
        tp_size: int,
        hooks: Hooks,
        device: str = "cpu",
    ):
        self.pp_rank, self.pp_size, self.tp_rank, self.tp_size = pp_rank, pp_size, tp_rank, tp_size
        self.hooks = hooks
        self._link: link_delay.Link | None = None  # installed on the first delayed message
        self.rank = pp_rank * tp_size + tp_rank
        self.work_list: list[P2PWork] = []
        # Seconds spent in each HiCache sync since the recorder last took them (bench/sync.py):
        # scheduler-thread syncs under their own names, each storage thread under its group's.
        self.sync_s: dict[str, float] = {}
        self._build_groups(DEVICE_BACKENDS[device])

    def _timed(self, name: str, t0: float) -> None:
        self.sync_s[name] = self.sync_s.get(name, 0.0) + (time.perf_counter() - t0)

    def take_sync_seconds(self) -> dict[str, float]:
        """Per-sync seconds since the last call (the recorder's per-step `sync_s`)."""
        taken, self.sync_s = self.sync_s, {}
        return taken

    def _build_groups(self, device_backend: str) -> None:
        pp, tp = self.pp_size, self.tp_size
        # Same order on every rank: TP coordinators per stage, PP groups per TP column, threads.
        tp_ranks = [[p * tp + t for t in range(tp)] for p in range(pp)]
        self.tp_group = init_model_parallel_group(tp_ranks, self.rank, device_backend)
        pp_groups = [dist.new_group([p * tp + t for p in range(pp)]) for t in range(tp)]
        self.thread_groups = {name: dist.new_group(list(range(pp * tp))) for name in THREAD_GROUPS}
        self.pp_group = pp_groups[self.tp_rank]
        self.world_group = dist.group.WORLD

    # ---- coordinates -------------------------------------------------------------------------
    @property
    def is_first_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_rank(self, pp_rank: int) -> int:
        """Global rank of `pp_rank` in this rank's TP column."""
        return (pp_rank % self.pp_size) * self.tp_size + self.tp_rank

    # ---- PP transport (scheduler thread) -----------------------------------------------------
    def _message(self, msg: str):
        """The PP message the sends inside belong to: with a p2p-delay fault on this rank, its
        link delivers them late (faults/link_delay.py); the sender does not stall."""
        if self._link is None and self.hooks.has("p2p_send"):
            self._link = link_delay.install(self.hooks, dist)
        return link_delay.message(msg)

    def send_pyobj_to_next(self, data: Any) -> list[P2PWork]:
        dst = self.stage_rank(self.pp_rank + 1)
        with self._message("reqs"):
            return point_to_point_pyobj(data, self.rank, None, self.rank, dst, tag=MSG_TAGS["reqs"])

    def recv_pyobj_from_prev(self) -> Any:
        src = self.stage_rank(self.pp_rank - 1)
        return point_to_point_pyobj(None, self.rank, None, src, self.rank, tag=MSG_TAGS["reqs"])

    def send_dict_to_next(self, tensors: dict[str, torch.Tensor], msg: str) -> list[P2PWork]:
        with self._message(msg):
            return send_tensor_dict(tensors, self.stage_rank(self.pp_rank + 1), tag=MSG_TAGS[msg])

    def recv_dict_from_prev(self, msg: str) -> dict[str, torch.Tensor]:
        return recv_tensor_dict(self.stage_rank(self.pp_rank - 1), tag=MSG_TAGS[msg])

    # ---- HiCacheComm -------------------------------------------------------------------------
    def all_reduce_tp(self, tensor: torch.Tensor, op: str = "min") -> None:
        # The TP cpu group, as `_all_reduce_attn_groups`: never the model's device group.
        if self.tp_size > 1:
            t0 = time.perf_counter()
            dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.tp_group.cpu_group)
            self._timed("tp_allreduce", t0)

    def all_reduce_pp(self, tensor: torch.Tensor, op: str = "min") -> None:
        if self.pp_size * self.tp_size > 1:
            t0 = time.perf_counter()
            dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.world_group)
            self._timed("world_allreduce", t0)

    def all_reduce_pp_async(self, tensor: torch.Tensor, op: str = "min") -> Any:
        """`all_reduce_pp` started with async_op: returns the work handle to `wait()` on (None
        when alone, the tensor then already holds the result). Scheduler thread only."""
        if self.pp_size * self.tp_size == 1:
            return None
        t0 = time.perf_counter()
        work = dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.world_group, async_op=True)
        self._timed("vote_allreduce", t0)
        return _TimedWait(work, lambda t: self._timed("vote_allreduce", t))

    def pp_sync(self, tensor: torch.Tensor) -> None:
        # _pp_sync (#27285): a directional relay, not a collective. PP>0 blocks for the value
        # from the previous stage; every non-last stage isends a clone on and keeps the handle.
        if self.pp_size <= 1:
            return
        t0 = time.perf_counter()
        if self.pp_rank > 0:
            dist.recv(tensor, src=self.stage_rank(self.pp_rank - 1), tag=HIRADIX_PP_SYNC)
        if not self.is_last_rank:
            clone = tensor.clone()
            dst = self.stage_rank(self.pp_rank + 1)
            with self._message("sync"):
                work = dist.isend(clone, dst=dst, tag=HIRADIX_PP_SYNC)
            self.work_list.append(P2PWork(work, [clone]))
        self._timed("pp_sync", t0)

    def drain_async_work(self) -> None:
        # _drain_async_work (#28916): backpressure; PP0 blocks here if PP1 has not consumed.
        t0 = time.perf_counter()
        for w in self.work_list:
            w.wait()
        self.work_list.clear()
        self._timed("drain", t0)

    def all_reduce_thread_group(self, name: str, tensor: torch.Tensor, op: str = "min") -> None:
        if self.pp_size * self.tp_size > 1:
            t0 = time.perf_counter()
            dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=self.thread_groups[name])
            self._timed(name, t0)  # each thread writes only its own group's key

    def inflight_sends(self) -> int:
        return len(self.work_list)

    # ---- model TP ----------------------------------------------------------------------------
    def tp_all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The row-parallel sum of the forward (`tensor_model_parallel_all_reduce`): on the TP
        device group, so it never pairs with a HiCache control collective."""
        if self.tp_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.tp_group.device_group)
        return tensor
