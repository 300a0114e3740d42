"""Issue 40's note, in issue 38's files: the fast path's trigger words derive from the signature
table (one source). A signature whose pattern requires no literal word cannot be written, and
every signature's words make a line take the full path."""

from __future__ import annotations

import re

import pytest

from hicache_diag.logs.triggers import SIGNATURE_WORDS, triggered
from hicache_diag.rules import signatures as sig
from hicache_diag.rules.literals import NoTriggerWord, required_words
from hicache_diag.rules.process_fate import FATE_SIGNATURES


def _tables() -> list[re.Pattern[str]]:
    """Every compiled pattern the rule book's modules hold at module level, in a table or not."""
    found = []
    for value in vars(sig).values():
        values = value if isinstance(value, tuple) else (value,)
        found += [v for v in values if isinstance(v, re.Pattern)]
    return found


@pytest.mark.parametrize("pattern", [*sig.LINE_SIGNATURES, *FATE_SIGNATURES], ids=repr)
def test_every_signature_has_words_and_they_trigger_the_full_path(pattern):
    for word in required_words(pattern):
        assert triggered(f"prefix {word} suffix"), word


def test_every_line_table_of_the_rule_book_is_a_signature():
    # A new pattern in TIMEOUT_PATTERNS (or any table the reader asks of a line) is registered
    # through LINE_SIGNATURES; the tables below are the reader's.
    registered = set(sig.LINE_SIGNATURES)
    for table in (
        sig.TIMEOUT_PATTERNS,
        sig.CASCADE_PATTERNS,
        sig.FATAL_PATTERNS,
        sig.NOISE_PATTERNS,
    ):
        assert set(table) <= registered


def test_a_signature_without_a_literal_word_cannot_exist():
    with pytest.raises(NoTriggerWord):
        required_words(re.compile(r"\d+ seconds|x"))
    with pytest.raises(NoTriggerWord):
        required_words(re.compile(r"timed out", re.I))  # no substring test finds case-blind text
    assert required_words(re.compile(r"ECONNRESET|Socket closed")) == (
        "ECONNRESET",
        "Socket closed",
    )
    assert required_words(re.compile(r"(?<!\w)Watchdog caught \d+")) == ("Watchdog caught",)


def test_a_new_signature_reaches_the_fast_path_without_a_hand_kept_word(monkeypatch):
    import importlib

    import hicache_diag.logs.triggers as triggers

    new = re.compile(r"Zebra stampede in collective \d+")
    monkeypatch.setattr(sig, "LINE_SIGNATURES", (*sig.LINE_SIGNATURES, new))
    fresh = importlib.reload(triggers)
    try:
        assert fresh.triggered("Zebra stampede in collective 7")
    finally:
        monkeypatch.undo()
        importlib.reload(triggers)
    assert "Zebra" not in " ".join(SIGNATURE_WORDS)
    assert all(p in _tables() for p in sig.TIMEOUT_PATTERNS)
