"""The first-divergence block: what each rank held when SGLang's rank consensus checker fired.

SGLang's checker (srt/utils/rank_consensus_checker.py, 0.5.19 on) queues each `@rank_consensus`
event of the scheduler thread; a worker thread drains the same number on every rank (a MIN
all-reduce), hashes them and MIN/MAX-all-reduces the hash bytes over every configured group
(TP or attn-CP + attn-TP, then PP: the whole TP x PP grid). So every rank of the grid sees the
same min != max at once, logs `Found rank divergence ...` with `logger.critical` and calls
`os._exit(1)` from that worker thread. Nothing is raised, so nothing can be caught: this module
hangs a logging handler on the checker's own logger, and the handler writes the block in that
thread, between SGLang's CRITICAL line and its `os._exit`, then returns and SGLang exits as it
would. No rank needs telling: each rank's checker sees the mismatch itself.

In a recorded server (`hicache-diag record`: no run directory) the block goes into the rank's
dump instead (dumps.py, reason "mismatch", the block under `detail.block`), its steps taken
from the recorder's lines held in memory.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.evidence.divergence import LAST_STEPS, events_of

CHECKER_LOGGER = "sglang.srt.utils.rank_consensus_checker"  # the module's logger, by __name__
ENV_VAR = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
MARK = "Found rank divergence for"
MAX_EVENTS = 64
MAX_EVENT_CHARS = 2000
MAX_LINE_CHARS = 4000


def checker_enabled(environ: dict[str, str] | None = None) -> bool:
    """SGLang's own reading of the switch (srt/environ.py EnvBool.parse: true/1/yes/y, any case)."""
    value = (environ if environ is not None else os.environ).get(ENV_VAR, "")
    return value.lower() in ("true", "1", "yes", "y")


class BlockHandler(logging.Handler):
    """Writes the rank's block once, on the checker's divergence line."""

    def __init__(
        self, run_dir: str | None, rank: int, pp_rank: int, tp_rank: int, state: Any
    ) -> None:
        super().__init__(level=logging.CRITICAL)
        self.run_dir, self.rank, self.pp_rank, self.tp_rank = run_dir, rank, pp_rank, tp_rank
        self.state = state  # hook_state.STATE: the scheduler and recorder, when set
        self.written: str | None = None  # the block's path, once written

    def emit(self, record: logging.LogRecord) -> None:
        if self.written is not None:
            return
        try:
            message = record.getMessage()
            if MARK not in message:
                return
            block = build_block(self, message)
            if self.run_dir is None:  # a recorded server: the rank's dump carries the block
                from hicache_diag.engines.sglang.plugin import dumps

                dumps.fire("mismatch", {"block": block.to_json()})
                self.written = "dump"
                return
            self.written = str(ev.write_block(self.run_dir, block))
        except Exception as exc:  # noqa: BLE001 - SGLang's exit must follow whatever happens
            self.written = ""
            sys.stderr.write(f"hicache-diag: first-divergence block not written: {exc!r}\n")


def install(run_dir: str | None, rank: int, pp_rank: int, tp_rank: int, state: Any) -> BlockHandler:
    """Hang the handler on the checker's logger (made now if SGLang has not imported it yet:
    logging hands SGLang the same object)."""
    handler = BlockHandler(run_dir, rank, pp_rank, tp_rank, state)
    logging.getLogger(CHECKER_LOGGER).addHandler(handler)
    return handler


def build_block(handler: BlockHandler, message: str) -> ev.DivergenceBlock:
    start = time.perf_counter()
    errors: list[str] = []
    fields = _cache_state(handler.state, errors, follower=handler.pp_rank > 0)
    recorder = getattr(handler.state, "recorder", None)
    if handler.run_dir is not None:
        steps = ev.tail_steps(ev.rank_jsonl(handler.run_dir, handler.rank))
    else:
        tail = list(getattr(recorder, "tail", None) or [])[-LAST_STEPS:]
        steps = [s for s in map(ev.StepRecord.parse, tail) if s is not None]
    n_events, local_hash = _head(message)
    return ev.DivergenceBlock(
        rank=handler.rank,
        pp=handler.pp_rank,
        tp=handler.tp_rank,
        pid=os.getpid(),
        t=time.time(),
        thread=threading.current_thread().name,
        n_events=n_events,
        local_hash=local_hash,
        events=[e[:MAX_EVENT_CHARS] for e in events_of(message)[:MAX_EVENTS]],
        checker_line=message[:MAX_LINE_CHARS],
        step=getattr(recorder, "step", None),
        steps=steps,
        queues=fields.get("queues", {}),
        device_free=fields.get("device_free"),
        host_free=fields.get("host_free"),
        tree_digest=fields.get("tree_digest"),
        stacks=thread_stacks(),
        errors=errors,
        took_ms=round((time.perf_counter() - start) * 1000.0, 3),
    )


def _head(message: str) -> tuple[int | None, str | None]:
    """N and the local hash of `Found rank divergence for N events(s)! local hash: H, ...`."""
    import re

    m = re.search(r"for (\d+) events?\(s\)! local hash: ([0-9a-f]+)", message)
    return (int(m.group(1)), m.group(2)) if m else (None, None)


def _cache_state(state: Any, errors: list[str], follower: bool) -> dict[str, Any]:
    """Queue lengths, pool free counts and the tree digest, read as the recorder reads them
    at a step's end; from this thread, while the scheduler thread may still be running."""
    scheduler = getattr(state, "scheduler", None)
    if scheduler is None:
        errors.append("no scheduler seen yet: queues and pools not read")
        return {}
    from hicache_diag.engines.sglang.plugin.step_fields import cache_fields

    try:
        return cache_fields(scheduler, follower=follower)
    except Exception as exc:  # noqa: BLE001 - a queue mutated under us: say so, keep the rest
        errors.append(f"queues and pools: {type(exc).__name__}: {exc}")
        return {}


def thread_stacks() -> list[ev.ThreadDump]:
    """Every Python thread's stack (dumps.py: named from code objects, never source lines: the
    scheduler thread runs on meanwhile, and a TP peer's mismatched forward aborts the process
    within milliseconds)."""
    from hicache_diag.engines.sglang.plugin.dumps import thread_dumps

    return thread_dumps()
