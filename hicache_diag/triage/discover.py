"""Find scheduler processes by title and parse their rank tokens (rules.rank_labels' grammar)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from hicache_diag.rules.rank_labels import rank_tokens

TITLE_PREFIXES = ("sglang::scheduler", "hicache-diag::scheduler")


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

    @property
    def known(self) -> bool:
        return self.anon is None

    @property
    def key(self) -> tuple[int, ...]:
        """Sort key that tolerates absent tokens (None never compares with int); unnamed last."""
        opt = (self.dp, self.attn_dp, self.attn_cp, self.moe_dp, self.ep)
        head = (1, self.anon) if self.anon is not None else (0, 0)
        return (*head, self.dp or 0, self.pp, self.tp, *(-1 if v is None else v for v in opt))

    def flat(self, tp_size: int) -> int:
        """The launch-wide rank, numbered as SGLang numbers its schedulers: pp * tp_size + tp."""
        return self.pp * tp_size + self.tp

    @property
    def label(self) -> str:
        if self.anon is not None:  # never an invented PP/TP
            return "rank ?" if self.anon == 0 else f"rank ?{self.anon + 1}"
        parts = [f"DP{self.dp}"] if self.dp is not None else []
        if self.attn_dp is not None:
            parts.append(f"ATTN_DP{self.attn_dp}")
        parts.append(f"PP{self.pp}")
        if self.attn_cp is not None:
            parts.append(f"ATTN_CP{self.attn_cp}")
        parts.append(f"TP{self.tp}")
        return " ".join(parts)


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


@dataclass(frozen=True, slots=True)
class SchedulerProcess:
    pid: int
    title: str
    rank: RankId


def describe_pid(pid: int) -> SchedulerProcess:
    """Title and rank of one pid (rank 0 when the title names none). Raises psutil errors."""
    proc = psutil.Process(pid)
    # setproctitle pads the title with spaces (it reuses argv's memory): strip them.
    title = " ".join(proc.cmdline()).strip() or proc.name()
    return SchedulerProcess(pid, title, rank_from_title(title) or RankId())


def _candidates(parent: int | None) -> list[psutil.Process]:
    if parent is None:
        return list(psutil.process_iter())
    # SGLang's own collect_scheduler_processes walks the launcher's children the same way.
    return psutil.Process(parent).children(recursive=True)


def discover_schedulers(parent: int | None = None) -> list[SchedulerProcess]:
    """Every live process whose cmdline starts with a scheduler title (cmdline, not the 15-byte
    comm, which the kernel truncates to `sglang::schedul`); only `parent`'s tree when given.
    Raises psutil.NoSuchProcess for a missing parent."""
    found = []
    for proc in _candidates(parent):
        try:
            cmdline = " ".join(proc.cmdline()).strip()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if is_scheduler_title(cmdline):
            rank = parse_rank_tokens(cmdline.split(None, 1)[0]) or RankId()
            found.append(SchedulerProcess(proc.pid, cmdline, rank))
    return sorted(found, key=lambda p: (p.rank.key, p.pid))
