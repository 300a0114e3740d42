"""The harness (ours): one trial = launch ranks, watch them, collect evidence, reap, classify."""
