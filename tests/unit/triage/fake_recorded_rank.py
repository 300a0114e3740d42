"""A scheduler-titled process that records like a server launched through `hicache-diag record`
(evidence/recording.py's writer, in the session its environment names) and answers triage's
dump requests from inside, with every thread's stack (the recorder's ThreadDump shape) and no
ptrace: the recorder's protocol, without SGLang, for the live tests of triage's side.

`python fake_recorded_rank.py RANK STEPS [PART_STEP]`: writes STEPS steps (rank 1 takes another
extend_num_tokens at PART_STEP), prints READY, then waits where SGLang's PP stages wait for each
other (`_pp_recv_proxy_tensors` -> `recv_object`), until killed or LIFETIME_S. Not collected by
pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

LIFETIME_S = 90.0


def _threads() -> list[dict]:
    """Every thread as the recorder's ThreadDump (evidence/recording_dump.py): frames as
    `file:line in func`, outermost first."""
    by_ident = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        thread = by_ident.get(ident)
        frames = [
            f"{fs.filename}:{fs.lineno} in {fs.name}" for fs in traceback.extract_stack(frame)
        ]
        out.append(
            {
                "name": thread.name if thread else "",
                "ident": ident,
                "native_id": thread.native_id if thread else None,
                "main": thread is threading.main_thread(),
                "frames": frames,
            }
        )
    return out


def answer_requests(writer, session: Path) -> None:
    """The recorder's dumper: a new request id in dump-request.json gets one dump."""
    seen = None
    while True:
        try:
            request = json.loads((session / "dump-request.json").read_text())
        except (OSError, ValueError):
            request = None
        if request and request.get("id") != seen:
            seen = request["id"]
            doc = {"request": seen, "pid": os.getpid(), "threads": _threads()}
            writer.dump(doc, "asked")
        time.sleep(0.02)


def _title() -> str:
    return f"sglang::scheduler_PP{int(sys.argv[1])}_TP0"


def recv_object(event: threading.Event) -> None:
    event.wait(LIFETIME_S)


def _pp_recv_proxy_tensors(event: threading.Event) -> None:
    recv_object(event)


def event_loop_pp(event: threading.Event) -> None:
    _pp_recv_proxy_tensors(event)


def main() -> None:
    import setproctitle

    from hicache_diag.evidence import recording as rec

    rank, steps = int(sys.argv[1]), int(sys.argv[2])
    part = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    setproctitle.setproctitle(_title())
    session = Path(os.environ[rec.SESSION_ENV])
    fields = ["rids", "extend_num_tokens", "tree_digest"]
    meta = rec.RankMeta(rank, rank, 0, os.getpid(), "h", "0.5.23", fields, time.time(), {})
    if hasattr(meta, "dumper"):  # the recorder's meta says a dumper thread answers requests
        meta.dumper = True
    writer = rec.RankRecording(session, meta, rec.Limits(reserve_bytes=0))
    for step in range(1, steps + 1):
        tokens = 5 if (rank == 1 and step == part) else 8
        line = {"step": step, "rank": rank, "pp": rank, "tp": 0, "rids": [f"r{step}"]}
        line |= {"extend_num_tokens": tokens, "tree_digest": "d", "must_agree": fields}
        writer.write_step(line)
    threading.Thread(target=answer_requests, args=(writer, session), daemon=True).start()
    print("READY", flush=True)
    event_loop_pp(threading.Event())


if __name__ == "__main__":
    main()
