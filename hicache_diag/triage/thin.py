"""Honest answers when the evidence is thin: what the text does support, how sure that is,
and the one command that would settle it."""

from __future__ import annotations

from hicache_diag.logs.crash import decode_shape
from hicache_diag.logs.emitters import Emitter
from hicache_diag.logs.model import LogEvidence, LogException, LogLine
from hicache_diag.rules.signatures import SHAPE_RE
from hicache_diag.triage.fates import survived
from hicache_diag.triage.report import RankReport, TriageReport

LIVE_STACKS = (
    "take every rank's stack at once, twice: `hicache-diag triage --discover --samples 3 "
    "--interval 2` on each serving host (or `py-spy dump --pid PID` of every "
    "sglang::scheduler* process)"
)
# Directional waits: the peer they wait for is one stage away.
_SENDS = frozenset({"pp-send", "p2p-send", "hicache-pp-sync-send", "hicache-pp-sync-drain"})
_RECVS = frozenset({"pp-output-recv", "pp-proxy-recv", "p2p-recv", "hicache-pp-sync-recv"})


def served_only(logs: LogEvidence, reports: list[RankReport]) -> TriageReport | None:
    """Nothing but answered HTTP requests: a server that serves, said with low confidence
    (a health check is answered during a hang too)."""
    errors = [e for e in logs.exceptions if not survived(e)]  # a handler's error: it served
    if not logs.served or errors or logs.hang_signal or logs.progress_count:
        return None
    ev = [
        f"{logs.served} HTTP request(s) answered with 2xx/3xx and no error, timeout or "
        "watchdog line: the server serves",
        "thin evidence: access lines only; a hang shows as a watchdog timeout or stacks",
    ]
    report = TriageReport(
        "healthy", ranks=reports, evidence=ev, confidence="low", emitter=Emitter.HTTP.value
    )
    report.next_steps = [f"if requests do stall, {LIVE_STACKS}"]
    return report


def peer_wait(logs: LogEvidence, reports: list[RankReport]) -> TriageReport | None:
    """A worker that says it waited past a limit on its peers or driver (vLLM's `No available
    shared memory broadcast block found in 60 seconds`), with no batch after its last word: a
    wait that did not end, i.e. a hang (a peer hangs, or works very long: compilation). With a
    batch after it, the wait ended and the batches decide."""
    if not logs.wait_lines:
        return None
    last_wait = logs.wait_lines[-1]
    progress = _last_progress(logs)
    if progress is not None and _after(progress, last_wait):
        return None
    first = logs.wait_lines[0]
    ev = [
        f"{first.source}:{first.lineno}: {first.text}",
        f"{len(logs.wait_lines)} such wait report(s), the last at {last_wait.source}:"
        f"{last_wait.lineno}, and no batch after it: the worker is still waiting on a peer "
        "(a hang), unless a peer is compiling or quantising for that long",
        "a wait, not a crash: no process died",
    ]
    report = TriageReport(
        "hang",
        form="C",
        ranks=reports,
        evidence=ev,
        signature=first.text,
        confidence="low",
        emitter=Emitter.SCHEDULER.value,
    )
    report.next_steps = [f"to see what each worker waits for, {LIVE_STACKS}"]
    return report


def stalled_drain(logs: LogEvidence, reports: list[RankReport]) -> TriageReport | None:
    """The operator stopped a server that had stopped making progress: after its last batch
    line, SGLang's drain reported the same requests in flight three times in a row (>= 10 s,
    one report each 5 s) and none finished. A hang ended by the stop, said with low confidence
    (no stacks, no watchdog); a busy server's drain runs batches between its reports."""
    last = _last_progress(logs)
    run: list[LogLine] = []
    for line in logs.drain_reports:
        if run and (line.text != run[0].text or line.source != run[0].source):
            run = []
        if last is None or _after(line, last):
            run.append(line)
        if len(run) >= 3:
            break
    if len(run) < 3:
        return None
    first = run[0]
    ev = [
        f"{first.source}:{first.lineno}: {first.text}",
        f"the operator's stop found requests in flight; the drain reported the same ones "
        f"{len(run)} times ({first.ts or '?'} to {run[-1].ts or '?'}) and "
        + (
            f"no batch ran after {last.source}:{last.lineno} ({last.ts})"
            if last
            else "no batch line is in the log"
        )
        + ": the server had stopped making progress before it was stopped (a hang)",
        "thin evidence: no watchdog line and no stacks; the ranks' stacks name the site",
    ]
    report = TriageReport(
        "hang",
        form="C",
        ranks=reports,
        evidence=ev,
        signature=first.text,
        confidence="low",
        emitter=Emitter.SCHEDULER.value,
    )
    report.next_steps = [f"before stopping a stalled server, {LIVE_STACKS}"]
    return report


def _last_progress(logs: LogEvidence) -> LogLine | None:
    """The latest batch line over every file (by stamp where both have one)."""
    lines = logs.progress_lines
    stamped = [ln for ln in lines if ln.ts]
    if stamped and len(stamped) == len(lines):
        return max(stamped, key=lambda ln: ln.ts or "")
    return lines[-1] if lines else None


def _after(line: LogLine, progress: LogLine) -> bool:
    if line.ts and progress.ts and len(line.ts) == len(progress.ts):
        return line.ts > progress.ts
    return line.source == progress.source and line.lineno > progress.lineno


def one_rank_in_p2p(reports: list[RankReport]) -> TriageReport | None:
    """One rank's stack, blocked in a PP send or receive: likely a hang, but only the peer's
    stack can show it (a send blocks until that peer receives)."""
    stacked = [r for r in reports if r.wait_site]
    if len(stacked) != 1 or stacked[0].state != "blocked":
        return None
    only = stacked[0]
    if only.wait_site in _SENDS:
        peer, verb = only.rank.pp + 1, "sends to"
    elif only.wait_site in _RECVS and only.rank.pp > 0:
        peer, verb = only.rank.pp - 1, "receives from"
    else:
        return None
    label = only.rank.label
    peer_label = label.replace(f"PP{only.rank.pp}", f"PP{peer}")
    ev = [
        f"likely a hang: {label} is blocked in {only.wait_site} ({only.site_frame or '?'}); "
        f"it {verb} PP{peer}, whose stack is not here",
        "thin evidence: one rank's stack cannot tell a wedge from a slow peer",
    ]
    report = TriageReport(
        "hang", form="C", ranks=reports, evidence=ev, signature=only.wait_site, confidence="low"
    )
    report.next_steps = [
        f"the peer's stack is needed: `py-spy dump --pid PID` of sglang::scheduler_"
        f"{peer_label.replace(' ', '_')} (same instant), or {LIVE_STACKS}",
    ]
    return report


def shape_without_pp(root: LogException, num_heads: int | None) -> list[str]:
    """A `view()` shape error with no PP in sight is form A only if the deployment runs PP:
    say so, with the arithmetic, and how to tell triage."""
    if not SHAPE_RE.search(root.text):
        return []
    decoded = decode_shape(root.text, num_heads) or ""
    return [
        "no sign of PP in the text: if this deployment runs pipeline parallelism "
        f"(--pp-size > 1), this is form A (a stage got another token count): {decoded}",
        "rerun triage with --pp N to say the deployment runs PP",
    ]
