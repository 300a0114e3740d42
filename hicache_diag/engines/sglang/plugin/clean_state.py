"""The trial boundary of a warm server, inside each scheduler rank (docs/evidence.md).

The harness writes `request.json` ({seq, run_dir}) into the control dir the plugin config
names; each rank notices it in its step wrapper (one stat at most every POLL_S), reads the
facts off SGLang's own objects, writes clean_state/rank{r}.json into `run_dir`, re-seeds the
RNG as the scheduler's start-up did, and moves its step recorder to `run_dir`. A fact this
release does not expose reads "unknown", which the harness never takes for clean.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.plugin.l3_state import count, storage_facts
from hicache_diag.engines.sglang.plugin.step_fields import STORAGE_QUEUES

POLL_S = 0.05
REQUEST = "request.json"
UNKNOWN = ev.UNKNOWN
# The tree's in-flight work by SGLang's own names (HiRadixCache and UnifiedRadixCache alike).
_ONGOING = ("ongoing_write_through", "ongoing_load_back", "ongoing_prefetch", "ongoing_backup")
_CC_QUEUES = ("write_queue", "load_queue", "ack_write_queue", "ack_load_queue")


def _call(obj: Any, name: str) -> Any:
    fn = getattr(obj, name, None)
    if not callable(fn):
        return UNKNOWN
    value = fn()
    if isinstance(value, tuple | list):  # total_size() is (full, swa) in 0.5.2x
        return [int(v) for v in value]
    return int(value)


def tree_nodes(tree: Any) -> Any:
    """Nodes under the root (0: an empty tree): RadixCache/HiRadixCache keep `root_node` on the
    tree, UnifiedRadixCache (0.5.2x) on its `tree_core`; None where the core keeps no Python
    nodes (0.5.23's Rust tree core raises on `root_node`)."""
    core = getattr(tree, "tree_core", None)
    try:
        root = getattr(tree, "root_node", None)
        if root is None and core is not None:
            root = core.root_node
    except NotImplementedError:
        return None
    if root is None or not hasattr(root, "children"):
        return UNKNOWN
    n, stack = 0, list(root.children.values())
    while stack:
        node = stack.pop()
        n += 1
        stack.extend(node.children.values())
    return n


def _tree_values(tree: Any) -> Any:
    """Device KV slots the tree holds (`all_values_flatten`, every release): 0 with the host
    pool fully free and nothing evictable or protected means no node holds anything."""
    fn = getattr(tree, "all_values_flatten", None)
    if not callable(fn):
        return UNKNOWN
    values = fn()
    return int(values.numel()) if hasattr(values, "numel") else len(values)


def _tree_facts(tree: Any) -> dict[str, Any]:
    nodes = tree_nodes(tree)
    facts = {
        # No node under the root holds no value; and 0.5.18's RadixCache.all_values_flatten
        # raises on an empty tree (torch.cat of an empty list, radix_cache.py:674).
        "tree_values": 0 if nodes == 0 else _tree_values(tree),
        "evictable_size": _call(tree, "evictable_size"),
        "protected_size": _call(tree, "protected_size"),
        "total_size": _call(tree, "total_size"),
    }
    if nodes is not None:  # a Rust core has no Python nodes: its values above say it
        facts["tree_nodes"] = nodes
    # In-flight work a release keeps only in some configs: absent, there is none to be left.
    for name in _ONGOING:
        if hasattr(tree, name):
            facts[name] = count(getattr(tree, name))
    session = getattr(tree, "session", None)  # 0.5.2x: the tree's streaming-session slots
    if hasattr(session, "slots"):
        facts["session_slots"] = count(session.slots)
    return facts


def _controller_facts(cc: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    host = getattr(cc, "mem_pool_host", None)
    facts["host_available"] = _call(host, "available_size")
    facts["host_size"] = int(host.size) if hasattr(host, "size") else UNKNOWN
    for name in _CC_QUEUES:
        facts[name] = count(getattr(cc, name, None))
    for name in STORAGE_QUEUES:  # None until the storage threads start: nothing queued
        if hasattr(cc, name):
            facts[name] = count(getattr(cc, name), none=0)
    return facts


def _sessions(scheduler: Any) -> Any:
    controller = getattr(scheduler, "session_controller", None)  # 0.5.2x
    if controller is not None:
        return count(getattr(controller, "sessions", None))
    return count(getattr(scheduler, "sessions", None))  # earlier releases: on the scheduler


def read_facts(scheduler: Any) -> dict[str, Any]:
    """The compared facts, off the scheduler's own objects."""
    facts: dict[str, Any] = {}
    allocator = getattr(scheduler, "token_to_kv_pool_allocator", None)
    facts["device_available"] = _call(allocator, "available_size")
    facts["device_size"] = int(allocator.size) if hasattr(allocator, "size") else UNKNOWN
    req_pool = getattr(scheduler, "req_to_token_pool", None)
    facts["req_slots_available"] = _call(req_pool, "available_size")
    facts["waiting_queue"] = count(getattr(scheduler, "waiting_queue", None))
    running = getattr(scheduler, "running_batch", None)
    facts["running_reqs"] = count(getattr(running, "reqs", None))
    facts["sessions"] = _sessions(scheduler)
    tree = getattr(scheduler, "tree_cache", None)
    facts.update(_tree_facts(tree) if tree is not None else {"tree_nodes": UNKNOWN})
    cc = getattr(tree, "cache_controller", None)
    facts.update(_controller_facts(cc) if cc is not None else {"host_available": UNKNOWN})
    if getattr(cc, "storage_backend", None) is not None:  # L3: its files, indexes, threads
        facts.update(storage_facts(tree, cc))
    return facts


def _reseed(scheduler: Any) -> dict[str, Any]:
    """The RNG re-seeded as the scheduler's start-up seeded it, and the session reap clock set
    back to a new controller's `_last_reap_time` (0.0): each rank's next reap then falls on its
    own first loop after the boundary, as after a launch. Left alone, every trial on one server
    would share the reap phase its launch drew (measured: session-close parted 1 of 5 warm
    trials, the three on one kept server none), and trials would not be independent draws."""
    info: dict[str, Any] = {}
    seed = getattr(scheduler, "random_seed", None)
    if seed is None:
        seed = getattr(getattr(scheduler, "server_args", None), "random_seed", None)
    try:  # the scheduler imported it at start; a step never imports
        set_random_seed = sys.modules["sglang.srt.utils"].set_random_seed
        set_random_seed(int(seed))
        info["rng_reseeded"] = int(seed)
    except Exception:  # noqa: BLE001 - no seed or no such function in this release
        info["rng_reseeded"] = UNKNOWN
    controller = getattr(scheduler, "session_controller", None)
    last_reap = getattr(controller, "_last_reap_time", None)
    if isinstance(last_reap, int | float):
        info["session_reap_age_s"] = round(time.monotonic() - float(last_reap), 3)
        controller._last_reap_time = 0.0
        info["session_reap_reset"] = True
    return info


def ack_path(control_dir: str, rank: int) -> str:
    """Rank `rank`'s answer to the latest request: {"seq": n}, written last."""
    return os.path.join(control_dir, f"ack-rank{rank}.json")


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)  # the harness reads only a complete file


class Boundary:
    """One rank's watch on the control dir. A request is {seq, proof_dir, steps_dir}: with
    `proof_dir`, the proof goes to proof_dir/clean_state/rank{r}.json; with `steps_dir`, the
    recorder moves there; then the rank acks `seq`."""

    def __init__(self, control_dir: str, rank: int) -> None:
        self.control_dir = control_dir
        self.path = os.path.join(control_dir, REQUEST)
        self.rank = rank
        self.seq = 0
        self._next_poll = 0.0
        self._version: tuple[int, int] | None = None

    def poll(self, scheduler: Any, recorder: Any) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + POLL_S
        try:
            st = os.stat(self.path)
        except OSError:
            return
        version = (st.st_ino, st.st_mtime_ns)  # the harness replaces the file whole
        if version == self._version:
            return
        self._version = version
        try:
            with open(self.path) as fh:
                request = json.load(fh)
        except (OSError, ValueError):
            self._version = None  # written as we read it: read it again next poll
            return
        if int(request.get("seq", 0)) <= self.seq:
            return
        try:
            self.answer(scheduler, recorder, request)
        except Exception as exc:  # noqa: BLE001 - never SGLang's step: the harness restarts
            text = json.dumps({"seq": self.seq, "error": f"{type(exc).__name__}: {exc}"})
            _write_atomic(ack_path(self.control_dir, self.rank), text)

    def answer(self, scheduler: Any, recorder: Any, request: dict[str, Any]) -> None:
        self.seq = int(request["seq"])
        proof_dir, steps_dir = request.get("proof_dir"), request.get("steps_dir")
        if proof_dir:
            try:
                facts = read_facts(scheduler)
            except Exception as exc:  # noqa: BLE001 - a proof that could not be read is none
                facts = {"error": f"{type(exc).__name__}: {exc}"}
            info = _reseed(scheduler)
            step = recorder.step if recorder is not None else 0
            proof = ev.CleanStateProof(self.seq, self.rank, step, time.time(), facts, info)
            path = ev.clean_state_json(proof_dir, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(str(path), ev.json_text(proof))
        if steps_dir and recorder is not None:  # the next trial's steps go to its run dir
            os.makedirs(steps_dir, exist_ok=True)
            recorder.switch(str(ev.rank_jsonl(steps_dir, self.rank)))
        _write_atomic(ack_path(self.control_dir, self.rank), json.dumps({"seq": self.seq}))
