"""A warm SGLang server across trials (issue 31): a trial runs on the server the previous trial
left only when every rank proved its state equal to the fresh server's (sglang/clean_proof.py);
otherwise the server is restarted. The manifest's `warm_server` says which, and why.

The pool lives in the process that runs the trials one after another (trials/warm_trials.py).
SGLang's whole output goes to the pool's own server.log; each trial gets its slice. A server
is never reused after a trial that had faults (they are armed at launch and touch the server),
failed, hung, was interrupted or was judged anything but ok (read from its verdict at the next
boundary: a silent divergence leaves the watch nothing). With the L3 `file` backend the pool
gives each server its own dir (`l3-{generation}`) and empties it, and SGLang's backend indexes,
at every boundary; the ranks' proofs then show it empty. Another backend, or a user's
--hicache-storage-dir, means a server per trial (clean_proof.py `storage_refusal`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.clean_proof import (
    Control,
    Look,
    Proofs,
    clear_storage,
    differences,
    flush_cache,
    look_twice,
    not_empty,
    storage_refusal,
)
from hicache_diag.engines.sglang.reference import ReferenceWorker
from hicache_diag.trials.trials import verdict_in

if TYPE_CHECKING:
    from hicache_diag.engines.sglang.config import SglangRunConfig
    from hicache_diag.engines.sglang.server import SglangServer
    from hicache_diag.trials.engine import TrialWatch
    from hicache_diag.trials.trial import TrialResult

PARKED = "between-trials"  # the ranks' idle steps between two trials go here, not to a run dir


def _key(cfg: SglangRunConfig) -> tuple[Any, ...]:
    """What the server was launched with: a trial with another key needs another server. The
    release and its --patch lead: a warm server never serves another patch's trials."""
    return (cfg.python, cfg.sglang_version, _patch_sha(cfg), cfg.spec, cfg.cpu_kernel_names)


def _patch_sha(cfg: SglangRunConfig) -> str | None:
    return (cfg.release.get("patch") or {}).get("sha256")


class WarmSglang:
    """The warm server and what the next trial's boundary compares against."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.server: SglangServer | None = None
        self.control: Control | None = None
        self.key: tuple[Any, ...] | None = None
        self.fresh: Proofs = {}
        self.fresh_problems: list[str] = []
        self.server_trial = 0  # trials run on the current server so far
        self.reusable = ""  # why the last trial's server may not be reused ("" : it may)
        self.generation = 0  # servers started so far: each watches its own control dir
        self.storage_dir: Path | None = None  # the current server's L3 dir, when it is ours
        self.reference = ReferenceWorker()  # the trials' reference outputs, one loaded model
        self.last_run: Path | None = None  # the previous trial's run dir (its verdict)

    @property
    def log_path(self) -> Path:
        return self.root / ev.SERVER_LOG

    @property
    def control_dir(self) -> Path:
        """The next (or current) server's: a new server never reads an old one's requests."""
        return self.root / f"control{self.generation}"

    def l3_dir(self, cfg: SglangRunConfig) -> Path | None:
        """The L3 dir the pool gives the next (or current) server of a `file`-backend launch
        without a user's dir (None otherwise); a new server starts with a new, empty one."""
        if not cfg.spec.hicache_storage_backend or storage_refusal(cfg.spec):
            return None
        path = self.root / f"l3-{self.generation}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def trial(self, cfg: SglangRunConfig, argv: list[str] | None = None) -> TrialResult:
        """One trial on this pool's server (trials/warm_trials.py `WarmPool`)."""
        from hicache_diag.engines.sglang.trial import SglangEngine
        from hicache_diag.trials.trial import run_engine_trial

        return run_engine_trial(SglangEngine(cfg, warm=self), cfg, argv)

    # -- the boundary, before the trial's manifest -------------------------------------------
    def boundary(self, cfg: SglangRunConfig, run_dir: Path) -> ev.WarmServerRecord:
        """Reuse the server for the trial in `run_dir` if proven clean, else stop it (the trial
        then starts a fresh one). The record goes into the trial's manifest."""
        if self.server is None:
            return ev.WarmServerRecord(why="fresh server: no warm server yet")
        refusal = self._refusal(cfg)
        if refusal:
            pid = self.server.popen.pid if self.server.popen else None
            self.stop()
            return ev.WarmServerRecord(why=f"restarted: {refusal}", server_pid=pid)
        return self._prove(run_dir)

    def note_trial(self, run_dir: Path) -> None:
        """The trial now on this pool's server: its verdict, once written, decides the next
        boundary."""
        self.last_run = run_dir

    def _refusal(self, cfg: SglangRunConfig) -> str:
        if self.reusable:
            return self.reusable
        judged = _judged(self.last_run)
        if judged not in ("ok", None):
            # Decided after release(): a silent divergence (the stages ran different requests)
            # leaves no failure for the watch, yet the ranks took different paths on this server.
            return f"the previous trial's verdict was {judged}"
        if cfg.faults:
            return "this trial has faults (armed at launch: they need a server of their own)"
        storage = storage_refusal(cfg.spec)
        if storage:
            return storage
        if _key(cfg)[:3] != self.key[:3]:
            return "this trial's release or --patch differs from the warm server's"
        if _key(cfg) != self.key:
            return "this trial's launch differs from the warm server's"
        if not self.server.alive():
            return "the warm server is gone"
        return ""

    def _prove(self, run_dir: Path) -> ev.WarmServerRecord:
        t0 = time.time()
        server = self.server
        look, first = look_twice(lambda: self._look(run_dir))
        problems = look.problems + look.differences
        if not problems:  # proven clean: the ranks' steps go to this trial's run dir
            if self.control.ask(None, run_dir) is None:
                problems.append("a rank did not move its step recorder in time")
        record = ev.WarmServerRecord(
            reused=not problems,
            why="proven clean on every rank" if not problems else "restarted: not clean",
            server_trial=self.server_trial,
            server_pid=server.popen.pid if server.popen else None,
            boundary_s=round(time.time() - t0, 3),
            proof=_by_rank(look.proofs),
            fresh=_by_rank(self.fresh),
            differences=problems,
            second_look=first is not None,
            first_look=_first_look(first),
        )
        if problems:
            self.stop()  # a dirty server is never run on
        return record

    def _look(self, run_dir: Path, fresh: bool = False) -> Look:
        """Flush, then every rank's proof into `run_dir`: compared with the fresh server's, or,
        for the fresh server's own (`fresh`), held to the facts every clean server has."""
        problems = self._flush(" on the fresh server" if fresh else "")
        proofs = self.control.ask(run_dir, None)
        if proofs is None:
            which = "fresh proof request" if fresh else "proof request in time"
            problems.append(f"a rank did not answer the {which}")
            proofs = {}
        off = not_empty(proofs) if fresh else differences(proofs, self.fresh)
        return Look(proofs, problems, off)

    # -- a fresh server -----------------------------------------------------------------------
    def _flush(self, what: str = "") -> list[str]:
        """SGLang's /flush_cache, then the L3 dir and indexes when the dir is ours."""
        refused = flush_cache(self.server.url)
        problems = [] if refused is None else [f"/flush_cache refused{what}: {refused}"]
        if self.storage_dir is not None and refused is None:  # never under a running request
            problems += clear_storage(self.server.url, self.storage_dir)
        return problems

    def adopt(self, server: SglangServer, cfg: SglangRunConfig) -> None:
        """A server just started for a trial (`cfg` as the trial was given, before its L3 dir
        was picked): the pool's from now on."""
        self.server, self.key, self.server_trial = server, _key(cfg), 0
        self.storage_dir = self.l3_dir(cfg)
        self.control = Control(self.control_dir, cfg.world_size)
        self.fresh, self.fresh_problems, self.reusable = {}, [], ""

    def take_fresh_proof(self, run_dir: Path) -> None:
        """After the fresh server is ready: flush what its readiness request left in the tree
        (every trial on it then starts alike), and take the proof every later one is held to."""
        look, _ = look_twice(lambda: self._look(run_dir, fresh=True))  # PP1 may still flush
        self.fresh = look.proofs
        self.fresh_problems = look.differences + look.problems

    # -- after the trial ----------------------------------------------------------------------
    def release(self, cfg: SglangRunConfig, watch: TrialWatch, done: bool) -> bool:
        """After a trial: keep the server for the next one (True) or stop it. Kept only after a
        trial that ended cleanly (`done`: every request answered), with no fault, and whose
        ranks moved their steps out of the run dir in time."""
        self.server_trial += 1
        why = _spoiled(cfg, watch, done) or "; ".join(self.fresh_problems)
        if not why and self.control.ask(None, self.root / PARKED) is None:
            why = "a rank did not park its step recorder in time"
        if why or not self.server.alive():
            self.reusable = why or "the warm server is gone"
            return False
        self.reusable = ""
        return True

    def log_slice(self, run_dir: Path, offset: int) -> None:
        """This trial's part of the pool's server.log, as the trial's own server.log."""
        with open(self.log_path, "rb") as src, open(run_dir / ev.SERVER_LOG, "wb") as dst:
            src.seek(offset)
            shutil.copyfileobj(src, dst)

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.generation += 1
        self.server, self.storage_dir = None, None

    def close(self) -> None:
        self.stop()
        self.reference.close()


def _by_rank(proofs: Proofs) -> dict[str, Any]:
    return {str(r): f for r, f in sorted(proofs.items())}


def _first_look(first: Look | None) -> dict[str, Any]:
    """What the first of two looks saw (empty: one look decided)."""
    if first is None:
        return {}
    return {"proof": _by_rank(first.proofs), "differences": first.differences}


def _judged(run_dir: Path | None) -> str | None:
    """The outcome of `run_dir`'s verdict; "no verdict" when it has none; None: no run."""
    if run_dir is None:
        return None
    verdict = verdict_in(run_dir)
    return verdict.outcome.value if verdict is not None else "no verdict"


def _spoiled(cfg: SglangRunConfig, watch: TrialWatch, done: bool) -> str:
    if cfg.faults:
        return "the previous trial had faults (every fault run ends in a restart)"
    if watch.first_failure is not None or watch.hang is not None:
        return "the previous trial failed or hung"
    if watch.interrupted or watch.startup_error:
        return "the previous trial was interrupted or never started"
    if not done:
        return "the previous trial left requests unanswered"
    return ""
