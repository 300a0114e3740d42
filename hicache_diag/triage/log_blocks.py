"""Record a Block of plain SGLang lines (triage.lines) in one tight loop: what the log reader's
fast path records of each (its rank's last line, progress, served requests, the stamp and rank
it holds), up to the first line that needs the full path, where the reader takes over.
tests/unit/triage/test_triage_stream.py checks it agrees with reading line by line."""

from __future__ import annotations

import re
from collections.abc import Callable

from hicache_diag.rules import signatures as sig
from hicache_diag.rules.signatures import Context
from hicache_diag.triage.discover import RankId
from hicache_diag.triage.lines import Block
from hicache_diag.triage.log_model import KEEP_PROGRESS, LogEvidence
from hicache_diag.triage.log_triggers import (
    PROGRESS_HINT,
    SCHEDULER_PROGRESS,
    TRIGGER,
    TRIGGER_STARTS,
    has_hicache_word,
    has_trigger_word,
)

Head = tuple["str | None", "RankId | None", bool]  # stamp, rank, has PP (triage.logs._bracket)
Bracket = Callable[[str], "Head | None"]
# triggered()'s start test, at a position: `msg.lstrip().startswith(TRIGGER_STARTS)`.
_STARTS = re.compile(r"\s*(?:" + "|".join(map(re.escape, TRIGGER_STARTS)) + ")")


def read_block(
    block: Block,
    i: int,
    source: str,
    ctx,  # triage.logs._Ctx: the rank and stamp the reader holds
    ev: LogEvidence,
    last_seen: dict,
    bracket: Bracket,
) -> int:
    """Record block's lines from block.start (stream index i) up to the first that needs the
    full path (a trigger, HiCache words while the context lacks them, a prefix that is not
    one); advance block.start to it and return how many lines were recorded. Each test is the
    one logs._plain makes, on the line from its message's first character (`m`)."""
    raw, start = block.raw, block.start
    trigger, hint = TRIGGER.search, PROGRESS_HINT.search
    starts, progress_re, served_re = _STARTS.match, sig.PROGRESS.search, sig.SERVED.search
    hicache = ev.context.hicache or not block.hicache_words
    last: dict[int, int] = {}  # id(rank) -> its last line in the block
    progress: list[int] = []
    served = 0
    pp = False
    ts = ctx.ts
    k = start
    for line in raw[start:] if start else raw:
        j = line.find("]", 1, 200)
        if j < 0 or (head := bracket(line[1:j])) is None:
            break
        if not hicache and has_hicache_word(line):
            break
        m = j + 2 if line[j + 1 : j + 2].isspace() else j + 1
        if line.startswith(SCHEDULER_PROGRESS, m):
            progress.append(k)
        elif trigger(line, m) or has_trigger_word(line) or starts(line, m):
            break
        elif hint(line, m) and progress_re(line, m):
            progress.append(k)
        elif " HTTP/" in line and served_re(line, m):
            served += 1
        ts = head[0] or ts
        if head[1] is not None:
            last[id(head[1])] = k
        if head[2]:
            pp = True
        k += 1
    if k == start:
        return 0
    block.start = k
    ev.recognised += k - start
    ev.served += served
    if pp and not ev.context.pp:
        ev.context = ev.context | Context(pp=True)

    def msg(n: int) -> str:
        line = block.line(n)
        text = line[line.find("]", 1, 200) + 1 :]
        return text[1:] if text[:1].isspace() else text

    def head_of(n: int) -> Head:
        line = raw[n]
        return bracket(line[1 : line.find("]", 1, 200)])  # type: ignore[return-value]

    def rank_ts(n: int) -> tuple[RankId | None, str | None]:
        """The rank of line n and the stamp the reader held there (the latest one given)."""
        for back in range(n, start - 1, -1):
            if stamp := head_of(back)[0]:
                return head_of(n)[1], stamp
        return head_of(n)[1], ctx.ts

    if ctx.noise_next and any(msg(n) and not msg(n).isspace() for n in range(start, k)):
        ctx.noise_next = False
    for n in last.values():
        rank, stamp = rank_ts(n)
        last_seen[id(rank)] = (rank, stamp, i + n - start + 1, msg(n))
    if progress:
        ev.progress_count += len(progress)
        ev.progress_last[source] = i + progress[-1] - start + 1
        recent = ev.recent_progress
        # What add_progress's trimming (drop the oldest KEEP_PROGRESS past 2 x KEEP_PROGRESS)
        # leaves after these appends, one at a time: the last `keep` of old and new together.
        keep = total = len(recent) + len(progress)
        if total > 2 * KEEP_PROGRESS:
            keep = KEEP_PROGRESS + 1 + (total - KEEP_PROGRESS - 1) % KEEP_PROGRESS
        del recent[: max(0, len(recent) - max(0, keep - len(progress)))]
        for n in progress[-keep:]:
            rank, stamp = rank_ts(n)
            recent.append((rank, stamp, source, i + n - start + 1, msg(n)))
    ctx.rank = head_of(k - 1)[1]
    ctx.ts = ts
    return k - start
