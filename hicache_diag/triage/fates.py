"""What died, and whose death it is: a scheduler's background thread, a rank py-spy found
stopped or gone, and the errors of emitters that survived them (a request handler, a client)
that are evidence, never the crash (triage.emitters says who printed each)."""

from __future__ import annotations

from hicache_diag.evidence.ranks import RankId
from hicache_diag.logs.crash import crash_form
from hicache_diag.logs.emitters import Emitter
from hicache_diag.logs.model import LogEvidence, LogException
from hicache_diag.rules.process_fate import pyspy_fate
from hicache_diag.rules.rank_fate import RankFate
from hicache_diag.triage.hang import RankSamples, classify_stacks
from hicache_diag.triage.report import RankReport, TriageReport, report_for


def survived(exc: LogException) -> bool:
    """An error the server answered and served on (a request handler's), or a client's: never
    the server's crash. A fatal signal or a timeout is judged as such whoever printed it."""
    return exc.attribution.survived and not exc.fatal_signal and not exc.is_timeout


def survived_notes(logs: LogEvidence) -> list[str]:
    """One line per emitter whose errors were set aside, naming the first."""
    notes: dict[Emitter, str] = {}
    for exc in logs.exceptions:
        if survived(exc) and (who := exc.attribution.emitter) not in notes:
            where = f"{exc.source}:{exc.lineno}"
            if who is Emitter.CLIENT:
                notes[who] = (
                    f"a client program's error ({where}: {exc.text}): the client failed, not "
                    "the server"
                )
            else:
                notes[who] = (
                    f"a request handler's error the HTTP server answered and survived ({where}: "
                    f"{exc.text}): evidence at the request level, not a crash"
                )
    return list(notes.values())


def thread_death(logs: LogEvidence, reports: list[RankReport], hang: bool) -> TriageReport | None:
    """`Exception in thread X (..._func)`: the thread is dead, the process lives on and its
    scheduler waits for what that thread no longer delivers. Its header alone (the traceback
    cut off) still names the thread and what it stops."""
    dead = [
        e for e in logs.exceptions if e.is_thread_death and not e.is_cascade and not survived(e)
    ]
    others = [
        e
        for e in logs.exceptions
        if not e.is_thread_death and not e.is_signal_exit and not survived(e)
    ]
    if not dead or any(not e.is_cascade and not e.is_timeout for e in others):
        return None
    first = dead[0]
    who = first.attribution
    culprit = report_for(first.rank, reports)
    where = first.rank.label if first.rank else "rank ?"
    what = "its traceback cut off" if first.is_incomplete else first.text
    ev = [
        f"thread {first.thread} died on {where}: {what} ({first.source}:{first.lineno})",
        "an exception in a thread ends that thread, not the process: the scheduler lives on "
        "and waits for what the thread no longer delivers",
    ]
    if stops := who.stops():
        ev.append(f"{who.label}: {stops}")
    kind, form = "crash", crash_form(first, logs.context)
    if hang:
        ev.append("the logs report the wait timing out: the dead thread is the hang's cause")
        kind, form = "hang", "C"
    else:
        ev.append("expect the scheduler to hang next (a watchdog timeout) unless it is restarted")
    sign = f"thread {first.thread} died ({what})" if first.is_incomplete else first.text
    return TriageReport(
        kind,
        form=form,
        culprit=culprit,
        ranks=reports,
        evidence=ev,
        signature=sign,
        emitter=who.label,
    )


_SUSPEND = (
    "a process py-spy cannot suspend is stopped (SIGSTOP, a debugger) or stuck in the kernel "
    "(D state); its peers wait for it"
)


def fate_report(
    logs: LogEvidence, ranks: list[RankSamples], reports: list[RankReport], hang: bool
) -> TriageReport | None:
    """py-spy's own words about a rank it could not read (stopped, gone) are facts about that
    rank, given to the one culprit rule (rules/culprit.py) with the stacks."""
    facts = _pyspy_facts(logs, ranks, reports)
    if not facts:
        return None
    for rank, pid, reason, fate in facts:
        r = report_for(rank, reports)
        r.pid, r.fate, r.error = r.pid or pid, fate, reason[:200]
        stopped = fate is RankFate.STOPPED
        r.state, r.wait_site = ("blocked", "unreadable") if stopped else ("exited", None)
    finding = classify_stacks(reports, hang)
    if finding is None or finding.kind not in ("hang", "crash") or not finding.culprits:
        return None
    culprit = finding.culprits[0]
    rank, pid, reason, fate = next(f for f in facts if f[0] == culprit.rank)
    ev = [f"py-spy could not read {rank.label} (pid {pid}): {reason[:120]}"]
    if fate is RankFate.STOPPED:
        ev.append(_SUSPEND)
        sign = "unreadable (py-spy could not suspend it)"
        return TriageReport(
            "hang",
            "C",
            "straggler",
            culprit,
            reports,
            evidence=ev,
            signature=sign,
            emitter=Emitter.SCHEDULER.value,
        )
    ev.append(f"py-spy found no process: {rank.label} has exited while its peers live")
    sign = f"{rank.label} exited (py-spy: no such process)"
    return TriageReport(
        "crash",
        culprit=culprit,
        ranks=reports,
        evidence=ev,
        signature=sign,
        confidence="medium",
        emitter=Emitter.SCHEDULER.value,
    )


def _pyspy_facts(
    logs: LogEvidence, ranks: list[RankSamples], reports: list[RankReport]
) -> list[tuple[RankId, int | None, str, RankFate]]:
    """(rank, pid, py-spy's words, fate) for each rank py-spy's failure says is stopped or gone."""
    found: list[tuple[RankId | None, int | None, str, RankFate]] = [
        (f.rank, f.pid, f.reason, f.fate) for f in logs.pyspy_failures if f.fate is not None
    ]
    # Live or saved, py-spy's words say the same of the rank; a rank whose fate a process fact
    # already gave (the kernel's state T, read from /proc) is the culprit rule's, with the stacks.
    for rs in ranks:
        if rs.fate is not RankFate.ALIVE or rs.dumps or not rs.error:
            continue
        if (fate := pyspy_fate(rs.error)) is not None:
            found.append((rs.rank, rs.pid, rs.error, fate))
    dumped = {rs.rank for rs in ranks if rs.dumps}
    facts = []
    for rank, pid, reason, fate in found:
        if rank is None or rank in dumped:
            # SGLang's parent dumps its children by pid: the rank is the one with no stack.
            missing = [r.rank for r in reports if r.rank not in dumped and r.rank.known]
            rank = missing[0] if len(missing) == 1 else RankId(anon=0)
        if all(rank != f[0] for f in facts):
            facts.append((rank, pid, reason, fate))
    return facts
