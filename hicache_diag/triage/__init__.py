"""Triage a live or dead PP+HiCache cluster: dump every rank, classify crash vs hang, name the
culprit rank and where it waits (docs/design.md §5)."""

from hicache_diag.triage.report import TRIAGE_SCHEMA, RankReport, TriageReport
from hicache_diag.triage.session import TriageRequest, run_triage

__all__ = ["TRIAGE_SCHEMA", "RankReport", "TriageReport", "TriageRequest", "run_triage"]
