"""What a step line says of SGLang's own state: the batch a rank decided, its pools, HiCache
queues and tree, read the same way at a step's end (recorder.py), in the first-divergence block
(consensus_block.py) and in a dump (dumps.py). Every read is of an attribute SGLang already has;
keys a release lacks are left out."""

from __future__ import annotations

import hashlib
from typing import Any

STORAGE_QUEUES = (  # SGLang's names; the clean-state proof reads them too
    "prefetch_queue",
    "prefetch_buffer",
    "prefetch_hit_queue",
    "prefetch_sync_queue",
    "ack_prefetch_queue",
    "backup_queue",
    "ack_backup_queue",
    "host_mem_release_queue",
)


def _len(obj: Any) -> int | None:
    if obj is None:
        return None
    if hasattr(obj, "qsize"):
        return int(obj.qsize())
    try:
        return len(obj)
    except TypeError:
        return None


def _size(obj: Any) -> int:
    """Length of a list or tensor alike (releases differ); never by truthiness, which a tensor
    of no elements cannot answer."""
    if obj is None:
        return 0
    if hasattr(obj, "numel"):
        return int(obj.numel())
    return len(obj)


def _as_int(value: Any) -> int:
    """An int from an int, a one-element tensor or None (0)."""
    if value is None:
        return 0
    if hasattr(value, "item"):
        return int(value.item())
    return int(value)


def _ready(queue: list) -> int:
    n = 0
    for ack in queue:
        if not ack.finish_event.query():
            break
        n += 1
    return n


def batch_fields(batch: Any) -> dict[str, Any]:
    if batch is None:
        return {"rids": []}
    reqs = list(getattr(batch, "reqs", []) or [])
    out: dict[str, Any] = {"rids": [r.rid for r in reqs]}
    mode = getattr(batch, "forward_mode", None)
    is_extend = bool(mode is not None and hasattr(mode, "is_extend") and mode.is_extend())
    out["forward_mode"] = getattr(mode, "name", str(mode))
    if is_extend:
        out["extend_num_tokens"] = _as_int(getattr(batch, "extend_num_tokens", None))
        out["prefix_len"] = {r.rid: _prefix_len(r) for r in reqs}
        out["host_hit_len"] = {r.rid: _as_int(getattr(r, "host_hit_length", None)) for r in reqs}
        if any(hasattr(r, "host_loaded_length") for r in reqs):  # 0.5.2x: what was loaded back
            out["host_loaded_len"] = {
                r.rid: _as_int(getattr(r, "host_loaded_length", None)) for r in reqs
            }
        if any(hasattr(r, "storage_hit_length") for r in reqs):
            out["l3_hit_len"] = {
                r.rid: _as_int(getattr(r, "storage_hit_length", None)) for r in reqs
            }
    return out


def _prefix_len(req: Any) -> int:
    """Device-hit tokens of a request: `prefix_len` in 0.5.2x, `len(prefix_indices)` before."""
    if hasattr(req, "prefix_len"):
        return _as_int(req.prefix_len)
    return _size(getattr(req, "prefix_indices", None))


def cache_fields(scheduler: Any, follower: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    allocator = getattr(scheduler, "token_to_kv_pool_allocator", None)
    if allocator is not None:
        out["device_free"] = int(allocator.available_size())
    tree = getattr(scheduler, "tree_cache", None)
    cc = getattr(tree, "cache_controller", None)
    if cc is None:
        return out
    host = getattr(cc, "mem_pool_host", None)
    if host is not None:
        out["host_free"] = int(host.available_size())
    queues = {
        name: _len(getattr(cc, name, None))
        for name in ("write_queue", "load_queue", "ack_write_queue", "ack_load_queue")
    }
    for name in STORAGE_QUEUES:
        if getattr(cc, name, None) is not None:
            queues[name] = _len(getattr(cc, name))
    out["queues"] = {k: v for k, v in queues.items() if v is not None}
    # The recorder's own poll, after the drain. Where SGLang relays PP0's count (0.5.2x's
    # `_sync_hicache_ready_counts`) a follower never polls: no poll is presented as its own
    # there (`acks_counted` is what PP0 counted; docs/evidence.md).
    if not (follower and hasattr(tree, "_sync_hicache_ready_counts")):
        out["acks_ready"] = {"write": _ready(cc.ack_write_queue), "load": _ready(cc.ack_load_queue)}
    out["tree_digest"] = _tree_digest(tree)
    return out


def _tree_digest(tree: Any) -> str | None:
    """A digest of the tree's accounting (evictable / protected / total sizes): equal trees give
    equal digests; it is cheap enough to take every step, unlike a walk of every node."""
    parts = []
    for name in ("evictable_size", "protected_size", "total_size"):
        fn = getattr(tree, name, None)
        if callable(fn):
            try:
                parts.append(repr(fn()))
            except Exception:  # noqa: BLE001 - a digest must never break a step
                return None
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12] if parts else None
