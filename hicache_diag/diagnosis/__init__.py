"""Analysis of a run directory (the recorded history only, never a live runtime).

`classify_run(run_dir)` is the entry point the harness and `report` call.
"""

from hicache_diag.diagnosis.classify import classify_run

__all__ = ["classify_run"]
