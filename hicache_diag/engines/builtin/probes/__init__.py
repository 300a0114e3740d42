"""Probes: what each rank records about itself, one jsonl line per scheduler step (ours)."""
