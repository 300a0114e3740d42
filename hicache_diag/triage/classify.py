"""Classify a cluster from its stack samples and logs into one TriageReport (DESIGN §5)."""

from __future__ import annotations

from hicache_diag.triage.advice import next_steps
from hicache_diag.triage.crash import CrashFinding, find_crash
from hicache_diag.triage.discover import RankId
from hicache_diag.triage.hang import HangFinding, RankSamples, analyse_rank, classify_stacks
from hicache_diag.triage.logs import LogEvidence
from hicache_diag.triage.report import RankReport, TriageReport
from hicache_diag.triage.stacks import merge_stacks


def merge_log_dumps(ranks: list[RankSamples], logs: LogEvidence) -> list[RankSamples]:
    """Add the `Pyspy dump for PID` blocks from logs as samples of their ranks, and every rank
    the logs name, so a log-only triage still lists the cluster."""
    by_rank = {rs.rank: rs for rs in ranks}
    named = [e.rank for e in logs.exceptions] + [ln.rank for ln in logs.hang_lines]
    for rank in named + [ln.rank for ln in logs.progress_lines]:
        if rank is not None and rank not in by_rank:
            by_rank[rank] = RankSamples(rank)
    for dump in logs.dumps:
        rank = dump.rank or RankId()
        rs = by_rank.setdefault(rank, RankSamples(rank, dump.pid, dump.title))
        rs.dumps.append(dump)
        rs.pid = rs.pid or dump.pid
        rs.title = rs.title or dump.title
    return sorted(by_rank.values(), key=lambda rs: rs.rank.key)


def _hang_came_first(finding: CrashFinding, logs: LogEvidence) -> bool:
    """A watchdog / collective timeout before an error of no known form makes that error a
    consequence of the hang (the watchdog's SIGQUIT, peers losing their connection)."""
    stamps = [ln.ts for ln in logs.hang_lines] + [e.ts for e in logs.exceptions if e.is_timeout]
    if finding.form is not None or not stamps:
        return False
    if finding.root.is_cascade:
        return True
    known = [t for t in stamps if t]
    return bool(known and finding.root.ts and min(known) < finding.root.ts)


def _crash_report(logs: LogEvidence, reports: list[RankReport], num_heads: int | None):
    finding = find_crash(logs.exceptions, num_heads)
    if finding is None or _hang_came_first(finding, logs):
        return None
    root = finding.root
    culprit = next((r for r in reports if root.rank and r.rank == root.rank), None)
    if culprit is None and root.rank is not None:
        culprit = RankReport(root.rank, None, None, "?", "crashed", None)
        reports.append(culprit)
    for r in reports:
        crashed = [e for e in logs.exceptions if e.rank == r.rank and not e.is_timeout]
        if crashed and r.wait_site is None:
            r.state, r.error = "crashed", crashed[0].text
    return TriageReport(
        "crash",
        form=finding.form,
        culprit=culprit,
        ranks=reports,
        evidence=finding.evidence,
        signature=root.text,
    )


def _exited_report(reports: list[RankReport]) -> TriageReport | None:
    gone = [r for r in reports if r.state == "exited"]
    if not gone or len(gone) == len(reports):
        return None
    ev = [f"{r.rank.label} (pid {r.pid}) has exited; its peers are still alive" for r in gone]
    return TriageReport("crash", culprit=gone[0], ranks=reports, evidence=ev)


def _from_hang(finding: HangFinding, reports: list[RankReport]) -> TriageReport:
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


_READY = "The server is fired up"


def _logs_only(logs: LogEvidence, reports: list[RankReport]) -> TriageReport:
    if logs.hang_lines:
        first = logs.hang_lines[0]
        ev = [f"{first.source}:{first.lineno}: {first.text}"]
        ev.append(
            "no stacks: run triage live (--discover) or pass the py-spy dumps to name the site"
        )
        return TriageReport("hang", form="C", ranks=reports, evidence=ev, signature=first.text)
    if logs.progress_lines and not logs.progress_lines[-1].text.startswith(_READY):
        last = logs.progress_lines[-1]
        ev = [f"{len(logs.progress_lines)} batch lines, last: {last.text}"]
        return TriageReport("busy", ranks=reports, evidence=ev)
    if logs.progress_lines:
        return TriageReport("healthy", ranks=reports, evidence=["the server is up and idle"])
    return TriageReport("unknown", ranks=reports, reason="no traceback, timeout or stack found")


def classify(
    ranks: list[RankSamples],
    logs: LogEvidence | None = None,
    *,
    num_heads: int | None = None,
) -> TriageReport:
    """Crash (a traceback) first, then hang vs busy from the stacks, then what logs alone say."""
    logs = logs or LogEvidence()
    ranks = merge_log_dumps(ranks, logs)
    pp_size = max((rs.rank.pp for rs in ranks), default=0) + 1
    tp_size = max((rs.rank.tp for rs in ranks), default=0) + 1
    reports = [analyse_rank(rs, pp_size, tp_size) for rs in ranks]
    hang_hint = bool(logs.hang_lines) or any(e.is_timeout for e in logs.exceptions)
    report = _crash_report(logs, reports, num_heads)
    if report is None and (finding := classify_stacks(reports, hang_hint)) is not None:
        report = _exited_report(reports) or _from_hang(finding, reports)
        if report.kind == "hang" and logs.hang_lines:
            first = logs.hang_lines[0]
            report.evidence.append(f"log: {first.source}:{first.lineno}: {first.text}")
    if report is None:
        report = _exited_report(reports) or _logs_only(logs, reports)
    if report.kind == "unknown" and (errors := [r for r in reports if r.error]):
        report.reason = "; ".join(f"{r.rank.label} (pid {r.pid}): {r.error}" for r in errors)
    report.stack_tree = merge_stacks(rs.native or rs.dumps[-1] for rs in ranks if rs.dumps)
    report.samples = max((len(rs.dumps) for rs in ranks), default=0)
    sites = {r.wait_site for r in report.ranks if r.wait_site}
    common = next(iter(sites)) if len(sites) == 1 else None
    site = report.culprit.wait_site if report.culprit else common
    report.next_steps = next_steps(report.kind, report.form, report.cause, site)
    report.ranks.sort(key=lambda r: r.rank.key)
    return report
