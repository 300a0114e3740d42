"""Ranks, the core noun: a scheduler's position (`RankId`), the launch-wide number SGLang gives
it (`flat`: pp * tp_size + tp, and back), its process title and the run's topology. The token
grammar of dimension tokens lives here; the rest of the label grammar is rules/rank_labels.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TITLE_PREFIXES = ("sglang::scheduler", "hicache-diag::scheduler")


def flat_rank(pp: int, tp: int, tp_size: int) -> int:
    """The launch-wide rank, numbered as SGLang numbers its schedulers."""
    return pp * tp_size + tp


def unflat_rank(rank: int, tp_size: int) -> tuple[int, int]:
    """(pp, tp) of a launch-wide rank."""
    return divmod(rank, tp_size)


def scheduler_title(pp: int, tp: int, engine: str = "hicache-diag") -> str:
    """`hicache-diag::scheduler_PP1_TP0`, as SGLang titles its own (`sglang::...`)."""
    return f"{engine}::scheduler_PP{pp}_TP{tp}"


def topology(pp_size: int, tp_size: int) -> dict[str, Any]:
    """The manifest's `topology`: sizes and every rank's (pp, tp)."""
    ranks = [
        {"rank": flat_rank(p, t, tp_size), "pp": p, "tp": t}
        for p in range(pp_size)
        for t in range(tp_size)
    ]
    return {"pp": pp_size, "tp": tp_size, "world_size": pp_size * tp_size, "ranks": ranks}


@dataclass(frozen=True, slots=True)
class RankId:
    """A scheduler's position; absent tokens mean size 1 (SGLang omits them from the title)."""

    pp: int = 0
    tp: int = 0
    dp: int | None = None
    attn_cp: int | None = None
    moe_dp: int | None = None
    ep: int | None = None
    attn_dp: int | None = None
    anon: int | None = None  # a process nothing names (no title, no prefix): `rank ?`
    node: str | None = None  # the machine, when a triage spans several (`node-1 PP1 TP0`)

    @property
    def known(self) -> bool:
        return self.anon is None

    @property
    def key(self) -> tuple[int | str, ...]:
        """Sort key that tolerates absent tokens (None never compares with int); unnamed last."""
        opt = (self.dp, self.attn_dp, self.attn_cp, self.moe_dp, self.ep)
        head = (1, self.anon) if self.anon is not None else (0, 0)
        rest = (*(-1 if v is None else v for v in opt), self.node or "")
        return (*head, self.dp or 0, self.pp, self.tp, *rest)

    def flat(self, tp_size: int) -> int:
        """The launch-wide rank, numbered as SGLang numbers its schedulers: pp * tp_size + tp."""
        return flat_rank(self.pp, self.tp, tp_size)

    @property
    def label(self) -> str:
        node = f"{self.node} " if self.node else ""
        if self.anon is not None:  # never an invented PP/TP
            return node + ("rank ?" if self.anon == 0 else f"rank ?{self.anon + 1}")
        parts = [self.node] if self.node else []
        parts += [f"DP{self.dp}"] if self.dp is not None else []
        if self.attn_dp is not None:
            parts.append(f"ATTN_DP{self.attn_dp}")
        parts.append(f"PP{self.pp}")
        if self.attn_cp is not None:
            parts.append(f"ATTN_CP{self.attn_cp}")
        parts.append(f"TP{self.tp}")
        return " ".join(parts)


# SGLang's dimension tokens in titles and log prefixes (`PP1`, `TP0`, `ATTN_CP0`, ...).
_TOKEN = re.compile(r"(?<![A-Z])(ATTN_CP|ATTN_DP|ATTN_TP|MOE_DP|MOE_EP|MOE_TP|DP|PP|CP|TP|EP)(\d+)")


def rank_tokens(text: str) -> dict[str, int]:
    """Every dimension token in `text`, upper-cased: `{"PP": 1, "TP": 0, "ATTN_CP": 0}`."""
    return {name: int(value) for name, value in _TOKEN.findall(text.upper())}


def parse_rank_tokens(text: str) -> RankId | None:
    """Rank from any title, log prefix or file name; None when it names no rank at all."""
    found = rank_tokens(text)
    if not found:
        return None
    return RankId(
        pp=found.get("PP", 0),
        tp=found.get("TP", 0),
        dp=found.get("DP"),
        attn_cp=found.get("ATTN_CP"),
        moe_dp=found.get("MOE_DP"),
        ep=found.get("EP", found.get("MOE_EP")),
        attn_dp=found.get("ATTN_DP"),
    )


def is_scheduler_title(cmdline: str) -> bool:
    return cmdline.startswith(TITLE_PREFIXES)


def is_component_title(title: str | None) -> bool:
    """Another named SGLang (or our) process: `sglang::data_parallel_controller`,
    `sglang::detokenizer`; its stack says nothing about a scheduler rank."""
    head = (title or "").strip()
    return head.startswith(("sglang::", "hicache-diag::")) and not is_scheduler_title(head)


def rank_from_title(title: str | None) -> RankId | None:
    """Rank tokens only from a scheduler title: any other cmdline (`/opt/ep4/bin/python ...`)
    could hold token look-alikes."""
    if not title or not is_scheduler_title(title.strip()):
        return None
    return parse_rank_tokens(title.split(None, 1)[0]) or RankId()
