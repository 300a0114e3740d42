"""Make a real Flight Recorder dump with torch's own recorder on gloo (CPU), for `triage --fr`.

Run from the project root:  python bench/fr_capture.py [OUT_DIR]
Four ranks (torch.multiprocessing, gloo, a 5 s timeout) run three all_reduces together; then
ranks 0, 1 and 3 enter a fourth all_reduce while rank 2 enters a broadcast instead (the shape
of a skipped or extra sync: the ranks issued different collective sequences). Each rank's
collective times out; each then writes what torch's recorder holds
(`torch._C._distributed_c10d._dump_fr_trace()`, the bytes torch writes on an NCCL timeout to
`TORCH_FR_DUMP_TEMP_FILE<rank>`) to OUT_DIR/nccl_trace_rank_<rank>, and its log lines (torch's
own exception text, prefixed `[rank<N>]:` as torchrun's --tee does) to OUT_DIR/ranks.log.
Default OUT_DIR: samples/flight_recorder/gloo-desync-4ranks. Prints the files written.
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("bench")]

import datetime  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

WORLD = 4
LATE = 2  # the rank that enters another collective


def _rank(rank: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=5)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timeout)
    t = torch.ones(8)
    lines = [f"[rank{rank}]: init_process_group gloo world_size={WORLD}"]
    for _ in range(3):
        dist.all_reduce(t)
    try:
        if rank == LATE:
            dist.broadcast(t, src=0)
        else:
            dist.all_reduce(t)
    except RuntimeError as exc:
        lines.append(f"[rank{rank}]: RuntimeError: {exc}")
    Path(out, f"nccl_trace_rank_{rank}").write_bytes(_dump_fr_trace())
    with open(Path(out, "ranks.log"), "a") as f:
        f.write("\n".join(lines) + "\n")
    os._exit(0)  # the group is broken: no clean shutdown to wait for


def main() -> int:
    import argparse
    import socket

    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out_dir",
        nargs="?",
        default="samples/flight_recorder/gloo-desync-4ranks",
        help="where the four dumps and ranks.log go (default: %(default)s)",
    )
    out = Path(parser.parse_args().out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("nccl_trace_rank_*"):
        old.unlink()
    (out / "ranks.log").unlink(missing_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the recorder is off without it
    mp.spawn(_rank, args=(str(out), port), nprocs=WORLD, join=True)
    for p in sorted(out.iterdir()):
        print(p, p.stat().st_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
