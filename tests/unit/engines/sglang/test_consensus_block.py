"""The plugin's first-divergence block on SGLang's own rank consensus checker: two real processes
joined by a gloo group run the installed release's `_check_for_consensus` on different events;
each must write its block in the checker's thread and still die with SGLang's `os._exit(1)`."""

from __future__ import annotations

import importlib.util
import json
import logging
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hicache_diag import evidence as ev
from hicache_diag.engines.sglang.plugin import consensus_block
from hicache_diag.engines.sglang.plugin.hook_state import STATE

ROOT = Path(__file__).resolve().parents[4]
RANK = textwrap.dedent(
    """
    import os, sys
    os.environ["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] = "1"
    import torch.distributed as dist
    from hicache_diag.engines.sglang.plugin import consensus_block
    from hicache_diag.engines.sglang.plugin.shims import neutralise_torchvision_meta
    neutralise_torchvision_meta()  # as the plugin does in every SGLang process on CPU
    from hicache_diag.engines.sglang.plugin.hook_state import STATE
    rank, run_dir, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    consensus_block.install(run_dir, rank, rank, 0, STATE)
    from sglang.srt.utils import rank_consensus_checker as rcc
    rcc._sync_groups = [dist.group.WORLD]
    rcc._check_for_consensus(["match_prefix called params=a", f"evict called params={rank}"])
    print("SGLang's checker did not exit", flush=True)
    """
)


def _checker_present() -> bool:
    """The installed release has the checker (looked up, not imported: no SGLang in pytest)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    package = Path(next(iter(spec.submodule_search_locations)))
    return (package / "srt" / "utils" / "rank_consensus_checker.py").is_file()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_every_rank_writes_its_block_then_exits_as_sglang_would(tmp_path):
    if not _checker_present():
        pytest.skip("the installed SGLang has no rank consensus checker")
    for rank in (0, 1):
        steps = [{"step": 7, "rank": rank, "rids": ["r0"]}, {"step": 8, "rank": rank, "idle": True}]
        ev.rank_jsonl(tmp_path, rank).write_text("".join(json.dumps(s) + "\n" for s in steps))
    port = str(_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), str(tmp_path), port],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], [o[1][-2000:] for o in outs]
    assert all("did not exit" not in o[0] for o in outs)
    blocks = ev.read_blocks(tmp_path)
    assert sorted(blocks) == [0, 1]
    for rank, block in blocks.items():
        assert block.pp == rank and block.n_events == 2 and block.local_hash
        assert block.events == ["match_prefix called params=a", f"evict called params={rank}"]
        assert block.thread == "MainThread"  # here the test's thread runs SGLang's check
        assert [s.step for s in block.steps] == [7, 8]
        assert any("_check_for_consensus" in f for s in block.stacks for f in s.frames)
        assert block.errors == ["no scheduler seen yet: queues and pools not read"]
    assert blocks[0].local_hash != blocks[1].local_hash


def test_the_handler_writes_once_and_only_on_the_divergence_line(tmp_path):
    handler = consensus_block.install(str(tmp_path), 3, 1, 1, STATE)
    log = logging.getLogger(consensus_block.CHECKER_LOGGER)
    try:
        log.critical("Rank consensus checker is enabled. The server will suicide ...")
        assert handler.written is None and ev.read_blocks(tmp_path) == {}
        log.critical("Found rank divergence for 1 events(s)! local hash: 0f, events = ['a']")
        log.critical("Found rank divergence for 1 events(s)! local hash: 1f, events = ['b']")
    finally:
        log.removeHandler(handler)
    block = ev.read_blocks(tmp_path)[3]
    assert handler.written == str(ev.divergence_json(tmp_path, 3))
    who = (block.rank, block.pp, block.tp, block.local_hash, block.events)
    assert who == (3, 1, 1, "0f", ["a"])


SWITCH = [("1", True), ("TRUE", True), ("y", True), ("on", False), ("0", False), ("", False)]


@pytest.mark.parametrize(("value", "on"), SWITCH)
def test_the_switch_is_read_as_sglang_reads_it(value, on):
    assert consensus_block.checker_enabled({consensus_block.ENV_VAR: value}) is on
