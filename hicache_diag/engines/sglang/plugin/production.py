"""A rank of a server the user launched, recording (`hicache-diag record`): the run's StepRecorder
writing through a production sink into the launch's session (evidence/recording.py), with its
dumper (dumps.py). Never in the way: whatever fails inside the plugin turns the rank's
recording off (`RankOff`), says so once in SGLang's log and in the rank's meta file, and the
scheduler goes on serving as if the plugin were not there."""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hicache_diag.engines.sglang.plugin import dumps
from hicache_diag.engines.sglang.plugin.hook_state import STATE
from hicache_diag.engines.sglang.plugin.recorder import MUST_AGREE, StepRecorder
from hicache_diag.engines.sglang.plugin.sinks import RecordingSink
from hicache_diag.evidence.recording import Limits, RankMeta, RankRecording, meta_path

# A child of no SGLang logger: SGLang's basicConfig(force=True) root handler prints it with the
# rank's own prefix ("[... PP1] hicache-diag recorder off on rank 1: ...").
logger = logging.getLogger("hicache_diag.recorder")


class RankOff:
    """The one way a rank's recording turns off, from any thread, once."""

    def __init__(self) -> None:
        self.rank: int | None = None
        self.reason: str | None = None
        self.sink: RecordingSink | None = None

    def __call__(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        try:
            STATE.recorder = None  # every wrapper passes SGLang's calls straight through now
            dumps.RANK.clear()
            who = "?" if self.rank is None else self.rank
            logger.warning("hicache-diag recorder off on rank %s: %s", who, reason)
            if self.sink is not None:
                self.sink.fail(reason)
        except Exception:  # noqa: BLE001 - turning off must never be what breaks SGLang
            pass


OFF = RankOff()  # this process's; guarded patches report to it (boot.py)


def _release() -> str | None:
    module = sys.modules.get("sglang")
    version = getattr(module, "__version__", None)
    return str(version) if version else None


def arm_rank(session_dir: str, hooks: Any, server_args: Any, ids: tuple[int, int, int]) -> None:
    """Set STATE.recorder for this rank (rank, pp_rank, tp_rank), recording into the session;
    leave it None (and say why, once) when the recording cannot start."""
    rank, pp_rank, tp_rank = ids
    OFF.rank = rank
    limits = Limits()
    meta = RankMeta(
        rank=rank,
        pp_rank=pp_rank,
        tp_rank=tp_rank,
        pid=os.getpid(),
        host=socket.gethostname(),
        release=_release(),
        fields=list(MUST_AGREE),
        started_at=time.time(),
        limits=asdict(limits),
        device=str(getattr(server_args, "device", None) or "") or None,
    )
    taken = _recorded_by(Path(session_dir), rank)
    if taken is not None:  # e.g. data-parallel replicas: one rank number, two processes
        OFF(f"rank {rank} of this session is recorded by pid {taken} already")
        return
    recording = RankRecording(Path(session_dir), meta, limits, on_off=OFF)
    if not recording.on:
        return  # OFF said why
    sink = RecordingSink(recording, MUST_AGREE, OFF)
    OFF.sink = sink
    recorder = StepRecorder(sink, rank, pp_rank, tp_rank, hooks)
    recorder.on_failure = OFF
    dumper = dumps.RankDumper(recording, recorder, STATE)
    meta.dump_signal, meta.dumper = dumper.install_signal(), True
    recording.refresh_meta()
    STATE.recorder = recorder
    dumps.RANK[:] = [dumper]
    dumper.start()
    atexit.register(_close, recorder)


def _recorded_by(session: Path, rank: int) -> int | None:
    """The pid of a live process already recording `rank` in `session`, if any."""
    try:
        pid = int(json.loads(meta_path(session, rank).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except OSError:
        pass  # alive, someone else's
    return pid


def _close(recorder: StepRecorder) -> None:
    """At exit: the lines still queued, then the meta with the last step written."""
    try:
        recorder.sink.close()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
