"""The literal words a regular expression cannot match without: the log reader's fast path skips
every line that holds none of its signatures' words (logs/triggers.py), so each signature's
words are derived from its pattern here, never listed by hand beside it.

`required_words(pattern)` gives one word per top-level alternative (`a|b` needs a word for `a`
and one for `b`): the longest run of literal characters that every match of that alternative
contains. A pattern with an alternative that has no such run of MIN_WORD characters, or that
ignores case, has no word a substring test could find: `required_words` raises, so a signature
the fast path would skip cannot be written (tests/unit/rules/test_signature_triggers.py).
"""

from __future__ import annotations

import re
import re._constants as C  # noqa: N812 - sre's opcode names
import re._parser as P  # noqa: N812

MIN_WORD = 3
# Zero-width items do not break a run of literals (`(?<!\w)Watchdog`).
_ZERO_WIDTH = (C.AT, C.ASSERT, C.ASSERT_NOT)


class NoTriggerWord(ValueError):
    """A signature pattern with an alternative no literal word is required in."""


def _runs(items) -> list[str]:
    """Every literal run a sequence of sre items is sure to contain, the longest first."""
    runs: list[str] = []
    current = ""
    for op, av in items:
        if op is C.LITERAL:
            current += chr(av)
            continue
        if op in _ZERO_WIDTH:
            continue
        runs.append(current)
        current = ""
        if op is C.SUBPATTERN:
            body = av[-1]
            if not any(o is C.BRANCH for o, _ in body.data):
                runs += _runs(body.data)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT) and av[0] >= 1:
            runs += _runs(av[2].data)
        elif op is C.ATOMIC_GROUP:
            runs += _runs(av.data)
    runs.append(current)
    return sorted((r for r in runs if r), key=len, reverse=True)


def _alternatives(data) -> list:
    """The top-level alternatives of a parsed sequence (itself when it has no top-level `|`);
    a group around an alternation is opened, so `(?P<a>x|y)|z` gives x, y and z."""
    while len(data) == 1 and data[0][0] is C.SUBPATTERN:
        data = data[0][1][-1].data
    if len(data) == 1 and data[0][0] is C.BRANCH:
        return [alt for branch in data[0][1][1] for alt in _alternatives(branch.data)]
    return [data]


def required_words(pattern: re.Pattern[str]) -> tuple[str, ...]:
    """One literal word per top-level alternative that every match of it contains."""
    if pattern.flags & re.IGNORECASE:
        raise NoTriggerWord(f"{pattern.pattern!r} ignores case: no substring test finds it")
    words = []
    for alternative in _alternatives(P.parse(pattern.pattern, pattern.flags).data):
        runs = [r.strip() for r in _runs(alternative)]
        # A capitalised word first (the fast path scans for those in one regex), else the
        # longest.
        capital = [r for r in runs if len(r) >= MIN_WORD and r[0].isupper()]
        best = capital[0] if capital else (runs[0] if runs else "")
        if len(best) < MIN_WORD:
            raise NoTriggerWord(f"{pattern.pattern!r}: an alternative requires no literal word")
        words.append(best)
    return tuple(words)
