"""Framing as data: peel wrappers nobody listed (a cloud logging agent's `[severity: ERROR] `,
JSON-ish fields, a runtime's prefix, a timestamp that lost its first characters) by finding
what SGLang itself printed inside the line: its rank label (`[2025-06-24 15:38:03 PP1 TP0]`,
rules/rank_labels.py) or a traceback's own shapes (`Traceback (most recent call last):`,
`  File "..."`, the chain lines). What stood before it is the wrapper; its shape (digits
generalised) is learned, so the lines that carry no label (a traceback's code and exception
lines) lose the same wrapper. triage.carriers peels the collectors we know first; this stage
takes what is left.
"""

from __future__ import annotations

import re

from hicache_diag.logs.carriers import peel
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.prefix import LearnedPrefix, learn_prefix, prefix_label
from hicache_diag.logs.shapes import ZERO
from hicache_diag.logs.speakers import speaker_in
from hicache_diag.rules.rank_labels import split_prefix

_DIM = r"[A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5}"
# SGLang's whole label anywhere in a line (a wrapper before it).
_STAMP = r"(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
_LABEL = re.compile(rf"\[(?:{_STAMP}(?: {_DIM}){{0,12}}|{_DIM}(?: {_DIM}){{0,11}})\]")
# A label whose stamp lost its first characters (`5:38:03 PP1 TP0] `, `-24 15:38:03] `) at
# the start of what is left: the `[` is restored and rules.rank_labels reads the rest.
_DAMAGED = re.compile(rf"^(?P<inside>[\d:.,T -]{{0,24}}(?:(?<=[\d ])|^)(?: ?{_DIM}){{0,12}})\] ?")
# The same, after a wrapper: tokens required (a stamp's tail alone is too weak a sign).
_DAMAGED_IN = re.compile(
    rf"(?:(?<=[|>\]])|(?<=[^\d:.,T -] ))[\d:.,T-][\d:.,T -]{{0,23}}(?: {_DIM}){{1,12}}\] "
)
# Shapes Python prints for a traceback, whatever wraps them.
_SHAPE = re.compile(
    r'Traceback \(most recent call last\):|(?<=\s)(?P<file>File) "[^"\n]{1,2000}", line \d'
    r"|During handling of the above exception|The above exception was the direct cause"
    r"|Fatal Python error: |(?:Current thread|Thread) 0x[0-9a-fA-F]{4,16} \(most recent"
    r"|Exception in thread |terminate called after throwing"
    r"|(?<=\s)(?:[A-Za-z_]\w{0,80}\.){0,8}[A-Z]\w{0,80}(?:Error|Exception)(?::\s|$)"
    # py-spy's text dump: its process and thread headers, its frames (indented 4 blanks).
    r"|(?<=\s)Process \d{1,10}: |(?<=\s)Thread (?:0x[0-9a-fA-F]{1,16}|\d{1,10}) \([a-z+]{1,20}\)"
    r"|(?<=\s{5})(?P<frame>[\w<>.]{1,200}) \([^()\s]{1,500}:\d{1,7}\)\s*$"
)
# A wrapper found only by a message shape must look like one (a field, a bracket, a figure),
# not like prose that names an exception (`retrying after ConnectionError: ...`).
_WRAPPERISH = re.compile(r"[\[\]{}|<>=@\d]")
_MAX_WRAPPER = 200  # a wrapper longer than this is a message that quotes a label
_MAX_TEMPLATES = 8
_MESSAGE_WORDS = ("Traceback", 'File "', "Error:", "Exception:")


class Framing:
    """The wrappers seen so far in one stream, and `unwrap` for each line."""

    __slots__ = ("templates", "learned", "notes", "bulk")

    def __init__(self, notes: FramingNotes | None = None) -> None:
        self.templates: list[re.Pattern[str]] = []
        self.learned: LearnedPrefix | None = None  # the prefix the first lines share
        self.notes = notes or FramingNotes()  # what was undone, for the report
        # The learned prefix as a multi-line regex, when it never names a rank: then a chunk
        # of lines loses it in one C-level pass (a big log), not line by line.
        self.bulk: re.Pattern[str] | None = None

    def unwrap(self, line: str) -> str:
        """The line as SGLang (or Python) printed it: learned wrappers off, a wrapper before
        a label or traceback shape off (and learned), a damaged label made readable."""
        if not line or (line[:1] == "[" and split_prefix(line) is not None):
            return line
        if self.learned is not None and (m := self.learned.pattern.match(line)):
            # The prefix most lines share: off, then the rest is read as any line is (a
            # wrapper behind it, a collector we know, a damaged label).
            self.notes.stripped += 1
            rest = _keep_speaker(line[: m.end()], peel(line[m.end() :])[0])
            return rest if rest[:1] == "[" and split_prefix(rest) else self._behind(rest)
        return self._behind(line)

    def _behind(self, line: str) -> str:
        """unwrap's reading of a line that the learned prefix did not start (or is off)."""
        if not line or (line[:1] == "[" and split_prefix(line) is not None):
            return line
        for template in self.templates:
            if m := template.match(line):
                self.notes.stripped += 1
                return _keep_speaker(line[: m.end()], _restore(peel(line[m.end() :])[0]))
        if (restored := _restore(line)) is not line:
            return restored
        head = line[:400]
        found = _LABEL.search(head, 1) or _DAMAGED_IN.search(head, 1)
        start = found.start() if found else -1
        if found is None and (shape := _SHAPE.search(head, 1)) is not None:
            # A frame is indented (Python's `File` by 2, py-spy's by 4): not the wrapper's.
            indent = 2 if shape["file"] else 4 if shape["frame"] else 0
            start = shape.start() - (indent if head[: shape.start()].endswith(" " * indent) else 0)
            start = start if _WRAPPERISH.search(line, 0, start) else -1
        if start > 0 and self._learn(line[:start]):
            # A collector we know may sit behind the unknown wrapper (kubectl's stamp).
            self.notes.stripped += 1
            return _keep_speaker(line[:start], _restore(peel(line[start:])[0]))
        return line

    def learn(self, lines: list[str]) -> None:
        """Learn the wrappers of a stream's first lines before any line is read, so a line
        before the first label (a fatal error, a dump's header) is unwrapped too: first the
        prefix most of them share (logs/prefix.py), then those found before a label."""
        self.learned = self.notes.learned = learn_prefix(lines)
        # What the lines teach depends on their words, not on their figures: one line of each
        # shape (figures zeroed, logs/shapes.py) is asked, the first of them.
        firsts: dict[str, str] = {}
        for line in lines:
            firsts.setdefault(line.translate(ZERO), line)
        lines = list(firsts.values())
        if self.learned is not None:
            heads = [m.group() for line in lines if (m := self.learned.pattern.match(line))]
            if not any(speaker_in(h) or prefix_label(h) for h in heads):
                # A newline first: the regex engine jumps from line start to line start.
                self.bulk = re.compile(f"\n(?:{self.learned.pattern.pattern})")
        for line in lines:
            if len(self.templates) >= _MAX_TEMPLATES:
                break
            self.unwrap(line)
        self.notes.stripped = 0  # counted again as the lines are read

    def strip_chunk(self, chunk: list[str]) -> list[str]:
        """The learned prefix off every line of a chunk that starts with it, in one pass."""
        if self.bulk is None:
            return chunk
        text = "\n".join(chunk)
        if text.count("\n") != len(chunk) - 1:
            return chunk  # lines that hold their newline (a list, not a file): line by line
        text, n = self.bulk.subn("\n", "\n" + text)
        self.notes.stripped += n
        return text[1:].split("\n")

    def _learn(self, wrapper: str) -> bool:
        """Keep the wrapper's shape; False when it does not look like one (blank, long,
        part of a message, or glued onto text without a separator)."""
        if (
            not wrapper.strip()
            or len(wrapper) > _MAX_WRAPPER
            or wrapper[-1:] not in " \t|:>]"
            or any(w in wrapper for w in _MESSAGE_WORDS)
        ):
            return False
        template = _template(wrapper)
        if all(t.pattern != template.pattern for t in self.templates):
            if len(self.templates) >= _MAX_TEMPLATES:
                self.templates.pop(0)
            self.templates.append(template)
        return True


def _keep_speaker(wrapper: str, text: str) -> str:
    """The text with the rank the wrapper named (a worker's process name, SGLang's rank
    tokens) kept as a rank label, when the text has none of its own."""
    if text[:1] == "[" and split_prefix(text) is not None:
        return text
    label = speaker_in(wrapper) or prefix_label(wrapper)
    return f"[{label}] {text}" if label else text


def _template(wrapper: str) -> re.Pattern[str]:
    """A wrapper's shape: its figures (times, counters, pids, hex ids: any run of letters and
    digits that holds a digit) and its leading blanks vary from line to line; the rest (field
    names, brackets, words) is kept as it is."""
    body = wrapper.lstrip(" ")
    parts = re.split(r"([0-9A-Za-z]+)", body)
    pattern = "".join(_shape_of(p) for p in parts if p)
    return re.compile(" *" + pattern)


def _shape_of(part: str) -> str:
    if part.isdigit():
        return r"\d+"
    if part.isalnum() and any(c.isdigit() for c in part):
        return r"[0-9A-Za-z]+"  # a hex id, `pod-7f9c`: letters and figures both vary
    return re.escape(part)


def _restore(line: str) -> str:
    """`5:38:03 PP1 TP0] msg` -> `[5:38:03 PP1 TP0] msg` when the damaged label reads as one
    (rules.rank_labels takes a stamp's tail)."""
    if "]" not in line[:120] or (m := _DAMAGED.match(line)) is None:
        return line
    inside = m["inside"].strip()
    if not inside:
        return line
    fixed = f"[{inside}] {line[m.end() :]}"
    return fixed if split_prefix(fixed) is not None else line
