"""The plugin's per-launch configuration: one JSON file the harness writes, named by an
environment variable that only that launch's processes carry; or, for a production recording
(`hicache-diag record`, or its environment applied to any launch), the recording's own
variables alone (evidence/recording_files.py), so a manifest needs no file of ours."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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
    session_dir: str | None = None  # production: this launch's session folder, no run dir

    @property
    def production(self) -> bool:
        return self.session_dir is not None

    def write(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(asdict(self), fh, indent=1, sort_keys=True)

    @classmethod
    def from_env(cls) -> PluginConfig | None:
        path = os.environ.get(ENV_VAR)
        if not path:
            return production_config(os.environ)
        with open(path) as fh:
            data = json.load(fh)
        data["faults"] = tuple(data.get("faults") or ())
        return cls(**data)


def production_config(environ: Mapping[str, str]) -> PluginConfig | None:
    """The recording's configuration from its variables; None when none is asked for. The
    session is named once per launch: the first process that finds none names it after itself
    and puts it in its environment, so every process it starts (each rank) writes there."""
    # Here, not at the top: this module is read in every process the launch starts (start.py).
    from hicache_diag.evidence.recording_files import (
        CPU_SHIMS_ENV,
        RECORD_DIR_ENV,
        SESSION_ENV,
        SWITCH_ENV,
        session_name,
        switch_state,
    )

    record_dir = environ.get(RECORD_DIR_ENV)
    if not record_dir:
        return None
    session = environ.get(SESSION_ENV) or session_name(os.getpid())
    if environ is os.environ:
        environ[SESSION_ENV] = session
    return PluginConfig(
        run_dir="",
        faults=(),
        cpu_shims=switch_state(environ.get(CPU_SHIMS_ENV, "0")) is True,
        # A value that is neither on nor off leaves recording on: a server is never guessed off.
        record=switch_state(environ.get(SWITCH_ENV)) is not False,
        session_dir=os.path.join(record_dir, session),
    )
