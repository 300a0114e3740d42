"""rank{r}.jsonl writer (ours): one evidence.StepRecord per scheduler step, flushed per line.

Keys follow docs/evidence.md; `tree_cache.probe_stats()` is merged over our defaults so the cache
tiers can add or refine fields without touching the scheduler.

`HICACHE_DIAG_RECORD=0` in the environment switches the evidence off (bench/probe_cost.py
measures what it costs): each step then writes only a heartbeat line (`rank`, `pp`, `tp`,
`step`, `slot`, `t`, `recorded: false`), which the hang watch still needs to see progress; the
per-step counters are still drained, so nothing accumulates. Such a run can still crash, hang,
give wrong outputs or pass, but it can show no divergence.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hicache_diag.evidence import BATCH_KEYS as CRASH_KEYS  # a crash record: the batch only
from hicache_diag.evidence import MUST_AGREE, MUST_AGREE_HOST, MUST_AGREE_L3, StepRecord
from hicache_diag.evidence.recording import SWITCH_ENV, switch_state

# Per-rank inputs a crash record adds beside the batch (not must-agree: see record_crash).
CRASH_INPUTS = (
    "acks_ready",
    "ack_pending_ms",
    "acks_consumed",
    "sync_received",
    "host_alloc_failed",
    "host_pool_refused",
    "host_shortage",
    "host_shortages",
    "host_evicted",
    "host_held",
    "l3_hit_len_local",
    "l3_progress",
    "l3_progress_local",
    "clock_regressions",
    "evict_victims",
)
RECORD_ENV = SWITCH_ENV


def recording_on() -> bool:
    """The switch as every reader reads it (evidence/recording.py: any case, `OFF` is off)."""
    return switch_state(os.environ.get(RECORD_ENV)) is not False


def _defaults() -> dict[str, Any]:
    return {
        "l3_hit_len_local": {},
        "queues": {"write_queue": 0, "load_queue": 0, "ack_write_queue": 0, "ack_load_queue": 0},
        "acks_ready": {"write": 0, "load": 0},
        "acks_consumed": {"write": 0, "load": 0},
        "sync_received": {},
        "host_alloc_failed": 0,
        "host_free": 0,
        "host_capacity": 0,
        "evicted": 0,
        "evict_victims": [],
        "load_backs": 0,
        "write_backs": 0,
        "clock": 0.0,
        "events": [],
    }


def batch_fields(batch: Any) -> dict[str, Any]:
    if not batch:
        return {
            "rids": [],
            "forward_mode": None,
            "extend_num_tokens": 0,
            "prefix_len": {},
            "host_hit_len": {},
            "host_loaded_len": {},
            "l3_hit_len": {},
        }
    extend = batch.forward_mode.is_extend()
    return {
        "rids": batch.rids,
        "forward_mode": batch.forward_mode.value,
        "extend_num_tokens": sum(batch.extend_lens()),
        "prefix_len": dict(zip(batch.rids, batch.prefix_lens, strict=True)) if extend else {},
        "host_hit_len": {r.rid: r.host_hit_length for r in batch.reqs} if extend else {},
        "host_loaded_len": {r.rid: r.host_loaded_length for r in batch.reqs} if extend else {},
        "l3_hit_len": {r.rid: r.l3_hit_length for r in batch.reqs} if extend else {},
    }


class RankRecorder:
    """Appends to `path`; every line is flushed so a crashed or killed rank leaves its history."""

    def __init__(
        self,
        path: Path,
        rank: int,
        pp: int,
        tp: int,
        *,
        protocol: Any = None,
        storage: bool = False,
    ) -> None:
        self.rank, self.pp, self.tp = rank, pp, tp
        self.full = recording_on()
        self._record_s = 0.0
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the rank
        self.must_agree = list(MUST_AGREE)
        if protocol is not None and protocol.mode("host-capacity") == "min":
            self.must_agree += MUST_AGREE_HOST
        if storage:
            self.must_agree += MUST_AGREE_L3

    def record(
        self,
        *,
        step: int,
        slot: int,
        batch: Any,
        tree_cache: Any,
        allocator: Any,
        hooks: Any,
        comm: Any,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if not self.full:
            return self._heartbeat(step, slot, tree_cache, hooks, comm)
        started = time.perf_counter()
        rec: dict[str, Any] = {**self._head(step, slot, batch), **_defaults()}
        stats = tree_cache.probe_stats() or {}
        extra = dict(extra or {})
        scheduler_evicted = extra.pop("evicted_by_scheduler", 0)
        rec.update(extra)
        rec.update(stats)
        if "evicted" not in stats:
            rec["evicted"] = scheduler_evicted
        rec["device_free"] = allocator.available_size()
        rec["inflight_sends"] = comm.inflight_sends()
        take = getattr(comm, "take_sync_seconds", None)  # fakes in unit tests have none
        if take is not None:
            rec["sync_s"] = {k: round(v, 6) for k, v in take().items()}
        rec["tree_digest"] = tree_cache.tree_digest()
        rec["faults_fired"] = hooks.drain_fired()
        rec["must_agree"] = self.must_agree
        rec["t"] = time.time()
        rec["record_s"] = self._record_s  # what recording the previous line cost (probe cost)
        self._write(rec)
        self._record_s = round(time.perf_counter() - started, 6)
        return rec

    def _heartbeat(self, step: int, slot: int, tree_cache: Any, hooks: Any, comm: Any) -> dict:
        """Recording off: drain what the full record would, write only who, which step, when."""
        tree_cache.probe_stats()
        hooks.drain_fired()
        take = getattr(comm, "take_sync_seconds", None)
        if take is not None:
            take()
        rec = {
            "rank": self.rank,
            "pp": self.pp,
            "tp": self.tp,
            "step": step,
            "slot": slot,
            "t": time.time(),
            "recorded": False,
        }
        self._write(rec)
        return rec

    def _head(self, step: int, slot: int, batch: Any) -> dict[str, Any]:
        """Who wrote the line, which step and slot, and the batch this rank decided."""
        return {
            "rank": self.rank,
            "pp": self.pp,
            "tp": self.tp,
            "step": step,
            "slot": slot,
            **batch_fields(batch),
        }

    def record_crash(
        self,
        *,
        step: int,
        slot: int,
        batch: Any,
        proxy: dict | None,
        error: BaseException,
        tree_cache: Any = None,
    ) -> dict[str, Any]:
        """The step that raised never reaches `record`: write the batch this rank decided and
        the token count it received from upstream (`proxy_tokens`), flagged `crashed`, so a
        token-count divergence shows in the data whichever op noticed it (form A)."""
        hidden = (proxy or {}).get("hidden_states")
        rec: dict[str, Any] = {
            **self._head(step, slot, batch),
            "crashed": True,
            "proxy_tokens": int(hidden.shape[0]) if hidden is not None else None,
            "error": f"{type(error).__name__}: {error}".splitlines()[0][:300],
            # only the batch decision exists for this step; the tree is mid-mutation
            "must_agree": [k for k in CRASH_KEYS if k in self.must_agree],
            "t": time.time(),
        }
        rec.update(self._crash_inputs(tree_cache))
        self._write(rec)
        return rec

    def _crash_inputs(self, tree_cache: Any) -> dict[str, Any]:
        """The per-rank inputs this step's ① already took (acks, L3 progress, allocs): the
        attribution's evidence when the divergence shows only at the crashing step. Never in
        `must_agree` (the tree is mid-mutation); the rank is dying, so draining them is free."""
        if tree_cache is None or not self.full:
            return {}
        try:
            stats = tree_cache.probe_stats() or {}
        except Exception:  # noqa: BLE001 - evidence for a dying rank must never mask its error
            return {}
        return {k: stats[k] for k in CRASH_INPUTS if k in stats}

    def _write(self, rec: dict[str, Any]) -> None:
        """The one step-line writer (evidence.StepRecord), shared with the SGLang plugin."""
        self._fh.write(StepRecord.from_json(rec).line() + "\n")

    def close(self) -> None:
        self._fh.close()
