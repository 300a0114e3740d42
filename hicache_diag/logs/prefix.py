"""Learn a per-line prefix nobody listed from the file itself: the fields in front of most
lines (a runner's `<bench>.<node>.nolog [stderr] `, a shipper's `host=gpu-3 seq=000017 | `,
a logging agent's `[severity: ERROR] {"insertId": "9f1c"} `), whatever they are.

The first lines are cut into blank-separated fields; each field's shape keeps its words and
punctuation and lets its figures vary (a time, a counter, a pid, a hex id). The longest run of
leading field shapes that most lines share is the prefix, stopping where the message starts:
at a plain word that is the same on every line (prose, not a field), at a word the rule book
looks for (a trigger), at a collector's prefix we know or SGLang's own label. What the prefix
says is kept: the rank it names (`TP3`, `rank=3`) as a rank label in front of the line.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hicache_diag.evidence.ranks import rank_tokens
from hicache_diag.logs.carriers import ANY_CARRIER, TRACEBACK
from hicache_diag.rules.rank_labels import split_prefix

_FIELD = re.compile(r"\S{1,120}\s{1,8}")
MAX_FIELDS = 12
MAX_PREFIX = 240  # characters: a longer run of shared fields is a message template
MIN_SHARE = 0.5  # of the non-blank lines the prefix must start
LEARN_LINES = 500  # the first non-blank lines it is learned from (a fixed cost per log)
_LEVELS = frozenset(
    "INFO WARNING WARN ERROR DEBUG CRITICAL FATAL NOTICE TRACE DEFAULT ALERT EMERGENCY E I W F D "
    "info warn warning error err debug fatal notice trace stdout stderr".split()
)
# A level or stream name varies from line to line within one field: any of them matches.
_ANY_LEVEL = "(?:" + "|".join(sorted(_LEVELS, key=len, reverse=True)) + ")"
# The start of a message the reader knows, never part of a wrapper.
_MESSAGE_START = re.compile(
    r'^(?:Traceback|File "|Exception|Fatal Python|Thread 0x|Current thread|Process \d'
    r"|terminate called|During handling|The above exception)"
)
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)")


@functools.lru_cache(maxsize=16384)  # a stream's first lines repeat most of their fields
def _shape(field: str, letters: bool = False) -> str:
    """A field's regex: figures (and runs of letters mixed with figures: a hex id) vary, a
    level or stream name is any of them, the rest is kept; with `letters`, a field's words
    vary too (a field that holds punctuation or figures: `node-7.cc`, `pod-abc`)."""
    body = field.rstrip()
    out = []
    for part in re.split(r"([0-9A-Za-z]+)", body):
        if not part:
            continue
        if part.isdigit():
            out.append(r"\d+")
        elif part in _LEVELS:
            out.append(_ANY_LEVEL)
        elif part.isalnum() and (letters or any(c.isdigit() for c in part)):
            out.append(r"[0-9A-Za-z]+")
        else:
            out.append(re.escape(part))
    return "".join(out)


def _skeleton(field: str) -> str:
    """The shape lines are counted by: words vary where the field also holds punctuation or
    figures (a bare word stays itself: it may be the message's first)."""
    body = field.rstrip()
    return _shape(field, letters=not body.isalpha())


def _regex(fields: list[list[str]], k: int) -> str:
    """The prefix regex of the lines' first k fields (all of one skeleton): each field as
    itself where every line has it so, else its skeleton."""
    parts = []
    for j in range(k):
        exact = {_shape(f[j]) for f in fields}
        parts.append(exact.pop() if len(exact) == 1 else _skeleton(fields[0][j]))
    # The blanks after the last field that every line has are the wrapper's; more are the
    # message's own indent (a traceback's code line).
    gap = min(len(f[k - 1]) - len(f[k - 1].rstrip()) for f in fields)
    return r"[ \t]+".join(parts) + rf"[ \t]{{{gap}}}"


def _prose(field: str, shared_by_all: bool) -> bool:
    """A message's word, not a wrapper's field: the same on every line, no level or stream
    name, and nothing a field carries (a figure, a bracket, a separator: `host-3`, `[stderr]`,
    `job=7`); `init_process_group` is a word too."""
    word = field.strip().rstrip(",.")
    if not shared_by_all or word in _LEVELS:
        return False
    return not any(c.isdigit() or c in "[](){}<>|:=@" for c in word)


@dataclass(frozen=True, slots=True)
class LearnedPrefix:
    """A learned prefix: its regex and what the report says of it."""

    pattern: re.Pattern[str]
    fields: int
    share: float  # of the first non-blank lines it starts
    example: str

    def describe(self) -> str:
        return (
            f"stripped a {self.fields}-field prefix nobody listed (`{self.example.strip()}`) "
            f"from {100 * self.share:.0f}% of the first lines"
        )


def _fields(line: str, fields: list[str], need: int) -> None:
    """Cut `line`'s next fields onto `fields` until it holds `need` (or the line ends): the
    loop looks one field further each round, so the message's words are seldom cut."""
    pos = sum(map(len, fields))
    while len(fields) < need and (m := _FIELD.match(line, pos)):
        fields.append(m.group())
        pos = m.end()


def _stops(field: str, rest: str) -> bool:
    """A field the message starts with (`rest`: the line from it on): a traceback's or dump's
    shape, a collector's prefix we know (logs/carriers.py peels it), SGLang's label, a word
    the rule book looks for."""
    from hicache_diag.logs.triggers import triggered  # the triggers import the rule book

    text = field.strip()
    return bool(
        _MESSAGE_START.match(text)
        or (rest[:1] in "[0123456789" and split_prefix(rest) is not None)
        or (rest[:1] != "|" and ANY_CARRIER.match(rest))
        or triggered(text)
        or TRACEBACK in text
    )


def learn_prefix(head: Sequence[str]) -> LearnedPrefix | None:
    """The prefix most of `head`'s lines share, or None. `head`: the first lines, carriers we
    know already peeled."""
    kept = (h for h in head if h.strip() and not ANY_CARRIER.match(h))
    lines = list(itertools.islice(kept, LEARN_LINES))
    if len(lines) < 2:
        return None
    # Each line's fields and their skeletons, a column more per k (the loop stops where the
    # message starts: the fields after it are never cut or shaped).
    split: list[list[str]] = [[] for _ in lines]
    skeletons: list[tuple[str, ...]] = [()] * len(split)
    best: LearnedPrefix | None = None
    for k in range(1, MAX_FIELDS + 1):
        for n, f in enumerate(split):
            if len(f) == k:  # it had k fields last round: one more if the line has it
                _fields(lines[n], f, min(k + 1, MAX_FIELDS))
            elif k == 1:
                _fields(lines[n], f, 2)
            if len(f) > k:
                skeletons[n] = (*skeletons[n], _skeleton(f[k - 1]))
        keys = Counter(sk for f, sk in zip(split, skeletons, strict=True) if len(f) > k)
        if not keys:
            break
        key, count = keys.most_common(1)[0]
        share = count / len(lines)
        if share < MIN_SHARE or count < 2:
            break
        shared = [n for n, f in enumerate(split) if len(f) > k and skeletons[n][:k] == key]
        sample, field = split[shared[0]], split[shared[0]][k - 1]
        at = sum(map(len, sample[: k - 1]))  # where the field starts in its line
        same = all(split[n][k - 1] == field for n in shared)
        rest = lines[shared[0]][at:]
        if _stops(field, rest) or _prose(field, same) or at + len(field) > MAX_PREFIX:
            break
        pattern = _regex([split[n] for n in shared], k)
        best = LearnedPrefix(re.compile(pattern), k, share, "".join(sample[:k]))
    return best


def prefix_label(prefix: str) -> str | None:
    """What a stripped prefix says that the reader keeps: the rank tokens it names (`TP3`,
    `Worker_PP1_TP3`) and its date and time, as SGLang's label; None when it names no rank (a
    global rank, `rank=3`, says nothing of PP and TP; a time alone is not kept: the lines
    would look like a server's)."""
    tokens = rank_tokens(prefix)
    if not tokens:
        return None
    stamp = _STAMP.search(prefix)
    dims = " ".join(f"{k}{v}" for k, v in tokens.items())
    return f"{stamp[1]} {stamp[2]} {dims}" if stamp else dims
