"""What the sglang engine adds to a trial's run dir after reaping: per-rank logs from SGLang's
log prefixes, the exit codes and watchdog firing SGLang's own log records, the answers."""

from __future__ import annotations

import re
import time
from pathlib import Path

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.client import WorkloadClient
from hicache_diag.engines.sglang.server import SglangServer
from hicache_diag.engines.sglang.server_log import harvest_pyspy_dumps, watchdog_firing
from hicache_diag.evidence.ranks import RankId, parse_rank_tokens
from hicache_diag.rules.rank_labels import split_prefix
from hicache_diag.trials.engine import TrialWatch
from hicache_diag.trials.rundir import write_json

_CHILD_EXIT_RE = re.compile(
    r"Subprocess scheduler_\d+ \(pid=(\d+)\) crashed with exit code (-?\d+)"
)


def _read_watchdog(text: str, run_dir: Path, server: SglangServer, watch: TrialWatch) -> None:
    """SGLang's own watchdog declared a hang: the deaths after it are its teardown, the stacks
    it dumped are the hang's evidence (docs/design.md §8: hangs from py-spy of every scheduler)."""
    pids = {s.pid: s.rank for s in server.schedulers}
    dumped = harvest_pyspy_dumps(text, pids, run_dir / ev.STACKS)
    fired = watchdog_firing(text, server.spec.tp_size)
    if fired is None or watch.hang is not None:
        return
    for s in server.schedulers:
        if s.state == "crashed":
            s.state = "killed"  # torn down by SGLang's launcher after its watchdog fired
    watch.first_failure = None
    watch.hang = ev.HangRecord(
        stalled_ranks=[s.rank for s in server.schedulers],
        last_progress={},
        proc_status={str(r): st for r, st in watch.stops.last_status.items()},
        stopped_ranks=sorted(watch.stops.stopped_for(time.time())),
        detected_by="sglang-watchdog",
        observed_by=fired.rank,
        watchdog_line=fired.line,
    )
    watch.stacks = ev.StacksRecord("py-spy (SGLang's watchdog)", None if dumped else "none")


def finish_evidence(
    run_dir: Path, server: SglangServer, client: WorkloadClient | None, watch: TrialWatch
) -> None:
    """Per-rank logs from the server log, the exit codes and watchdog SGLang's log records, the
    answers."""
    # rank{r}.log: their tracebacks are the classifier's to read (diagnosis/logged_facts.py).
    split_rank_logs(run_dir / ev.SERVER_LOG, run_dir, server.spec.tp_size)
    try:
        text = (run_dir / ev.SERVER_LOG).read_text(errors="replace")
    except OSError:
        text = ""  # no log: nothing below finds anything in it
    _apply_logged_exit_codes(text, server)
    _read_watchdog(text, run_dir, server, watch)
    if client is not None:
        write_json(run_dir / ev.OUTPUTS, client.result.outputs)
        write_json(
            run_dir / ev.REQUESTS,
            {
                "cached": client.result.cached,
                "errors": client.result.errors,
                "aborted": client.result.aborted,
                "latency_s": client.result.latency_s,
            },
        )
        if getattr(client, "events", None) is not None:  # a scripted workload's own timeline
            write_json(run_dir / ev.SCRIPT, client.events)


def _apply_logged_exit_codes(text: str, server: SglangServer) -> None:
    """SGLang's launcher logs each scheduler's exit code; ours only sees a vanished pid."""
    codes = {int(pid): int(code) for pid, code in _CHILD_EXIT_RE.findall(text)}
    pids = [s.pid for s in server.schedulers]
    for s in server.schedulers:
        if pids.count(s.pid) > 1:  # nodes on other machines: one pid, two processes
            continue
        if s.pid in codes and s.state in ("crashed", "exited"):
            s.exitcode = codes[s.pid]


def split_rank_logs(server_log: Path, run_dir: Path, tp_size: int) -> dict[int, Path]:
    """rank{r}.log from SGLang's `[ts PP1 TP0]` prefixes; unprefixed lines (traceback bodies)
    stay with the rank whose line came before them."""
    try:
        lines = server_log.read_text(errors="replace").splitlines(keepends=True)
    except OSError:
        return {}
    by_rank: dict[int, list[str]] = {}
    current: int | None = None
    for line in lines:
        prefix = split_prefix(line)  # `[2026-12-01 02:46:52 PP1 TP0]`, the rule book's grammar
        if prefix is not None and prefix[1]:
            current = (parse_rank_tokens(prefix[1]) or RankId()).flat(tp_size)
        elif line.startswith("["):
            current = None  # the launcher's own lines
        if current is not None:
            by_rank.setdefault(current, []).append(line)
    paths = {}
    for rank, rank_lines in by_rank.items():
        paths[rank] = ev.rank_log(run_dir, rank)
        paths[rank].write_text("".join(rank_lines))
    return paths
