"""hicache-diag: diagnose and reproduce rank divergence in SGLang PP + HiCache."""

__version__ = "0.1.0"
