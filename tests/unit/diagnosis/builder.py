"""Synthetic run directories that follow docs/evidence.md exactly, for the diagnosis tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MUST_AGREE = [
    "rids",
    "extend_num_tokens",
    "prefix_len",
    "host_hit_len",
    "acks_consumed",
    "evicted",
    "load_backs",
    "write_backs",
    "device_free",
    "tree_digest",
]


def step_record(rank: int, step: int, pp: int | None = None, **over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "rank": rank,
        "pp": rank if pp is None else pp,
        "tp": 0,
        "step": step,
        "slot": step % 2,
        "t": 1000.0 + step * 0.01 + rank * 0.001,
        "rids": [f"r{step}"],
        "forward_mode": "extend",
        "extend_num_tokens": 16,
        "prefix_len": {f"r{step}": 0},
        "host_hit_len": {f"r{step}": 0},
        "l3_hit_len": {},
        "l3_hit_len_local": {},
        "queues": {"write_queue": 0, "load_queue": 0, "ack_write_queue": 1, "ack_load_queue": 0},
        "acks_ready": {"write": 1, "load": 0},
        "acks_consumed": {"write": 1, "load": 0},
        "sync_received": {},
        "host_alloc_failed": 0,
        "host_free": 2048,
        "device_free": 1000,
        "host_capacity": 2048,
        "evicted": 0,
        "evict_victims": [],
        "load_backs": 0,
        "write_backs": 16,
        "inflight_sends": 0,
        "clock": float(step),
        "tree_digest": f"d{step}",
        "faults_fired": [],
        "events": [],
        "must_agree": list(MUST_AGREE),
    }
    rec.update(over)
    return rec


class RunDir:
    """Build a run dir: `steps` per rank with per-(rank, step) overrides, logs, launcher, stacks."""

    def __init__(self, root: Path, world: int = 2, steps: int = 10, seed: int = 7) -> None:
        self.root, self.world, self.steps, self.seed = root, world, steps, seed
        self.over: dict[tuple[int, int], dict[str, Any]] = {}
        self.stop_at: dict[int, int] = {}  # rank -> last step it wrote
        self.logs: dict[int, str] = {
            r: f"[2026-11-29 10:00:00 PP{r} TP0] started\n" for r in range(world)
        }
        self.launcher: dict[str, Any] = {
            "ranks": [
                {
                    "rank": r,
                    "pp": r,
                    "tp": 0,
                    "pid": 100 + r,
                    "exitcode": 0,
                    "signal": None,
                    "state": "exited",
                }
                for r in range(world)
            ],
            "first_failure": None,
            "hang": None,
            "stacks": {"tool": None, "error": None},
            "interrupted": False,
            "started_at": 1000.0,
            "ended_at": 1001.5,
        }
        self.stacks: dict[int, Any] = {}
        tokens = {f"r{i}": [1, 2, 3] for i in range(3)}
        self.outputs: dict[str, Any] | None = dict(tokens)
        self.reference: dict[str, Any] | None = {"tokens": dict(tokens), "tolerance": 0.0}
        self.manifest = {
            "tool": "hicache-diag",
            "version": "0.1.0",
            "evidence_version": 1,
            "seed": seed,
            "protocol": {},
            "faults": [],
            "argv": [],
            "topology": {
                "pp": world,
                "tp": 1,
                "world_size": world,
                "ranks": [{"rank": r, "pp": r, "tp": 0} for r in range(world)],
            },
        }

    def set(self, rank: int, step: int, **over: Any) -> RunDir:
        self.over.setdefault((rank, step), {}).update(over)
        return self

    def crash(self, rank: int, at_step: int, exc_lines: str, t: float, state: str = "crashed"):
        self.stop_at[rank] = at_step
        ts = "2026-11-29 10:00:01"
        self.logs[rank] += (
            f"[{ts} PP{rank} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/x/hicache_diag/engines/builtin/runtime/managers/scheduler_pp_mixin.py", '
            "line 88, in "
            "event_loop_pp\n    self._pp_launch_batch(mb_id)\n" + exc_lines + "\n"
        )
        for entry in self.launcher["ranks"]:
            if entry["rank"] == rank:
                entry.update(state=state, exitcode=1)
        first = self.launcher["first_failure"]
        if first is None or t < first["t"]:
            self.launcher["first_failure"] = {"rank": rank, "t": t}
        return self

    def write(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "manifest.json").write_text(json.dumps(self.manifest))
        for r in range(self.world):
            last = self.stop_at.get(r, self.steps - 1)
            lines = [
                json.dumps(step_record(r, s, **self.over.get((r, s), {}))) for s in range(last + 1)
            ]
            (self.root / f"rank{r}.jsonl").write_text("\n".join(lines) + "\n")
            (self.root / f"rank{r}.log").write_text(self.logs[r])
        if self.launcher is not None:
            (self.root / "launcher.json").write_text(json.dumps(self.launcher))
        for name, data in (("outputs.json", self.outputs), ("reference.json", self.reference)):
            if data is not None:
                (self.root / name).write_text(json.dumps(data))
        if self.stacks:
            (self.root / "stacks").mkdir(exist_ok=True)
            for r, dump in self.stacks.items():
                ext = "txt" if isinstance(dump, str) else "json"
                text = dump if isinstance(dump, str) else json.dumps(dump)
                (self.root / "stacks" / f"rank{r}.{ext}").write_text(text)
        return self.root


def pyspy_dump(*frames: tuple[str, str, int]) -> list[dict[str, Any]]:
    """A py-spy --json dump with one MainThread, frames innermost first."""
    return [
        {
            "pid": 1,
            "thread_id": 1,
            "thread_name": "MainThread",
            "active": False,
            "owns_gil": False,
            "frames": [
                {"name": n, "filename": f, "short_filename": f.rsplit("/", 1)[-1], "line": ln}
                for n, f, ln in frames
            ],
        }
    ]


SHAPE_ERR = "RuntimeError: shape '[12, -1, 16]' is invalid for input of size 1024"
POP_ERR = (
    '  File "/x/cache_controller.py", line 9, in writing_check\n'
    "    self.ack_write_queue.pop(0)\nIndexError: pop from empty list"
)
PEER_ERR = (
    '  File "/x/torch/distributed/distributed_c10d.py", line 3, in recv\n    work.wait()\n'
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection "
    "closed by peer [127.0.0.1]:17092"
)
