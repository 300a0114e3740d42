"""A scheduler stand-in for multi-node triage tests: a launcher whose command line carries
`--node-rank`, forking one child titled like SGLang's (`sglang::scheduler_PP1_TP0`), the way
SGLang's launcher spawns its schedulers. PP ranks talk over loopback TCP with SGLang's function
names, so py-spy sees PP0 waiting in a receive for PP1. Stdlib + setproctitle: starts in
milliseconds. Every process exits on its own after LIFETIME_S. Not collected (no test_ prefix).

Run: `python fake_rank.py --node-rank N --pp P --pp-size S --port PORT`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

LIFETIME_S = 60.0


def recv_object(sock: socket.socket) -> bytes:
    return sock.recv(1)


def point_to_point_pyobj(sock: socket.socket) -> bytes:
    return recv_object(sock)


def _pp_recv_proxy_tensors(sock: socket.socket) -> bytes:
    return point_to_point_pyobj(sock)


def event_loop_pp(args: argparse.Namespace) -> None:
    """PP0 waits for the next stage's bytes; a later stage connects and computes in steps."""
    if args.pp == 0:
        server = socket.create_server(("127.0.0.1", args.port))
        print("READY", flush=True)
        conn, _ = server.accept()
        while True:
            _pp_recv_proxy_tensors(conn)
    for _ in range(200):
        try:
            sock = socket.create_connection(("127.0.0.1", args.port))
            break
        except OSError:
            time.sleep(0.05)
    print("READY", flush=True)
    while True:
        run_batch(sock)


def run_batch(sock: socket.socket) -> None:
    time.sleep(0.05)  # a step; never sends: PP0 keeps waiting


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--node-rank", "--pp", "--pp-size", "--port"):
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args()
    threading.Timer(LIFETIME_S, os._exit, args=(0,)).start()
    child = os.fork()
    if child:  # the launcher keeps `--node-rank` on its command line, as SGLang's does
        os.waitpid(child, 0)
        os._exit(0)
    import setproctitle

    setproctitle.setproctitle(f"sglang::scheduler_PP{args.pp}_TP0")
    threading.Timer(LIFETIME_S, os._exit, args=(0,)).start()
    event_loop_pp(args)


if __name__ == "__main__":
    sys.exit(main())
