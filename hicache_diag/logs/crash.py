"""Crash forms from log tracebacks: A (shape mismatch), B (bookkeeping), the root vs the cascade."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hicache_diag.logs.parse import LogException
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.signatures import SHAPE_RE, Context


@dataclass(frozen=True, slots=True)
class CrashFinding:
    form: str | None  # "A" | "B" | None
    root: LogException
    secondary: list[LogException]
    evidence: list[str]


def crash_form(exc: LogException, ctx: Context | None = None) -> str | None:
    """The rule book's form for one logged exception in its log's context."""
    here = sig.frames_context(exc.frames, exc.files) | (ctx or Context())
    return sig.crash_form(exc.text, exc.frames, here)


def decode_shape(text: str, num_heads: int | None = None) -> str | None:
    """`shape '[N, -1, D]' is invalid for input of size M`: N = tokens this stage scheduled;
    M / D = upstream tokens x local heads, so with the head count we get the upstream tokens."""
    m = SHAPE_RE.search(text)
    if not m:
        return None
    n, d, size = (int(g) for g in m.groups())
    rows = size // d if d else 0
    line = f"local stage scheduled N={n} tokens; the received hidden states hold M/D={rows} rows"
    if num_heads and rows % num_heads == 0:
        upstream = rows // num_heads
        delta = n - upstream
        return (
            f"{line} = {upstream} upstream tokens x {num_heads} heads (local - upstream = {delta})"
        )
    return f"{line} (= upstream tokens x local heads; pass --num-heads to split them)"


_MISMATCH = re.compile(
    r"collective mismatch|doesn't match expected size|Mismatch between collectives"
)


def mismatch_note(exc: LogException) -> str | None:
    """gloo aborts where NCCL would hang: ranks issued different collective sequences."""
    if not _MISMATCH.search(exc.text):
        return None
    return (
        "gloo detected mismatched collectives: the ranks issued different collective "
        "sequences (a skipped or extra HiCache sync); with NCCL this is a hang (form C)"
    )


def _order_key(exc: LogException) -> tuple[str, int, str, int]:
    # Missing timestamps sort last; within a file, earlier lines first.
    return (exc.ts or "9999", 0, exc.source, exc.lineno)


def find_crash(
    exceptions: list[LogException], num_heads: int | None, ctx: Context | None = None
) -> CrashFinding | None:
    """The first non-cascade, non-timeout exception in time is the root; the rest is secondary."""
    # Ctrl-C / SIGQUIT exits alone say "interrupted", not "crashed"; an abort after a timeout
    # (NCCL's watchdog terminates the process) is the timeout's consequence.
    timed_out = any(e.is_timeout for e in exceptions)
    real = [
        e
        for e in exceptions
        if not e.is_timeout and not e.is_signal_exit and not (timed_out and e.fatal_signal)
    ]
    if not real:
        return None
    # A traceback cut short cannot be judged: a complete one goes first, whatever its stamp.
    roots = sorted(
        (e for e in real if not e.is_cascade), key=lambda e: (e.is_incomplete, *_order_key(e))
    )
    cascades = sorted((e for e in real if e.is_cascade), key=_order_key)
    if cascades and all(e.is_incomplete for e in roots):
        roots = []  # a cut-short traceback beside the cascade may well be more of it
        first = cascades[0]
        note = "only cascade errors (a peer closed the connection): the root crash is elsewhere"
        return CrashFinding(None, first, cascades[1:], [note])
    root, others = roots[0], roots[1:] + cascades
    evidence = [f"first error: {_where(root)}: {root.text}"]
    if decoded := decode_shape(root.text, num_heads):
        evidence.append(decoded)
    if note := mismatch_note(root):
        evidence.append(note)
    for exc in others:
        evidence.append(
            f"secondary ({'cascade' if exc.is_cascade else 'later'}): {_where(exc)}: {exc.text}"
        )
    return CrashFinding(crash_form(root, ctx), root, others, evidence)


def _where(exc: LogException) -> str:
    rank = exc.rank.label if exc.rank else "rank ?"
    thread = f" thread {exc.thread}" if exc.thread else ""
    ts = f" at {exc.ts}" if exc.ts else ""
    return f"{rank}{thread}{ts} ({exc.source}:{exc.lineno})"
