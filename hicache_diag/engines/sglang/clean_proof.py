"""The harness's side of a warm server's trial boundary (engines/sglang/plugin/clean_state.py is the
ranks'): ask every rank for its clean-state proof, read them, and compare them with the fresh
server's. A trial runs on a server only when this finds no difference."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.plugin.clean_state import REQUEST, ack_path
from hicache_diag.engines.sglang.plugin.l3_state import ZERO_FACTS as L3_ZERO
from hicache_diag.engines.sglang.plugin.step_fields import STORAGE_QUEUES

ACK_TIMEOUT_S = 60.0  # every rank steps (idle polls) many times a second; a loaded box is slow
FLUSH_TIMEOUT_S = 60.0
# Under PP /flush_cache answers once PP0 flushed; a later stage flushes a little after (PP1's
# tree was measured still holding 234 tokens right after the answer): a second look waits this.
SETTLE_S = 1.0
UNKNOWN = ev.UNKNOWN
# Facts that are 0 on any clean server, fresh or warm (the others: equal to the fresh server's).
ZERO = (
    "tree_nodes",
    "tree_values",
    "evictable_size",
    "protected_size",
    "ongoing_write_through",
    "ongoing_load_back",
    "ongoing_prefetch",
    "ongoing_backup",
    "session_slots",
    "sessions",
    "waiting_queue",
    "running_reqs",
    "write_queue",
    "load_queue",
    "ack_write_queue",
    "ack_load_queue",
    *STORAGE_QUEUES,
    *L3_ZERO,
)

Proofs = dict[int, dict[str, Any]]  # rank -> facts


def differences(proofs: Proofs, fresh: Proofs) -> list[str]:
    """Every way `proofs` (each rank's facts now) differ from a fresh server's (`fresh`): a rank
    missing, a fact unknown on either side (never assumed clean), a value not equal, a queue or
    tree not empty. Empty: proven clean."""
    out = []
    if set(proofs) != set(fresh):
        out.append(f"ranks {sorted(proofs)} answered; the fresh server had {sorted(fresh)}")
    for rank in sorted(set(proofs) & set(fresh)):
        now, then = proofs[rank], fresh[rank]
        if "error" in now:
            out.append(f"rank{rank}: its facts could not be read: {now['error']}")
            continue
        for key in sorted(set(now) | set(then)):
            value, was = now.get(key, UNKNOWN), then.get(key, UNKNOWN)
            if UNKNOWN in (value, was):
                out.append(f"rank{rank}: {key} unknown in this release: never assumed clean")
            elif value != was:
                out.append(f"rank{rank}: {key} {value} (fresh server: {was})")
            elif key in ZERO and value != 0:
                out.append(f"rank{rank}: {key} {value}, on the fresh server too (not empty)")
    return out


def not_empty(fresh: Proofs) -> list[str]:
    """A fresh server's own proof that is not empty (it is then no reference)."""
    return [
        f"rank{rank}: {key} {facts[key]} on the fresh server"
        for rank, facts in sorted(fresh.items())
        for key in ZERO
        if key in facts and facts[key] not in (0, UNKNOWN)
    ]


@dataclass
class Look:
    """One look at a kept server after /flush_cache: each rank's facts, what went wrong in the
    flush or the asking (`problems`), and how the facts differ from the fresh server's."""

    proofs: Proofs
    problems: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems and not self.differences


def look_twice(look: Callable[[], Look], settle_s: float = SETTLE_S) -> tuple[Look, Look | None]:
    """`look()`, and once more after `settle_s` when only the facts differed (the flush was
    taken and every rank answered): a later PP stage may still be flushing. The look to decide
    on, and the first one when there were two. Still dirty on the second look is dirty."""
    first = look()
    if first.clean or first.problems:
        return first, None
    time.sleep(settle_s)
    return look(), first


class Control:
    """The control dir the plugin watches (plugin config `control_dir`)."""

    def __init__(self, root: Path, world_size: int) -> None:
        self.dir = root
        self.world_size = world_size
        self.seq = 0
        root.mkdir(parents=True, exist_ok=True)

    def ask(
        self, proof_dir: Path | None, steps_dir: Path | None, timeout_s: float = ACK_TIMEOUT_S
    ) -> Proofs | None:
        """One request to every rank; their proofs (with `proof_dir`), {} without; None when a
        rank did not answer in time."""
        self.seq += 1
        request = {
            "seq": self.seq,
            "proof_dir": str(proof_dir) if proof_dir else None,
            "steps_dir": str(steps_dir) if steps_dir else None,
        }
        tmp = self.dir / (REQUEST + ".tmp")
        tmp.write_text(json.dumps(request))
        os.replace(tmp, self.dir / REQUEST)
        if not self._acked(timeout_s):
            return None
        return read_proofs(proof_dir, self.world_size, self.seq) if proof_dir else {}

    def _acked(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ack(r) >= self.seq for r in range(self.world_size)):
                return True
            time.sleep(0.05)
        return False

    def _ack(self, rank: int) -> int:
        try:
            with open(ack_path(str(self.dir), rank)) as fh:
                return int(json.load(fh).get("seq", 0))
        except (OSError, ValueError):
            return 0


def read_proofs(run_dir: Path, world_size: int, seq: int) -> Proofs:
    """clean_state/rank{r}.json of boundary `seq`, their one reader; a rank whose file is
    missing, torn or of another boundary is left out (then it differs)."""
    out: Proofs = {}
    for rank in range(world_size):
        try:
            proof = ev.read_record(ev.CleanStateProof, ev.clean_state_json(run_dir, rank))
        except (OSError, ValueError):
            continue
        if proof.seq == seq:
            out[rank] = dict(proof.facts)
    return out


def storage_refusal(spec: Any) -> str:
    """Why a server launched with `spec` (sglang/launch_spec.py, before the trial picks its L3
    dir) is never reused across trials for its L3; "" when its L3 can be proven empty: the
    `file` backend in a dir the harness gives it (and may empty)."""
    backend = spec.hicache_storage_backend
    if not backend:
        return ""
    if backend != "file":
        return f"the L3 backend {backend!r}: only the file backend's state is read and emptied"
    if spec.hicache_storage_dir:
        return "a user's --hicache-storage-dir: never emptied by us, so each trial gets its own"
    return ""


def flush_cache(url: str, timeout_s: float = FLUSH_TIMEOUT_S) -> str | None:
    """SGLang's own /flush_cache (it refuses while a request is queued or running; it resets
    the tree and the controller's queues and restarts its storage threads, but leaves the L3
    backend, its files and indexes, as they are); None when it flushed, else what it
    answered."""
    return _post(url, "/flush_cache", timeout_s)


def clear_storage(url: str, storage_dir: Path, timeout_s: float = FLUSH_TIMEOUT_S) -> list[str]:
    """After /flush_cache, the L3 of a server whose file-backend dir is ours (never a user's):
    empty the dir, then SGLang's own POST /hicache/storage-backend/clear, which on every rank
    clears the backend's indexes (HiCacheFile.clear: its files, now none, the evictor's LRU,
    the metadata cache) and the tree's storage-existence beliefs. The dir goes first: every
    rank's clear lists and removes the one shared dir, and a file another rank removed under
    it raises before that rank's indexes are cleared. What went wrong, if anything; the
    ranks' proofs then say whether it is empty."""
    problems = []
    try:
        for entry in storage_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except OSError as exc:
        problems.append(f"the L3 dir {storage_dir} could not be emptied: {exc}")
    refused = _post(url, "/hicache/storage-backend/clear", timeout_s)
    if refused is not None:
        problems.append(f"/hicache/storage-backend/clear refused: {refused}")
    return problems


def _post(url: str, path: str, timeout_s: float) -> str | None:
    req = urllib.request.Request(url + path, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        return f"HTTP {exc.code}: {body[:200]}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
