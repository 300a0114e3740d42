"""Analysis of a run directory (the recorded history only, never a live runtime).

`classify_run(run_dir)` is the entry point the harness and `report` call. It is imported lazily
so that CLI start-up (every bisect trial) does not pay for pandas unless it classifies.
"""

from __future__ import annotations

from typing import Any

__all__ = ["classify_run"]


def __getattr__(name: str) -> Any:
    if name == "classify_run":
        from hicache_diag.diagnosis.classify import classify_run

        return classify_run
    raise AttributeError(name)
