"""The first-divergence block (first_divergence/rank{r}.json) on the console and in Markdown:
one row per rank, then the first consensus event the ranks disagree on."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from hicache_diag.diagnosis.consensus import first_event_difference
from hicache_diag.evidence import DivergenceBlock

TITLE = "first-divergence block (SGLang's rank consensus checker)"
COLUMNS = ("rank", "pp", "tp", "step", "events", "hash", "device_free", "host_free", "queues")
MAX_EVENT = 240
SCHEDULER_FRAMES = 3


def _queues(block: DivergenceBlock) -> str:
    busy = {k: v for k, v in sorted(block.queues.items()) if v}
    return ", ".join(f"{k}={v}" for k, v in busy.items()) or "all empty"


def _row(block: DivergenceBlock) -> list[str]:
    cells = (block.rank, block.pp, block.tp, block.step, block.n_events, block.local_hash)
    cells += (block.device_free, block.host_free)
    return ["-" if c is None else str(c) for c in cells] + [_queues(block)]


def _short(text: str) -> str:
    return text if len(text) <= MAX_EVENT else text[:MAX_EVENT] + "..."


def block_lines(blocks: dict[int, DivergenceBlock]) -> list[str]:
    """What the table leaves out: the first differing event, each rank's last busy step, the
    scheduler thread's innermost frames and anything the rank could not read."""
    out = []
    diff = first_event_difference({r: b.events for r, b in blocks.items()})
    if diff is not None:
        index, at = diff
        out.append(f"first differing event (#{index} of the checked batch):")
        out += [f"  rank {r}: {_short(e)}" for r, e in at.items()]
    for rank, block in sorted(blocks.items()):
        last = block.last_step
        if last is not None:
            out.append(f"rank {rank} last busy step {last.step}: rids {last.rids or []}")
        main = next((s for s in block.stacks if s.name == "MainThread"), None)
        if main is not None and main.frames:
            where = " <- ".join(main.frames[::-1][:SCHEDULER_FRAMES])
            out.append(f"rank {rank} scheduler thread at: {where}")
        out += [f"rank {rank} could not read: {e}" for e in block.errors]
    return out


def render_blocks(blocks: dict[int, DivergenceBlock], world: list[int], console: Console) -> None:
    if not blocks:
        return
    table = Table(title=TITLE)
    for name in COLUMNS:
        table.add_column(name)
    for _, block in sorted(blocks.items()):
        table.add_row(*_row(block))
    console.print(table)
    missing = [r for r in world if r not in blocks]
    if missing:
        console.print(f"no block from rank(s) {missing}", markup=False)
    for line in block_lines(blocks):
        console.print(line, markup=False)


def markdown_blocks(blocks: dict[int, DivergenceBlock], world: list[int]) -> list[str]:
    if not blocks:
        return []
    md = [f"## {TITLE[0].upper()}{TITLE[1:]}", ""]
    md += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(_row(b)) + " |" for _, b in sorted(blocks.items())]
    missing = [r for r in world if r not in blocks]
    md += [""] + ([f"No block from rank(s) {missing}.", ""] if missing else [])
    md += ["```", *block_lines(blocks), "```", ""]
    return md
