"""rank{r}.jsonl's record (docs/evidence.md): one line per scheduler step, written by both
engines' recorders (probes/recorder.py for our runtime, engines/sglang/plugin/recorder.py inside
SGLang) through `StepRecord.line` and read by every reader through `read_steps`.

Every key is optional: a heartbeat, a crash record, a recorder error and a real SGLang step
each hold a different subset, and a key a release cannot read is left out rather than guessed.
So a field is None where its key is absent (`absent` says which, as for every record) and the
line is written back with exactly the keys it had. Keys no engine documents are kept in `extra`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache_diag.evidence import files
from hicache_diag.evidence.record import Record

Counts = dict[str, int]


@dataclass(frozen=True, slots=True)
class StepRecord(Record):
    # who, which step, when
    rank: int | None = None
    pp: int | None = None
    tp: int | None = None
    step: int | None = None
    slot: int | None = None
    t: float | None = None
    # the batch this rank decided
    rids: list[str] | None = None
    forward_mode: str | None = None
    extend_num_tokens: int | None = None
    prefix_len: Counts | None = None
    host_hit_len: Counts | None = None
    host_loaded_len: Counts | None = None
    l3_hit_len: Counts | None = None
    l3_hit_len_local: Counts | None = None
    l3_progress: Counts | None = None
    l3_progress_local: Counts | None = None
    # HiCache queues, acks and syncs
    storage_counts: Counts | None = None
    storage_faults: list[dict[str, Any]] | None = None
    l3_inserted: int | None = None
    prefetch_tokens_occupied: int | None = None
    ongoing_prefetch: int | None = None
    queues: Counts | None = None
    acks_ready: Counts | None = None
    ack_pending_ms: dict[str, float] | None = None
    acks_consumed: Counts | None = None
    acks_counted: Counts | None = None
    sync_received: dict[str, Any] | None = None
    # pools and the tree
    host_alloc_failed: int | None = None
    host_pool_refused: int | None = None
    host_free: int | None = None
    device_free: int | None = None
    host_capacity: int | None = None
    host_held: int | None = None
    host_evicted: int | None = None
    host_evict_calls: int | None = None
    host_shortage: int | None = None
    host_shortages: list[dict[str, int]] | None = None
    device_held: int | None = None
    load_back_declined: int | None = None
    evicted: int | None = None
    evict_victims: list[str] | None = None
    load_backs: int | None = None
    write_backs: int | None = None
    write_acked_nodes: list[Any] | None = None
    inflight_sends: int | None = None
    tp_allreduce_skipped: int | None = None
    num_waiting: int | None = None
    num_running: int | None = None
    clock: float | None = None
    clock_regressions: int | None = None
    tree_digest: str | None = None
    # waits and costs
    dma_wait_ms: float | None = None
    ack_wait_ms: float | None = None
    sync_s: dict[str, float] | None = None
    record_s: float | None = None
    # what happened, and what must agree
    events: list[dict[str, Any]] | None = None
    faults_fired: list[dict[str, Any]] | None = None
    must_agree: list[str] | None = None
    # a crash record, a heartbeat, an idle fold, a recorder that failed
    crashed: bool | None = None
    proxy_tokens: int | None = None
    error: str | None = None
    recorded: bool | None = None
    idle: bool | None = None
    idle_polls: int | None = None
    recorder_error: str | None = None
    recorder_errors: int | None = None
    # the sglang engine's source probes (docs/sources.md, "Dynamic")
    sources: dict[str, dict[str, Any]] | None = None
    sources_armed: list[str] | None = None
    probe_errors: int | None = None
    sessions_closed: int | None = None
    waiting_timeouts: int | None = None

    def line(self) -> str:
        """The line as both recorders write it (keys sorted; a value JSON cannot hold, a
        tensor's dtype say, as its str)."""
        return json.dumps(self.to_json(), sort_keys=True, default=str)

    @classmethod
    def parse(cls, text: str) -> StepRecord | None:
        """One line read back; None for a line that is not a JSON object (a torn last line)."""
        try:  # also a line nested past any writer's (files.MAX_JSON_DEPTH), or a key of the
            data = files.loads(text)  # wrong type
            return cls.from_json(data) if isinstance(data, dict) else None
        except ValueError:
            return None


def read_steps(path: Path) -> Iterator[tuple[int, StepRecord | None]]:
    """(line number from 0, record or None when torn) for each non-blank line of a step file
    (a regular file, at most files.MAX_STEPS_BYTES: else files.Unreadable, a ValueError)."""
    text = files.read_bytes(path, files.MAX_STEPS_BYTES).decode("utf-8", errors="replace")
    for i, line in enumerate(ln for ln in text.splitlines() if ln.strip()):
        yield i, StepRecord.parse(line)
