"""The accuracy campaign's parts (bench/accuracy.py): random plans, blinding and oracle facts
(`plan.py`), scoring (`score.py`)."""
