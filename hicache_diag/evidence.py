"""The run directory's layout (docs/evidence.md), spelled once: every file name a trial writes
and analysis reads. Bottom floor: it imports nothing of ours, so the SGLang plugin may use it."""

from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"  # written first
LAUNCHER = "launcher.json"  # how each rank process ended, written after reaping
OUTPUTS = "outputs.json"
REFERENCE = "reference.json"
REQUESTS = "requests.json"  # the sglang engine's client
BUDGET = "budget.json"  # PP0 stopped on the step budget with work left
SERVER_LOG = "server.log"  # the sglang engine: SGLang's whole output
PLUGIN = "plugin.json"  # the sglang engine: what the plugin was told
VERDICT = "verdict.json"  # written last, atomically
STACKS = "stacks"


def rank_jsonl(run_dir: Path, rank: int) -> Path:
    """One line per scheduler step, flushed per line."""
    return run_dir / f"rank{rank}.jsonl"


def rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.log"


def stack_json(run_dir: Path, rank: int) -> Path:
    """py-spy dump --json of a rank, taken on a hang."""
    return run_dir / STACKS / f"rank{rank}.json"


def stack_txt(run_dir: Path, rank: int) -> Path:
    """The rank's own faulthandler dump (SIGUSR1), when py-spy could not dump it."""
    return run_dir / STACKS / f"rank{rank}.txt"


# Every entry of the layout, as docs/evidence.md's tree names it (a test holds them together).
LAYOUT = (MANIFEST, "rank{r}.jsonl", "rank{r}.log", LAUNCHER, "stacks/rank{r}.json",
          "stacks/rank{r}.txt", OUTPUTS, REFERENCE, BUDGET, VERDICT)  # fmt: skip
SGLANG_LAYOUT = (SERVER_LOG, PLUGIN, REQUESTS)
