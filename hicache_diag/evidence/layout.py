"""The run directory's layout (docs/evidence.md), spelled once: every file name a trial writes
and analysis reads, and the step line's agreement lists. Standard library only."""

from __future__ import annotations

import re
from pathlib import Path

EVIDENCE_VERSION = 1

MANIFEST = "manifest.json"  # written first
LAUNCHER = "launcher.json"  # how each rank process ended, written after reaping
OUTPUTS = "outputs.json"
REFERENCE = "reference.json"
REQUESTS = "requests.json"  # the sglang engine's client
BUDGET = "budget.json"  # PP0 stopped on the step budget with work left
SERVER_LOG = "server.log"  # the sglang engine: SGLang's whole output
PLUGIN = "plugin.json"  # the sglang engine: what the plugin was told
SCRIPT = "script.json"  # the sglang engine: a scripted workload's client events
VERDICT = "verdict.json"  # written last, atomically
STACKS = "stacks"
FIRST_DIVERGENCE = "first_divergence"  # the sglang engine: SGLang's consensus checker fired
RANK_JSONL_GLOB = "rank*.jsonl"
RANK_LOG_GLOB = "rank*.log"
# A rank's own file: rank{r}.jsonl / rank{r}.log (in stacks/: rank{r}.json / rank{r}.txt).
RANK_FILE_RE = re.compile(r"^rank(\d+)\.(jsonl|log|json|txt)$")


def rank_jsonl(run_dir: Path | str, rank: int) -> Path:
    """One line per scheduler step, flushed per line."""
    return Path(run_dir) / f"rank{rank}.jsonl"


def rank_log(run_dir: Path | str, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.log"


def stack_json(run_dir: Path | str, rank: int) -> Path:
    """py-spy dump --json of a rank, taken on a hang."""
    return Path(run_dir) / STACKS / f"rank{rank}.json"


def stack_txt(run_dir: Path | str, rank: int) -> Path:
    """The rank's own faulthandler dump (SIGUSR1), when py-spy could not dump it."""
    return Path(run_dir) / STACKS / f"rank{rank}.txt"


def divergence_json(run_dir: Path | str, rank: int) -> Path:
    """The rank's first-divergence block, written as SGLang's consensus checker exits it."""
    return Path(run_dir) / FIRST_DIVERGENCE / f"rank{rank}.json"


def rank_of(path: Path | str) -> int | None:
    """The rank a run-dir file belongs to (`rank3.jsonl` -> 3), None for any other name."""
    m = RANK_FILE_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def rank_files(run_dir: Path | str, pattern: str) -> dict[int, Path]:
    """rank -> path of every `rank{r}.<ext>` in `run_dir` matching `pattern`, by rank."""
    found = {}
    for path in sorted(Path(run_dir).glob(pattern)):
        rank = rank_of(path)
        if rank is not None:
            found[rank] = path
    return dict(sorted(found.items()))


# `must_agree` (docs/evidence.md): what every rank must hold identically at the same step, one
# list for both engines' recorders. The batch decision first (a crash record's `must_agree`).
BATCH_KEYS = ("rids", "extend_num_tokens", "prefix_len", "host_hit_len")
MUST_AGREE = (
    *BATCH_KEYS,
    "acks_consumed",
    "evicted",
    "load_backs",
    "write_backs",
    "device_free",
    "tree_digest",
)
# Alike only where the protocol aligns them: the builtin engine adds the host pool's under
# `host-capacity=min` and the L3 hits with storage on. In real SGLang these and the pp_sync
# counts were equal on every busy step of every real run held here (0.5.12.post1-0.5.23, PP2
# and TP2, L2 and L3) until a fault fired, so its recorder adds every one it records.
MUST_AGREE_HOST = ("host_free", "host_capacity")
MUST_AGREE_L3 = ("l3_hit_len",)
MUST_AGREE_SGLANG = ("host_loaded_len", "l3_hit_len", "sync_received", "host_free")

# Every entry of the layout, as docs/evidence.md's tree names it (a test holds them together).
LAYOUT = (
    MANIFEST,
    "rank{r}.jsonl",
    "rank{r}.log",
    LAUNCHER,
    "stacks/rank{r}.json",
    "stacks/rank{r}.txt",
    OUTPUTS,
    REFERENCE,
    BUDGET,
    VERDICT,
)
SGLANG_LAYOUT = (
    SERVER_LOG,
    PLUGIN,
    REQUESTS,
    SCRIPT,
    "first_divergence/rank{r}.json",
    "clean_state/rank{r}.json",
)
