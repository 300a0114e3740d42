"""REPORT.md's section on the first-divergence block (first_divergence/rank{r}.json), where the
run had SGLang's rank consensus checker on (`run --sglang-consensus-checker`): SGLang's own
statement that the ranks disagreed, and on which `@rank_consensus` event first."""

from __future__ import annotations

from hicache_diag.diagnosis.consensus import first_event_difference
from hicache_diag.evidence import DivergenceBlock

MAX_EVENT = 400


def consensus_event(blocks: dict[int, DivergenceBlock]) -> tuple[int, dict[int, str]] | None:
    """The first checked event the ranks' blocks disagree on (index in the batch, per rank)."""
    return first_event_difference({r: b.events for r, b in blocks.items()})


def block_section(blocks: dict[int, DivergenceBlock], world: list[int]) -> list[str]:
    if not blocks:
        return []
    lines = [
        "",
        "## First divergence as SGLang's rank consensus checker saw it",
        "",
        "The run had `SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1`; each rank wrote its state in the "
        "checker's thread between its `Found rank divergence` line and its `os._exit(1)` "
        "(`first_divergence/rank<r>.json`).",
        "",
        "| rank | PP | TP | step | events | local hash | device free | host free | queues |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rank, b in sorted(blocks.items()):
        queues = ", ".join(f"{k}={v}" for k, v in sorted(b.queues.items()) if v) or "empty"
        lines.append(
            f"| {rank} | {b.pp} | {b.tp} | {b.step} | {b.n_events} | `{b.local_hash}` | "
            f"{b.device_free} | {b.host_free} | {queues} |"
        )
    missing = [r for r in world if r not in blocks]
    if missing:
        lines += ["", f"No block from rank(s) {missing}."]
    diff = consensus_event(blocks)
    if diff is not None:
        index, at = diff
        lines += ["", f"First differing event (#{index} of the checked batch):", "", "```"]
        lines += [f"rank {r}: {e[:MAX_EVENT]}" for r, e in at.items()] + ["```"]
    return lines
