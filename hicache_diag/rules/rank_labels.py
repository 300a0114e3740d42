"""The rank-label grammar: SGLang's `[ts DP0 PP1 ATTN_CP0 TP0 EP0]` log prefix and the rank
tokens of process titles and file names, in every order and for every parallel dimension.

SGLang builds the prefix from whichever dimensions exceed size 1 (`DP`, `ATTN_DP`, `PP`,
`ATTN_CP`, `MOE_DP`, `TP`, `EP`, ...), in an order that changed across releases, so a token is
any upper-case dimension name followed by its index. Pastes damage the prefix: an editor's line
number in front of it, a lost `[`, a terminal wrap through it (`triage.lines` joins that one).
"""

from __future__ import annotations

import functools
import re

# One dimension: `TP3`, `ATTN_CP0`, `MOE_DP2`; at most two name parts, bounded, so a long run
# of capitals is scanned once.
_DIM = r"[A-Z]{1,8}(?:_[A-Z]{1,8})?\d{1,5}"
# Releases before 0.4 stamped the time only: `[04:40:55 TP0]`.
_STAMP = r"(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?"
# `[2025-01-01 00:00:00 DP2 TP2 EP2] msg`, `[TP0] msg`, `[2025-01-01 00:00:00] msg`; the `[`
# may be lost in a paste when a stamp is there to show what the prefix was.
LOG_PREFIX = re.compile(
    rf"^(?:\[(?:(?P<ts>{_STAMP})\s?)?|(?P<bare_ts>{_STAMP})\s?)"
    rf"(?P<tokens>(?:{_DIM}\s?){{0,12}})\]\s?(?P<msg>.*)$",
    re.S,
)
# Tokens anywhere (titles `sglang::scheduler_DP0_PP1_TP2`, file names `PP1_TP0_pid9.json`):
# not preceded by a letter, so ATTN_DP is never read as DP.
# NCCL / torch's own rank stamps: `[Rank 3]`, `[PG 1 Rank 3]`, `[PG ID 0 PG GUID 0(default_pg)
# Rank 6]`, torchrun's `[rank3]:`. A global rank: PP/TP unknown without the topology.
NCCL_RANK = re.compile(r"\[(?:PG [^\]\[]{0,80}?)?Rank (\d+)\]|^\[rank(\d+)\]")


_INSIDE = re.compile(rf"^(?:(?P<ts>{_STAMP})\s?)?(?P<tokens>(?:{_DIM}\s?){{0,12}})$")
# A stamp that lost its first characters (a paste cut, a collector that ate them): its tail,
# then the tokens. Read as a prefix without a stamp when tokens follow, or when the tail
# still holds `:MM` (a time); triage.framing restores the `[` a cut took with it.
_DAMAGED_INSIDE = re.compile(rf"^(?P<tail>[\d:.,T -]{{0,24}}?)(?P<tokens>(?: ?{_DIM}){{0,12}})$")
_TIME_TAIL = re.compile(r":\d\d(?:[.,]\d+)?$")


@functools.lru_cache(maxsize=8192)
def _inside(inside: str) -> tuple[str | None, str | None] | None:
    """(stamp, tokens) of what a `[...]` prefix holds; None when it is not a prefix."""
    m = _INSIDE.match(inside)
    if m and (m["ts"] or m["tokens"]):
        return m["ts"], (m["tokens"].strip() or None)
    d = _DAMAGED_INSIDE.match(inside) if inside[:1] in "0123456789-:., T" else None
    if d is None:
        return None
    tokens = d["tokens"].strip() or None
    if tokens and (not d["tail"] or d["tail"][-1:] in " 0123456789"):
        return None, tokens
    if not tokens and _TIME_TAIL.search(d["tail"].rstrip()):
        return None, None
    return None


def split_prefix(line: str) -> tuple[str | None, str | None, str] | None:
    """(stamp, rank tokens, message) of a prefixed line; None when the line has no prefix."""
    if line[:1] == "[":
        # Most lines of a log: `[...]` read without a regex over the whole line, its inside
        # parsed once per distinct stamp and token set.
        j = line.find("]", 1, 200)
        if j < 0 or (parts := _inside(line[1:j])) is None:
            return None
        msg = line[j + 1 :]
        return parts[0], parts[1], msg[1:] if msg[:1].isspace() else msg
    m = LOG_PREFIX.match(line) if line[:1].isdigit() else None
    if not m:
        return None
    ts = m["ts"] or m["bare_ts"]
    tokens = m["tokens"].strip() or None
    if not ts and not tokens:
        return None
    return ts, tokens, m["msg"]
