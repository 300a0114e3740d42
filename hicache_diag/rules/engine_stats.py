"""An engine's periodic stats line read by its numbers: vLLM's `Avg prompt throughput: 0.0
tokens/s, Avg generation throughput: 5.4 tokens/s, Running: 1 reqs, Waiting: 14 reqs` (v1;
`Swapped`/`Pending` in v0, with `Max iteration time` in the oldest), printed every few seconds
by its logger whether or not there is work. Requests running or queued, or tokens generated,
make the server busy; all zero is an idle server (healthy). SGLang's batch lines are printed
only when a batch runs, so they are busy by themselves."""

from __future__ import annotations

import re
from dataclasses import dataclass

STATS = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: "
    r"(?P<gen>[\d.]+) tokens/s(?P<rest>.{0,400})"
)
_COUNT = re.compile(r"(?P<what>Running|Waiting|Pending|Swapped): (?P<n>\d{1,9}) reqs")
READY = "The server is fired up"


@dataclass(frozen=True, slots=True)
class EngineStats:
    prompt_tps: float
    gen_tps: float
    running: int
    queued: int  # waiting / pending (v1 / v0): admitted but not running

    @property
    def busy(self) -> bool:
        return bool(self.running or self.queued or self.prompt_tps or self.gen_tps)

    def describe(self) -> str:
        return f"{self.running} running, {self.queued} queued, generation {self.gen_tps:g} tokens/s"


def engine_stats(text: str) -> EngineStats | None:
    """The numbers of an engine stats line; None when the line is none."""
    m = STATS.search(text) if "throughput: " in text else None
    if m is None:
        return None
    counts = {c["what"]: int(c["n"]) for c in _COUNT.finditer(m["rest"])}
    try:
        prompt, gen = float(m["prompt"]), float(m["gen"])
    except ValueError:  # `1.2.3`: not a figure
        return None
    queued = counts.get("Waiting", 0) + counts.get("Pending", 0)
    return EngineStats(prompt, gen, counts.get("Running", 0), queued)


def idle_line(text: str) -> bool:
    """A progress line that says the server has nothing to do: SGLang's ready line, or an
    engine stats line with nothing running, queued or generated."""
    if text.startswith(READY):
        return True
    stats = engine_stats(text)
    return stats is not None and not stats.busy
