"""The classifier's rules, as data: which reads are per-rank, which calls align ranks, which
functions are scheduling decisions, and which files are scanned. docs/sources.md explains each.

Every rule matches source text (names), never runtime values, so it is a heuristic: a read that
no rule names is missed, and a decision no rule names is reported as "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

# --- reads of per-rank physical quantities (kind -> what it is) -----------------------------
READ_KINDS = {
    "clock": "a wall/monotonic clock read (time.time, time.monotonic, time.perf_counter)",
    "event-ready": "readiness of an event or future (.query(), .done(), .is_set())",
    "queue-size": "depth of a queue filled by another thread or stream (.qsize(), len(*queue*))",
    "pool-size": "free slots of a memory pool (.available_size() and its variants)",
    "alloc-result": "what an allocator returned (.alloc(...), None when short)",
    "storage-exists": "what an L3 backend says it holds (batch_exists, exists)",
    "storage-read": "what an L3 backend read back (get / batch_get on a storage backend)",
    "thread-value": "an item taken from a queue without blocking (get_nowait, get(block=False))",
    "lru-stamp": "a last_access_time stamp (physical when a clock, logical when a counter)",
    "random": "a draw from a random generator (random.shuffle, random.random, np.random.*)",
}
# Per-rank state that is logical, not physical: a scheduler list's length (`len(waiting_queue)`,
# the idle checks). Equal on every rank while every input is; listed apart, never a source.
LOGICAL_KINDS = {
    "logical-state": "the length of a list the scheduler thread itself fills (len(*queue*))",
}

CLOCK_FUNCS = frozenset(
    {
        "time",
        "monotonic",
        "perf_counter",
        "time_ns",
        "monotonic_ns",
        "perf_counter_ns",
    }
)
READY_METHODS = frozenset({"query", "done", "is_set"})
POOL_SIZE_METHODS = frozenset(
    {
        "available_size",
        "full_available_size",
        "swa_available_size",
        "schedulable_available_size",
    }
)
ALLOC_METHODS = frozenset({"alloc"})
STORAGE_EXISTS_METHODS = frozenset({"batch_exists", "batch_exists_v2", "exists"})
STORAGE_READ_METHODS = frozenset({"batch_get", "batch_get_v1", "batch_get_v2", "get"})
# `exists` and `get` are too common to match alone: the receiver's own name must end like a
# backend (`self.storage_backend`, `self.storage`), not merely mention one (`_storage_wait`).
STORAGE_RECEIVER_SUFFIXES = ("backend", "storage")
STORAGE_FUNCS = frozenset({"page_get_func"})  # a bound read function kept in an attribute
# Inside a backend's own existence check (`HiCacheFile.exists`), what it consults: the file
# system and its own cache of positive lookups (a TTL'd metadata cache), both per rank.
EXISTS_CHECKS = frozenset({"exists", "contains", "isfile"})
EXISTS_FUNCS = ("exist",)  # a function whose name has this is an existence check
# Random draws: `random.shuffle(q)` (in place: the shuffled argument is the value),
# `random.random()`, `np.random.rand(...)`.
RANDOM_RECEIVERS = frozenset({"random", "np.random", "numpy.random"})
RANDOM_IN_PLACE = frozenset({"shuffle"})
# Sort keys: a stored clock that a sort key reads orders what the sort decides.
SORT_CALLS = frozenset({"sort", "sorted", "min", "max", "nsmallest", "nlargest"})
# The attribute LRU priorities are read from (evict_policy.py's get_priority).
LRU_STAMP_ATTRS = frozenset({"last_access_time"})

# --- the four classic sources (docs/sources.md): which reads they are -----------------------
# Matched on (kind, a substring of the read's text or its function); first match wins.
CLASSIC = (
    ("dma-ack-count", "event-ready", "finish_event"),
    ("dma-ack-count", "event-ready", "ready_acks"),
    ("l3-hit", "storage-exists", ""),
    ("l3-progress", "storage-read", ""),
    ("l3-progress", "queue-size", "prefetch"),
    ("host-alloc", "alloc-result", "host"),
    ("host-alloc", "pool-size", "host"),
    ("lru-clock", "lru-stamp", ""),
)

# --- calls that make ranks agree (callee name -> kind, groups when fixed, default op) --------
# SGLang's wrappers (_all_reduce, _pp_sync, _all_reduce_attn_groups) are not listed: they are
# in the scanned tree and summarised from their bodies, so a release that changes them shows it.
PRIMITIVES: dict[str, tuple[str, tuple[str, ...] | None, str | None]] = {
    "all_reduce": ("all_reduce", None, None),
    "recv": ("pp_relay", None, None),
    "irecv": ("pp_relay", None, None),
    "send": ("pp_relay", None, None),
    "isend": ("pp_relay", None, None),
    "broadcast": ("broadcast", None, None),
    "broadcast_object_list": ("broadcast", None, None),
    "broadcast_pyobj": ("broadcast", None, None),
    "all_gather": ("gather", None, None),
    "all_gather_into_tensor": ("gather", None, None),
    "all_gather_object": ("gather", None, None),
    "all_gather_single": ("gather", None, None),  # sglang.srt.distributed.utils
    # the builtin runtime's HiCacheComm (hicache_diag/engines/builtin/runtime/distributed/comm.py)
    "all_reduce_tp": ("all_reduce", ("tp",), "MIN"),
    "all_reduce_pp": ("all_reduce", ("pp", "tp"), "MIN"),
    "all_reduce_thread_group": ("all_reduce", ("pp", "tp"), "MIN"),
    "pp_sync": ("pp_relay", ("pp",), None),
}
REDUCE_OPS = frozenset({"MIN", "MAX", "SUM", "AVG", "PRODUCT"})
# A p2p call counts as a PP relay only when its group (or receiver) names the PP group.
PP_GROUP_HINT = "pp"

# --- scheduling decisions (function -> category) ---------------------------------------------
# Keys: "Class.method", "Class.*" or a bare function/method name. A use in a function not listed
# takes the category of its nearest listed caller (call graph, by name); none -> "unknown".
DECISIONS: dict[str, str] = {
    "SchedulerFlushWrapper.*": "flush",
    "flush_cache": "flush",
    "flush_cache_wrapped": "flush",  # 0.5.1x: the deferred flush lived in the Scheduler
    "_check_pending_flush": "flush",
    "maybe_reap": "session-release",
    "is_timed_out": "session-release",
    "release_session": "session-release",
    "release_radix_session": "session-release",
    "writing_check": "ack-release",
    "loading_check": "ack-release",
    "_finish_write_through_ack": "ack-release",
    "is_load_back_event_done": "ack-release",
    "drain_storage_control_queues": "storage-queue-drain",
    "_drain_storage_control_queues_impl": "storage-queue-drain",
    "evict": "eviction",
    "evict_host": "eviction",
    "evict_for_alloc": "eviction",
    "get_priority": "eviction",
    "init_load_back": "load-back",
    "load_back": "load-back",
    "write_backup": "write-back",
    "_execute_kv_backup": "write-back",
    "_execute_and_commit_kv_backup": "write-back",
    "write_backup_storage": "storage-backup",
    "prefetch_from_storage": "prefetch-admission",
    "_drain_and_alloc_storage_hit": "prefetch-alloc",
    "_try_alloc_storage_hit": "prefetch-alloc",
    "allocate_storage_hit": "prefetch-alloc",
    "alloc_prefetch_host_buffers": "prefetch-alloc",
    "check_prefetch_progress": "prefetch-termination",
    "can_terminate_prefetch": "prefetch-termination",
    "_can_terminate_prefetch": "prefetch-termination",
    "terminate_prefetch": "prefetch-termination",
    "add_one_req": "batch-admission",
    "add_chunked_req": "batch-admission",
    "_get_new_batch_prefill_raw": "batch-admission",
    "get_new_batch_prefill": "batch-admission",
    "get_next_batch_to_run": "batch-admission",
    "retract_decode": "retraction",
    "_abort_on_waiting_timeout": "request-abort",
    "_abort_on_running_timeout": "request-abort",
    "_poll_timeout_aborts": "request-abort",
}
CALLER_DEPTH = 6  # how far up the call graph a use looks for its decision

# --- walk budgets (keep a release's scan to seconds; docs/sources.md) -------------------------
MAX_DEPTH = 6  # hops from the read (calls, returns, attributes, queues)
MAX_READERS = 8  # an attribute read in more functions than this is too common to follow
MAX_WALKS = 40  # function bodies one read's walk may visit
MAX_DOWN = 2  # callee levels a value is followed into (callers are walked before deep callees)
MAX_HOPS = 2  # attribute/queue crossings per path (thread -> queue -> thread -> scheduler)

# Branches whose every statement only logs or updates metrics decide nothing.
BOOKKEEPING_CALL_HINTS = ("log", "metric", "warn", "debug", "info", "print", "stat", "observe")
BOOKKEEPING_ATTR_HINTS = ("log", "metric", "stat", "_time", "timestamp")

# Method names too generic to follow by name alone (dict/list/queue methods share them).
GENERIC_NAMES = frozenset(
    {
        "get",
        "put",
        "pop",
        "append",
        "clear",
        "items",
        "keys",
        "values",
        "update",
        "reset",
        "__init__",
        "copy",
        "extend",
        "add",
        "remove",
        "discard",
        "wait",
        "start",
        "run",
        "item",
        "tolist",
        "numel",
        "sum",
        "min",
        "max",
        "set",
        "free",
        "close",
        "format",
        "join",
    }
)


# --- which files are scanned (relative to the package dir) -----------------------------------
@dataclass(frozen=True, slots=True)
class Scope:
    """A tree's scanned files: `patterns`, named from `base` where the tree has that folder
    (SGLang's srt/), widened by one level of imports when `widen`."""

    patterns: tuple[str, ...]
    base: str = ""
    widen: bool = False


_SGLANG_FILES = (
    "srt/managers/scheduler.py",
    "srt/managers/scheduler_pp_mixin.py",
    "srt/managers/scheduler_components/*.py",
    "srt/managers/schedule_policy.py",
    "srt/managers/schedule_batch.py",
    "srt/managers/cache_controller*.py",
    "srt/managers/prefill_delayer.py",
    "srt/mem_cache/*.py",
    "srt/mem_cache/hybrid_cache/*.py",
    "srt/mem_cache/unified_cache/**/*.py",
    "srt/mem_cache/unified_cache_components/*.py",
    "srt/mem_cache/pool_host/*.py",
    "srt/mem_cache/allocator/*.py",
    "srt/session/*.py",
)
# Widened by one level of imports: every sglang.srt module that a file defining a decision
# function imports from (observability/req_time_stats.py's stamps, the storage backends).
SGLANG_SCOPE = Scope(_SGLANG_FILES, base="srt", widen=True)
BUILTIN_SCOPE = Scope(("managers/*.py", "mem_cache/*.py", "distributed/*.py"))
