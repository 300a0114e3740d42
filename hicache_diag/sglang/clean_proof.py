"""The harness's side of a warm server's trial boundary (sglang_plugin/clean_state.py is the
ranks'): ask every rank for its clean-state proof, read them, and compare them with the fresh
server's. A trial runs on a server only when this finds no difference."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hicache_diag import evidence as ev
from hicache_diag.sglang_plugin.clean_state import REQUEST, ack_path

ACK_TIMEOUT_S = 60.0  # every rank steps (idle polls) many times a second; a loaded box is slow
FLUSH_TIMEOUT_S = 60.0
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


def flush_cache(url: str, timeout_s: float = FLUSH_TIMEOUT_S) -> str | None:
    """SGLang's own /flush_cache (it refuses while a request is queued or running); None when it
    flushed, else what it answered."""
    req = urllib.request.Request(url + "/flush_cache", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        return f"HTTP {exc.code}: {body[:200]}"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
