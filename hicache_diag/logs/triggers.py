"""Which log lines the full reader needs: the fast path's one test (`triggered`). A line with
none of these is plain text, progress or an access line; triage.logs records it without
running every handler on it."""

from __future__ import annotations

import re
from collections.abc import Callable

from hicache_diag.logs.emitters import HEADER
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.literals import required_words
from hicache_diag.rules.process_fate import FATE_SIGNATURES

# The words of the reader's own handlers (logs/parse.py, logs/dumps.py): a traceback, a bare
# exception line, a dump, an abort, an announcing header. All start with a capital, so the scan
# stops at few positions.
HANDLER_WORDS = (
    "Traceback",
    'File "',
    "Ignore import",
    "Pyspy",
    "Error",
    "Exception",
    "SIG",
    "Signal",
    "Term",
    "NCCL",
    "Killed",
    "ProcessGroup",
)


# Lower-case words the handlers need in any case (`watchdog`, `py-spy`).
_LOWER_WORDS = ("atchdog", "yspy")


def _signature_words() -> tuple[str, ...]:
    """Every word the rule book's line signatures require (rules.literals): one source, so a
    signature the fast path would skip cannot exist."""
    words: list[str] = []
    for pattern in (*sig.LINE_SIGNATURES, *FATE_SIGNATURES, HEADER):
        words += [w for w in required_words(pattern) if w not in words]
    # A word that holds another is found by the other's test already.
    found = HANDLER_WORDS + tuple(_LOWER_WORDS)
    return tuple(w for w in words if not any(o != w and o in w for o in (*found, *words)))


SIGNATURE_WORDS = _signature_words()
# Capitalised words go into one regex, grouped by first letter; the rest are substring tests.
TRIGGERS = HANDLER_WORDS + tuple(w for w in SIGNATURE_WORDS if w[0].isupper())


def _by_first_letter(words: tuple[str, ...]) -> re.Pattern[str]:
    """One alternative per first letter (`E(?:rror|xception|CONNRESET)`): at each capital the
    regex tries a handful of branches, not all of them (a quarter faster on a typical line)."""
    groups: dict[str, list[str]] = {}
    for word in words:
        groups.setdefault(word[0], []).append(re.escape(word[1:]))
    return re.compile(
        "|".join(
            f"{re.escape(k)}(?:{'|'.join(sorted(v, key=len, reverse=True))})"
            for k, v in groups.items()
        )
    )


TRIGGER = _by_first_letter(TRIGGERS)
_TRIGGER_WORDS = _LOWER_WORDS + tuple(w for w in SIGNATURE_WORDS if not w[0].isupper())
# Words that may name HiCache: the reader asks rules.signatures.text_context of a line holding
# one, while it has not seen HiCache yet.
HICACHE_WORDS = ("Cache", "adix", "ierarch")


def _minimal(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words with none that holds another (that one's test finds it already)."""
    unique = tuple(dict.fromkeys(words))
    return tuple(w for w in unique if not any(o != w and o in w for o in unique))


def _any_in(words: tuple[str, ...]) -> Callable[[str], bool]:
    """`lambda s: w1 in s or w2 in s ...`: substring tests without a loop per line (the tests
    run on every line of a big log)."""
    return eval("lambda s: " + " or ".join(f"{w!r} in s" for w in words))  # noqa: S307


has_trigger_word = _any_in(_TRIGGER_WORDS)
has_hicache_word = _any_in(HICACHE_WORDS)
TRIGGER_STARTS = (
    "Process ",
    "Thread 0x",
    "Current thread",
    "nanobind",
    "- leaked",
    "self.cur_batch",
    "During handling",
    "The above exception",
    "terminate called",
)
# For a block of lines (triage.log_blocks): every trigger, searched anywhere in the text (a
# superset of `triggered`): the capitalised ones as one regex, the rest as plain substrings.
BLOCK_TRIGGER = _by_first_letter(TRIGGERS + tuple(s for s in TRIGGER_STARTS if s[0].isupper()))
BLOCK_TRIGGER_WORDS = _minimal(
    _TRIGGER_WORDS + tuple(s for s in TRIGGER_STARTS if not s[0].isupper())
)
SCHEDULER_PROGRESS = ("Decode batch", "Prefill batch")
PROGRESS_WORDS = ("batch", "#running-req", "throughput", "fired up")
# Any of PROGRESS_WORDS: one literal scan instead of a generator per line.
PROGRESS_HINT = re.compile("|".join(map(re.escape, PROGRESS_WORDS)))


def triggered(msg: str) -> bool:
    if TRIGGER.search(msg):
        return True
    if has_trigger_word(msg):
        return True
    return msg.lstrip().startswith(TRIGGER_STARTS)
