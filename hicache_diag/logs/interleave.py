"""Two writers interleaved character by character: ranks that crash or dump at the same moment
write their faulthandler (or py-spy) dumps into one stream as they go, and the text comes out
shuffled (`FFaattaall  PPyytthhoonn...`, a writer now and then a character ahead). Such dumps
are the same text from each rank (the same stacks), so the shuffle is read back as a text
interleaved with itself: every reading of the characters so far is kept as the characters one
copy wrote that the other has not yet (at most MAX_LAG, the most likely few kept), and a
character either extends the leading copy or is the next one the other copy needs.

A region starts where a line's first characters read as a dump's header written twice, and
ends at the last line's end where both copies were whole (after it the text no longer reads as
two copies). The text the writers shared is handed on once, as its lines (a second copy would
read as a second, unannounced dump), and the report says that two writers were separated.
Anything else passes as it is."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from hicache_diag.logs.chunks import Blank
from hicache_diag.logs.framing_notes import FramingNotes
from hicache_diag.logs.texts import Text

_HEADERS = ("Fatal Python error", "Thread 0x", "Current thread 0x", "Process ", "Stack (most")
_FIRST = frozenset(h[0] for h in _HEADERS)
_PROBE = 48  # characters of a line looked at for a start
_GATE = re.compile(r"\n([FTCPS])[^\n]{0,2}?\1")
MAX_LAG = 64  # characters one copy may be ahead of the other
_KEEP = 16  # readings kept (the least lag first)
MAX_REGION = 1024 * 1024  # characters one region may span before it is given up
# A reading: the leading copy's characters the other has not written yet -> how the leading
# copy came to be (a linked list of its characters, newest first).
_Node = tuple[str, "_Node"] | None


class _Shuffle:
    """Every reading of the characters fed so far as two copies of one text."""

    __slots__ = ("readings",)

    def __init__(self) -> None:
        self.readings: dict[str, _Node] = {"": None}

    def feed(self, text: str) -> bool:
        """Read more characters; False when no reading is left (not two copies)."""
        readings = self.readings
        for c in text:
            new: dict[str, _Node] = {}
            for ahead, node in readings.items():
                if ahead and ahead[0] == c and ahead[1:] not in new:
                    new[ahead[1:]] = node  # the copy behind wrote its next character
                if len(ahead) < MAX_LAG and ahead + c not in new:
                    new[ahead + c] = (c, node)  # the copy ahead wrote a new one
            if not new:
                self.readings = {}
                return False
            if len(new) > _KEEP:
                new = dict(sorted(new.items(), key=lambda kv: len(kv[0]))[:_KEEP])
            readings = new
        self.readings = readings
        return True

    @property
    def whole(self) -> bool:
        """Both copies have written the same text."""
        return "" in self.readings

    def text(self, ahead: str = "") -> str:
        node, out = self.readings.get(ahead), []
        while node is not None:
            out.append(node[0])
            node = node[1]
        return "".join(reversed(out))


def _starts(line: str) -> bool:
    """The line begins two copies of a dump's header shuffled together."""
    if len(line) < 16 or line[0] not in _FIRST or line.startswith(_HEADERS):
        return False
    probe = _Shuffle()
    if not probe.feed(line[:_PROBE]):
        return False
    best = min(probe.readings, key=len)
    return len(best) <= 8 and probe.text(best).startswith(_HEADERS)


def separate(
    items: list[str | Blank | Text], more: Iterator[str | Blank | Text], notes: FramingNotes
) -> list[str | Blank | Text]:
    """A chunk of the stream with each shuffled region in it replaced by the text its writers
    shared (a region that runs past the chunk takes its lines from `more`; a Blank or a Text
    ends it)."""
    # Most chunks hold no line a shuffle could start (its first letter again within the next
    # three: `FFa`, `TtT`): handed back as they are after one C-level search.
    kinds = set(map(type, items))
    lines = items if kinds == {str} else [x for x in items if type(x) is str]
    if Blank not in kinds and not _GATE.search("\n" + "\n".join(lines)):  # type: ignore[arg-type]
        return items
    out: list[str | Blank | Text] = []
    rest = iter(items)
    for item in rest:
        if type(item) is not str or not _starts(item):
            out.append(item)
            continue
        out += _region(item, itertools.chain(rest, more), notes)  # type: ignore[arg-type]
    return out


def _region(
    first: str, it: Iterator[str | Blank | Text], notes: FramingNotes
) -> list[str | Blank | Text]:
    """Read the region that starts at `first` up to its last line where both copies were
    whole; the lines after that point pass on as they are."""
    shuffle = _Shuffle()
    taken: list[str | Blank | Text] = []
    whole_at, shared = 0, ""  # lines taken when both copies were last whole, and their text
    size = 0
    nxt: str | Blank | Text | None = first
    while type(nxt) is str and size < MAX_REGION:
        taken.append(nxt)
        size += len(nxt)  # type: ignore[arg-type]
        if not shuffle.feed(nxt + "\n"):  # type: ignore[operator]
            break
        if shuffle.whole:
            whole_at, shared = len(taken), shuffle.text()
        nxt = next(it, None)
    else:
        if nxt is not None:
            taken.append(nxt)
    if not whole_at:
        return taken  # never two whole copies: not a shuffle after all
    notes.interleaved += 1
    return [*shared.rstrip("\n").split("\n"), *taken[whole_at:]]
