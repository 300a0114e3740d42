"""The builtin engine's manifest: its RunConfig written whole (dataclasses.asdict) and read back
by each rank (`rank_main` rebuilds its config from the run dir, also under torchrun)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hicache_diag.engines.builtin.runtime.protocol import ProtocolConfig
from hicache_diag.engines.builtin.runtime.server_args import ModelConfig, RunConfig, ServerArgs
from hicache_diag.evidence import ranks
from hicache_diag.options.workloads import WorkloadConfig
from hicache_diag.trials.rundir import manifest_head, read_manifest


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    sa = dict(data["server_args"])
    sa["model"] = ModelConfig(**sa["model"])
    return RunConfig(
        server_args=ServerArgs(**sa),
        protocol=ProtocolConfig(**data["protocol"]),
        workload=WorkloadConfig(**data["workload"]),
        faults=tuple(data.get("faults", ())),
        seed=data["seed"],
        out=data.get("out"),
        hang_timeout=data["hang_timeout"],
        max_steps=data["max_steps"],
    )


def topology(sa: ServerArgs) -> dict[str, Any]:
    return ranks.topology(sa.pp_size, sa.tp_size)


def manifest_fields(cfg: RunConfig, argv: list[str], torch_version: str) -> dict[str, Any]:
    """The builtin engine's manifest."""
    return {
        **manifest_head(argv),
        "torch": torch_version,
        "device": cfg.server_args.device,
        "seed": cfg.seed,
        "config": config_to_dict(cfg),
        "protocol": cfg.protocol.as_dict(),
        "faults": list(cfg.faults),
        "topology": topology(cfg.server_args),
    }


def load_config(run_dir: Path) -> RunConfig:
    return config_from_dict(read_manifest(run_dir).config)
