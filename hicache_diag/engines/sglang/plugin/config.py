"""The plugin's per-launch configuration: one JSON file the harness writes, named by an
environment variable that only that launch's processes carry."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

ENV_VAR = "HICACHE_DIAG_PLUGIN_CONFIG"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    run_dir: str
    seed: int = 0
    faults: tuple[str, ...] = ()
    cpu_shims: bool = True
    cpu_kernel_names: dict[str, list[str]] = field(default_factory=dict)
    record: bool = True
    control_dir: str | None = None  # a warm server's trial boundary (clean_state.py)

    def write(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(asdict(self), fh, indent=1, sort_keys=True)

    @classmethod
    def from_env(cls) -> PluginConfig | None:
        path = os.environ.get(ENV_VAR)
        if not path:
            return None
        with open(path) as fh:
            data = json.load(fh)
        data["faults"] = tuple(data.get("faults") or ())
        return cls(**data)
