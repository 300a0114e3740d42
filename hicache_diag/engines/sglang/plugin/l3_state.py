"""The L3 (storage) part of a rank's clean-state proof (clean_state.py): everything of SGLang's
L3 path that outlives a trial beyond the storage queues, read (never written) off the cache
controller, its storage backend and the radix tree. Where each lives, by release:
docs/sglang-engine.md "A warm server with the L3 file backend".

Only the `file` backend (HiCacheFile) is read: its files and its in-memory indexes. Any other
backend reads "unknown" (never clean). A name a release lacks on an object it has (a private
index renamed) reads "unknown" too; a whole structure the release does not have (0.5.18 has
no tree-side existence cache, 0.5.19 no PP prefetch tickets) is left out: there is none to be
left over.
"""

from __future__ import annotations

import os
from typing import Any

UNKNOWN = "unknown"  # evidence.UNKNOWN; this module imports nothing of ours
FILE_BACKEND = "HiCacheFile"
# The controller's storage threads by SGLang's names (0.5.18 has no sync thread; its prefetch
# thread starts the aux one); `reset()` joins and restarts them, so a clean server has as many
# alive as a fresh one.
STORAGE_THREADS = ("prefetch_thread", "prefetch_io_aux_thread", "prefetch_sync_thread")
STORAGE_THREADS += ("backup_thread",)


def count(obj: Any, none: Any = UNKNOWN) -> Any:
    """A queue's (`qsize()`), list's or dict's length, "unknown" when it has none; `none` when
    there is no object. The one count of the whole proof (clean_state.py reads with it too)."""
    if obj is None:
        return none
    if hasattr(obj, "qsize"):
        return int(obj.qsize())
    try:
        return len(obj)
    except TypeError:
        return UNKNOWN


def _file_backend(backend: Any) -> dict[str, Any]:
    """HiCacheFile's state: the entries of its dir (the harness empties only a dir it gave
    SGLang), its positive-lookup `metadata_cache` (None unless enabled) and its LRU evictor's
    bookkeeping (empty unless eviction is configured)."""
    facts: dict[str, Any] = {}
    try:
        facts["l3_files"] = len(os.listdir(backend.file_path))
    except (AttributeError, OSError):
        facts["l3_files"] = UNKNOWN
    cache = getattr(backend, "metadata_cache", UNKNOWN)
    facts["l3_metadata_keys"] = 0 if cache is None else _named_size(cache, "cache")
    evictor = getattr(backend, "_evictor", None)
    facts["l3_evictor_keys"] = _named_size(evictor, "_lru")
    facts["l3_evictor_pending"] = _named_size(evictor, "_pending_writes")
    facts["l3_evictor_bytes"] = getattr(evictor, "_total_bytes", UNKNOWN)
    return facts


def _named_size(obj: Any, name: str) -> Any:
    """The size of `obj.name`; "unknown" when the release has no such name (renamed)."""
    if obj is None or obj == UNKNOWN or not hasattr(obj, name):
        return UNKNOWN
    return count(getattr(obj, name), none=0)


def _existence_beliefs(beliefs: Any) -> Any:
    """The tree's `storage_existence_cache` (0.5.19: one LRU with __len__; 0.5.2x later: one
    `PoolExistenceBeliefs` per pool, entries and in-flight refcounts)."""
    pools = getattr(beliefs, "_pools", None)
    if isinstance(pools, dict):
        try:
            return sum(len(p._entries) + len(p._inflight) for p in pools.values())
        except (AttributeError, TypeError):
            return UNKNOWN
    return count(beliefs, none=0)


def storage_facts(tree: Any, cc: Any) -> dict[str, Any]:
    """The L3 facts of a rank whose controller has a storage backend."""
    backend = cc.storage_backend
    name = type(backend).__name__
    if name != FILE_BACKEND:
        return {"storage_backend": UNKNOWN}  # its own state is not read: never proven clean
    facts: dict[str, Any] = {"storage_backend": name, **_file_backend(backend)}
    facts["prefetch_tokens_occupied"] = getattr(cc, "prefetch_tokens_occupied", UNKNOWN)
    facts["storage_threads_alive"] = sum(
        1 for t in STORAGE_THREADS if getattr(getattr(cc, t, None), "is_alive", lambda: 0)()
    )
    # 0.5.2x's PP prefetch tickets and per-pool host releases, where the controller has them.
    for name in ("pp_prefetch_states", "pp_prefetch_decisions", "pp_prefetch_command_queue"):
        if hasattr(cc, name):
            facts[name] = count(getattr(cc, name), none=0)
    extra = getattr(cc, "extra_host_mem_release_queues", None)
    if isinstance(extra, dict):
        facts["extra_host_mem_release_queues"] = sum(count(q, none=0) for q in extra.values())
    if hasattr(tree, "prefetch_loaded_tokens_by_reqid"):
        facts["prefetch_loaded_tokens"] = count(tree.prefetch_loaded_tokens_by_reqid, none=0)
    if hasattr(tree, "storage_existence_cache"):
        facts["l3_existence_beliefs"] = _existence_beliefs(tree.storage_existence_cache)
    return facts


# Facts of this module that are 0 on any clean server (clean_proof.py ZERO).
ZERO_FACTS = (
    "l3_files",
    "l3_metadata_keys",
    "l3_evictor_keys",
    "l3_evictor_pending",
    "l3_evictor_bytes",
    "l3_existence_beliefs",
    "prefetch_tokens_occupied",
    "prefetch_loaded_tokens",
    "pp_prefetch_states",
    "pp_prefetch_decisions",
    "pp_prefetch_command_queue",
    "extra_host_mem_release_queues",
)
