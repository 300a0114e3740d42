"""Classify a cluster from its stack samples and logs into one TriageReport (docs/design.md §5)."""

from __future__ import annotations

from dataclasses import replace

from hicache_diag.evidence.ranks import RankId, is_component_title
from hicache_diag.logs.crash import CrashFinding, find_crash
from hicache_diag.logs.emitters import Emitter
from hicache_diag.logs.parse import LogEvidence, LogException, LogLine
from hicache_diag.logs.teardown import set_aside_teardown
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.engine_stats import engine_stats, idle_line
from hicache_diag.rules.signatures import Context
from hicache_diag.triage.advice import next_steps
from hicache_diag.triage.fates import fate_report, survived, survived_notes, thread_death
from hicache_diag.triage.hang import HangFinding, RankSamples, analyse_rank, classify_stacks
from hicache_diag.triage.report import RankReport, TriageReport, report_for
from hicache_diag.triage.stacks import merge_stacks
from hicache_diag.triage.thin import (
    one_rank_in_p2p,
    peer_wait,
    served_only,
    shape_without_pp,
    stalled_drain,
)


def merge_log_dumps(ranks: list[RankSamples], logs: LogEvidence) -> list[RankSamples]:
    """Add the `Pyspy dump for PID` blocks from logs as samples of their ranks, and every rank
    the logs name, so a log-only triage still lists the cluster."""
    by_rank = {rs.rank: rs for rs in ranks}
    named = [e.rank for e in logs.exceptions] + [ln.rank for ln in logs.hang_lines]
    for rank in named + [ln.rank for ln in logs.progress_lines] + list(logs.ranks_seen):
        if rank is not None and rank not in by_rank:
            by_rank[rank] = RankSamples(rank)
    anon = sum(1 for r in by_rank if not r.known)
    for dump in logs.dumps:
        if is_component_title(dump.title):
            continue  # another SGLang process (DP controller, tokenizer): not a scheduler rank
        if dump.rank is None:  # no title, no prefix: `rank ?`, never an invented PP/TP
            dump.rank, anon = RankId(anon=anon), anon + 1
        rank = dump.rank
        rs = by_rank.setdefault(rank, RankSamples(rank, dump.pid, dump.title))
        rs.dumps.append(dump)
        rs.pid = rs.pid or dump.pid
        rs.title = rs.title or dump.title
    return sorted(by_rank.values(), key=lambda rs: rs.rank.key)


def _hang_came_first(finding: CrashFinding, logs: LogEvidence) -> bool:
    """A watchdog / collective timeout before an error of no known form makes that error a
    consequence of the hang (the watchdog's SIGQUIT, NCCL's abort, peers losing their
    connection). Before: earlier in the same file, or earlier by time stamp across files."""
    hangs = list(logs.hang_lines) + [
        LogLine(e.rank, e.ts, e.source, e.lineno, e.text) for e in logs.exceptions if e.is_timeout
    ]
    if finding.form is not None or not hangs:
        return False
    if finding.root.is_cascade:
        return True
    root = finding.root
    return any(
        ln.lineno < root.lineno
        if ln.source == root.source
        else bool(ln.ts and root.ts and ln.ts < root.ts)
        for ln in hangs
    )


def _silent_rank(logs: LogEvidence) -> RankId | None:
    """The one rank the logs know that neither raised nor complained while its peers report
    the cascade (`Connection reset by peer`): it died without a word (killed, OOM, segfault)."""
    complained = {ln.rank for ln in logs.cascade_lines} | {e.rank for e in logs.exceptions}
    if not complained - {None}:
        return None
    silent = [r for r in logs.ranks_seen if r not in complained]
    return silent[0] if len(silent) == 1 else None


def _handled(exc: LogException, logs: LogEvidence) -> bool:
    """An error the launcher / HTTP / tokenizer process logged (no rank, not a scheduler's
    death, no signal) after which the server went on serving: handled, not the crash."""
    if exc.rank is not None or exc.scheduler or exc.fatal_signal or exc.is_timeout:
        return False
    return logs.progress_last.get(exc.source, 0) > exc.lineno


def _mark_crashed(logs: LogEvidence, reports: list[RankReport]) -> None:
    for r in reports:
        crashed = [e for e in logs.exceptions if e.rank == r.rank and not e.is_timeout]
        if crashed and r.wait_site is None:
            r.state, r.error = "crashed", crashed[0].text


def _crash_signature(root, culprit: RankReport | None) -> tuple[str, str]:
    """(signature, confidence): a cascade alone is medium; a silent rank is named."""
    if root.is_cascade and culprit is not None:
        label = culprit.rank.label
        return f"{label} went silent (no traceback): killed, OOM or a signal", "medium"
    return root.text, "medium" if root.is_cascade else "high"


def _crash_report(
    logs: LogEvidence,
    reports: list[RankReport],
    num_heads: int | None,
    hang_declared: bool = False,
):
    excs = [
        e
        for e in logs.exceptions
        if not e.is_thread_death and not _handled(e, logs) and not survived(e)
    ]
    finding = find_crash(excs, num_heads, logs.context)
    if finding is None or _hang_came_first(finding, logs):
        return None
    if hang_declared and finding.root.is_cascade:
        return None  # a peer lost while the run's own watch reaped the hung ranks: teardown
    root = finding.root
    culprit = None if root.is_cascade else report_for(root.rank, reports)
    evidence = list(finding.evidence)
    if root.is_cascade and (silent := _silent_rank(logs)) is not None:
        culprit = report_for(silent, reports)
        culprit.state = "exited"
        evidence = [
            f"{silent.label} went silent while its peers report the cascade (connection "
            "closed / reset by peer): it is the rank that died (killed, OOM, a signal)",
            *(e.replace("secondary (cascade)", "cascade") for e in evidence[1:]),
            f"first cascade error: {root.text}",
        ]
    _mark_crashed(logs, reports)
    signature, confidence = _crash_signature(root, culprit)
    if finding.form is None and (conditional := shape_without_pp(root, num_heads)):
        evidence += conditional
        confidence = "medium"
    return TriageReport(
        "crash",
        form=finding.form,
        culprit=culprit,
        ranks=reports,
        evidence=evidence,
        signature=signature,
        confidence=confidence,
        emitter=root.attribution.label,
    )


def _from_hang(finding: HangFinding, reports: list[RankReport]) -> TriageReport:
    if finding.kind == "crash":  # a rank exited while its peers live (rules/culprit.py)
        culprit = finding.culprits[0]
        return TriageReport("crash", culprit=culprit, ranks=reports, evidence=finding.evidence)
    if finding.kind == "hang":
        for r in reports:  # ranks waiting for requests are victims of the hang, not idle
            if r.state == "idle":
                r.state = "blocked"
    culprit = finding.culprits[0] if finding.culprits else None
    report = TriageReport(
        finding.kind,
        form="C" if finding.kind == "hang" else None,
        cause=finding.cause,
        culprit=culprit,
        ranks=reports,
        evidence=list(finding.evidence),
        signature=culprit.wait_site if culprit else None,
    )
    if len(finding.culprits) > 1:
        labels = ", ".join(r.rank.label for r in finding.culprits)
        report.evidence.append(f"ranks at the same culprit site: {labels}")
    return report


_SCHED = Emitter.SCHEDULER.value


def _logged_hang(logs: LogEvidence, reports: list[RankReport]) -> TriageReport | None:
    """A timeout or the watchdog's own output in the logs: a hang, with no stacks."""
    timeouts = [e for e in logs.exceptions if e.is_timeout]
    if not (logs.hang_signal or timeouts):
        return None
    if timeouts and not logs.hang_lines:
        t = timeouts[0]
        first = LogLine(t.rank, t.ts, t.source, t.lineno, t.text)
    else:
        first = (logs.hang_lines or logs.debug_lines)[0]
    ev = [f"{first.source}:{first.lineno}: {first.text}"]
    if not logs.hang_lines and logs.watchdog_fired:
        ev.append("the scheduler watchdog's own output (its debug block, dump or thread): it fired")
    ev.append("no stacks: run triage live (--discover) or pass the py-spy dumps to name the site")
    return TriageReport(
        "hang",
        form="C",
        ranks=reports,
        evidence=ev,
        signature=first.text,
        confidence="medium",
        emitter=Emitter.SCHEDULER.value,
    )


def _logs_only(logs: LogEvidence, reports: list[RankReport]) -> TriageReport:
    if report := _logged_hang(logs, reports):
        return report
    if report := stalled_drain(logs, reports) or peer_wait(logs, reports):
        return report
    progress = logs.progress_lines
    if logs.soft_lines and not progress:
        first = logs.soft_lines[0]
        ev = [
            f"{first.source}:{first.lineno}: {first.text}",
            "a soft watchdog (or another component's) only reports a slow step; it is not a "
            "scheduler hang",
        ]
        return TriageReport("unknown", ranks=reports, evidence=ev, reason="soft watchdog only")
    if progress and not idle_line(progress[-1].text):
        last = progress[-1]
        ev = [f"{logs.progress_count} progress lines, last: {last.text}"]
        if stats := engine_stats(last.text):
            ev.append(f"the engine's own stats say busy: {stats.describe()}")
        return TriageReport("busy", ranks=reports, evidence=ev, confidence="medium", emitter=_SCHED)
    if progress:
        ev = ["the server is up and idle"]
        if stats := engine_stats(progress[-1].text):
            ev.append(f"the engine's own stats say idle: {stats.describe()}")
        return TriageReport("healthy", ranks=reports, evidence=ev, emitter=_SCHED)
    if report := served_only(logs, reports):
        return report
    if notes := survived_notes(logs):  # only errors the server survived, or a client's
        first = next(e for e in logs.exceptions if survived(e))
        return TriageReport(
            "unknown", ranks=reports, reason=notes[0], emitter=first.attribution.label
        )
    return TriageReport("unknown", ranks=reports, reason="no traceback, timeout or stack found")


def classify(
    ranks: list[RankSamples],
    logs: LogEvidence | None = None,
    *,
    num_heads: int | None = None,
    pp_size: int | None = None,
    hang_declared: bool = False,
) -> TriageReport:
    """Crash (a traceback) first, then hang vs busy from the stacks, then what logs alone say.
    Errors after a stop from outside are set aside as its teardown first. `pp_size`: the
    deployment's PP size when the caller knows it (the text may not show PP); `hang_declared`:
    a run directory's launcher.json records a hang (the run's own watch declared it)."""
    logs = replace(logs) if logs else LogEvidence()  # a copy: the teardown split edits it
    teardown = set_aside_teardown(logs)
    if pp_size and pp_size > 1:
        logs.context = logs.context | Context(pp=True)
    ranks = merge_log_dumps(ranks, logs)
    known = [rs.rank for rs in ranks if rs.rank.known]
    pp_size = max((r.pp for r in known), default=0) + 1
    tp_size = max((r.tp for r in known), default=0) + 1
    reports = [analyse_rank(rs, pp_size, tp_size) for rs in ranks]
    hang_hint = hang_declared or logs.hang_signal or any(e.is_timeout for e in logs.exceptions)
    report = _decide(logs, ranks, reports, hang_hint, num_heads, hang_declared)
    report.evidence += teardown.evidence
    report.framing = list(logs.framing)
    _annotate(report, logs, ranks, reports)
    return report


def _decide(
    logs: LogEvidence,
    ranks: list[RankSamples],
    reports: list[RankReport],
    hang_hint: bool,
    num_heads: int | None,
    hang_declared: bool = False,
) -> TriageReport:
    """The verdict: a thread's death, a crash, a stopped rank, the stacks, then logs alone."""
    report = (
        thread_death(logs, reports, hang_hint)
        or _crash_report(logs, reports, num_heads, hang_declared)
        or fate_report(logs, ranks, reports, hang_hint)
    )
    if report is None and (finding := classify_stacks(reports, hang_hint)) is not None:
        report = _from_hang(finding, reports)
        report = _one_rank_only(report, reports, hang_hint)
        if report.kind == "unknown" and not hang_hint:
            report = one_rank_in_p2p(reports) or report
        if report.kind == "hang" and logs.hang_lines:
            first = logs.hang_lines[0]
            report.evidence.append(f"log: {first.source}:{first.lineno}: {first.text}")
        report.emitter = report.emitter or Emitter.SCHEDULER.value  # the stacks' processes
    return report or _logs_only(logs, reports)


def _annotate(
    report: TriageReport, logs: LogEvidence, ranks: list[RankSamples], reports: list[RankReport]
) -> None:
    """Notes, the stack tree and next steps on a decided report."""
    report.evidence += logs.notes + survived_notes(logs)
    report.evidence += _watchdog_notes(logs, report)
    report.evidence += [
        f"ignored the dump of {d.title.split()[0]} (pid {d.pid}): not a scheduler"
        for d in logs.dumps
        if is_component_title(d.title)
    ]
    if report.kind == "unknown" and (errors := [r for r in reports if r.error]):
        report.reason = "; ".join(f"{r.rank.label} (pid {r.pid}): {r.error}" for r in errors)
    report.stack_tree = merge_stacks(rs.native or rs.dumps[-1] for rs in ranks if rs.dumps)
    report.samples = max((len(rs.dumps) for rs in ranks), default=0)
    sites = {r.wait_site for r in report.ranks if r.wait_site}
    common = next(iter(sites)) if len(sites) == 1 else None
    site = report.culprit.wait_site if report.culprit else common
    ctx = logs.context | _stack_context(ranks)
    report.next_steps = report.next_steps or next_steps(
        report.kind, report.form, report.cause, site, ctx
    )
    report.ranks.sort(key=lambda r: r.rank.key)


def _one_rank_only(report: TriageReport, reports: list[RankReport], hang: bool) -> TriageReport:
    """A symmetric wait needs every rank's stack: one rank alone cannot show it."""
    if report.cause != "network-suspect" or sum(1 for r in reports if r.wait_site) > 1:
        return report
    note = (
        "insufficient evidence: only one rank's stack; a network fault shows as every rank "
        "in the same call, which needs the peers' stacks too"
    )
    if not hang:
        return TriageReport("unknown", ranks=reports, evidence=[note], reason=note)
    report.cause = None
    report.evidence = [note, *report.evidence[1:]]
    return report


def _watchdog_notes(logs: LogEvidence, report: TriageReport) -> list[str]:
    """SGLang's watchdog fires in the rank that waits, which need not be the culprit."""
    fired = [ln for ln in logs.hang_lines if sig.watchdog_kind(ln.text) == "scheduler"]
    if not fired or report.kind != "hang":
        return []
    ranks = sorted({ln.rank.label for ln in fired if ln.rank}) or ["a rank"]
    return [
        f"SGLang's watchdog fired on {', '.join(ranks)}: the rank(s) that waited, not "
        "necessarily the culprit"
    ]


def _stack_context(ranks: list[RankSamples]) -> Context:
    ctx = Context()
    for rs in ranks:
        for dump in rs.dumps[-1:]:
            for thread in dump.threads:
                frames = [f.name for f in thread.frames]
                ctx = ctx | sig.frames_context(frames, [f.filename for f in thread.frames])
    return ctx
