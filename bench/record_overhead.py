"""What `hicache-diag record` costs a real server: SGLang 0.5.23 on CPU, the default PP2 launch
(launch_spec.py's defaults: page 4, 256-token device pool, HiCache write-through, ratio 2), in
steady decode, with the recorder on and off, alternating in one run.

    python bench/record_overhead.py [--rounds 6] [--window-s 20] [--streams 4]

Two servers, the same command line, launched through `hicache-diag record --cpu-shims`; the
"off" one with HICACHE_DIAG_RECORD=0 (the plugin's CPU shims alone, which both need here).
Only one runs at a time: the other's whole process group is SIGSTOPped, so neither steals the
other's cores (idle PP schedulers busy-poll). Each window drives `--streams` closed-loop
streams of the default workload's prompts (cut to 24 tokens) with 32 new tokens each, and
counts the tokens completed; the windows go on, off, off, on, ... (ABBA, so drift cancels).
Then each scheduler's resident memory (on minus off), the recorder's written step rate, and its
bytes on disk per rank per day projected from that rate. Budgets (printed, never asserted): on
>= 99.5% of off, <= 16 MB resident, <= 64 MB/rank/day. The last line (P, T1 and T2 from the
windows' means; every window is printed too: on a shared box they spread far wider than 0.5%,
read P against that spread; `--off patched` compares with the plugin's patches in place and
no recording):

    recorder overhead P% (on T1 tok/s, off T2 tok/s), R MB/rank/day
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

NEW_TOKENS = 32
PROMPT_TOKENS = 24
DAY_S = 86400


class Server:  # a plain class: the bench tests load this file without a module entry
    def __init__(self, name: str, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.name, self.proc, self.port, self.log = name, proc, port, log
        self.tokens: list[float] = []  # tok/s per window

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def cont(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


def _launch(name: str, port: int, record_dir: Path, work: Path, on: bool, off: str) -> Server:
    from hicache_diag.engines.sglang.install import probe_sglang
    from hicache_diag.engines.sglang.launch_spec import LaunchSpec
    from hicache_diag.engines.sglang.model import default_model_dir

    install = probe_sglang(None)
    model = default_model_dir(install.python, install.transformers)
    server = LaunchSpec(model).argv(install.python, port)
    argv = [sys.executable, "-m", "hicache_diag.cli.main", "record", "--cpu-shims"]
    argv += ["--dir", str(record_dir), "--", *server]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HICACHE_DIAG_")}
    env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in (0, 1))
    if not on and off == "switch":
        env["HICACHE_DIAG_RECORD"] = "0"
    elif not on:  # the plugin's patches in place, its recording off from the start
        argv[argv.index("--dir") + 1] = "/proc/no-such-dir"
    log = work / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Server(name, proc, port, log)


def _ready(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            sys.exit(f"{server.name} server exited: {server.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5):
                return
        except OSError:
            time.sleep(1)
    sys.exit(f"{server.name} server not ready after {timeout_s:.0f} s")


def _prompts() -> list[list[int]]:
    from hicache_diag.engines.sglang.options import SglangOptions
    from hicache_diag.options.workloads import Pool, Workload, WorkloadConfig

    opts = SglangOptions()
    config = WorkloadConfig(opts.workload, opts.requests, NEW_TOKENS, opts.seed)
    pool = Pool(opts.max_total_tokens, 4096, 512)
    return [list(r.input_ids[:PROMPT_TOKENS]) for r in Workload(config, pool).requests]


def _generate(port: int, ids: list[int]) -> int:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return int(json.loads(resp.read())["meta_info"]["completion_tokens"])


def _window(server: Server, prompts: list[list[int]], streams: int, seconds: float) -> float:
    """Tokens a second over `seconds` of `streams` closed-loop streams (requests that finish
    after the window count by the part of them inside it)."""
    done: list[tuple[float, float, int]] = []
    stop_at = time.monotonic() + seconds

    def stream(k: int) -> None:
        i = k
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            n = _generate(server.port, prompts[i % len(prompts)])
            done.append((t0, time.monotonic(), n))
            i += streams

    start = time.monotonic()
    threads = [threading.Thread(target=stream, args=(k,)) for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = stop_at
    tokens = sum(n * max(0.0, min(b, end) - max(a, start)) / max(b - a, 1e-9) for a, b, n in done)
    return tokens / (end - start)


def _rss_mb(server: Server) -> dict[int, float]:
    import psutil

    out = {}
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        title = " ".join(p.cmdline())
        if title.startswith("sglang::scheduler"):
            rank = int(title.split("_PP", 1)[1][:1]) if "_PP" in title else 0
            out[rank] = p.memory_info().rss / 2**20
    return out


def _disk(record_dir: Path, on_s: float) -> tuple[float, list[str]]:
    """Per rank: lines written per second while driven, bytes per written step by file, and
    what a day at that rate leaves on disk (each file kind capped by the recorder's rings)."""
    from hicache_diag.evidence import recording as rec

    limits = rec.Limits()
    caps = {
        "lines": 2 * limits.lines_bytes,
        "digest": limits.digest_segments * limits.digest_segment_bytes,
        "blocks": 2 * limits.blocks_bytes,
    }
    (session,) = rec.sessions_in(record_dir)
    worst, notes = 0.0, []
    for rank, view in rec.read_session(session).items():
        busy = [ln for ln in view.lines if ln.get("rids")]
        rate = len(busy) / on_s if on_s else 0.0
        size = {
            k: sum(p.stat().st_size for p in session.glob(f"rank{rank}.{g}"))
            for k, g in (("lines", "jsonl*"), ("digest", "digest.*"), ("blocks", "blocks*"))
        }
        per_step = {k: size[k] / max(len(view.digests), 1) for k in size}
        written = {k: per_step[k] * rate * DAY_S for k in size}
        kept = sum(min(written[k], caps[k]) for k in size) / 2**20
        worst = max(worst, kept)
        hours = {k: caps[k] / max(per_step[k] * rate, 1e-9) / 3600 for k in size}
        notes.append(
            f"rank {rank}: {rate:.1f} written steps/s while driven; per step "
            + ", ".join(f"{k} {per_step[k]:.0f} B" for k in size)
            + f"; a day writes {sum(written.values()) / 2**20:.0f} MB, keeps {kept:.1f} MB; "
            + "history held: "
            + ", ".join(f"{k} {min(hours[k], 24):.1f} h" for k in size)
        )
    return worst, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="ABBA windows per server")
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--ready-s", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep the logs and recording")
    parser.add_argument("--off-first", action="store_true", help="launch the off server first")
    parser.add_argument(
        "--off",
        choices=("switch", "patched"),
        default="switch",
        help="the off server: HICACHE_DIAG_RECORD=0 (SGLang as it is), or the plugin's patches "
        "in place with no recording (an unwritable dir): what the patches alone cost",
    )
    args = parser.parse_args()
    from hicache_diag.engines.sglang.ports import free_ports

    work = Path(tempfile.mkdtemp(prefix="record-overhead-"))
    ports = free_ports(2)
    servers: list[Server] = []
    try:
        for name in ("off", "on") if args.off_first else ("on", "off"):
            port = ports[len(servers)]
            rec_dir = work / f"rec-{name}"
            servers.append(_launch(name, port, rec_dir, work, name == "on", args.off))
            _ready(servers[-1], args.ready_s)
            servers[-1].stop()
        on, off = sorted(servers, key=lambda s: s.name != "on")
        prompts = _prompts()
        for s in (off, on):  # warm both: the first requests compile and fill caches
            s.cont()
            _window(s, prompts, args.streams, 5)
            s.stop()
        order = [on, off, off, on] * ((args.rounds + 1) // 2)
        for s in order[: 2 * args.rounds]:
            s.cont()
            s.tokens.append(_window(s, prompts, args.streams, args.window_s))
            s.stop()
            print(f"  {s.name}: {s.tokens[-1]:.1f} tok/s", flush=True)
        rss = {}
        for s in servers:
            s.cont()
            rss[s.name] = _rss_mb(s)
            s.stop()
        kept, notes = _disk(work / "rec-on", args.window_s * len(on.tokens))
        t_on, t_off = statistics.mean(on.tokens), statistics.mean(off.tokens)
        ratio = t_on / t_off
        med = statistics.median(on.tokens) / statistics.median(off.tokens)
        print(
            f"windows: on {[round(t, 1) for t in on.tokens]}, off "
            f"{[round(t, 1) for t in off.tokens]} (tok/s, {args.window_s:.0f} s each)"
        )
        print(
            f"on/off: {100 * ratio:.2f}% of off by means, {100 * med:.2f}% by medians"
            " (budget >= 99.5%)"
        )
        for rank in sorted(rss["on"]):
            extra = rss["on"][rank] - rss["off"].get(rank, 0.0)
            print(
                f"rank {rank}: resident {rss['on'][rank]:.0f} MB on, "
                f"{rss['off'].get(rank, 0):.0f} MB off: recorder {extra:+.1f} MB (budget <= 16)"
            )
        for note in notes:
            print(note)
        print(f"disk: {kept:.1f} MB/rank/day kept (budget <= 64)")
        overhead = 100.0 * (1.0 - ratio)
        print(
            f"recorder overhead {overhead:.2f}% (on {t_on:.1f} tok/s, off {t_off:.1f} tok/s), "
            f"{kept:.1f} MB/rank/day"
        )
    finally:
        for s in servers:
            try:
                s.cont()
                os.killpg(s.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            s.proc.wait()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
