"""Triage across machines through the cluster's own launcher (docs/cluster.md): an executor
per launcher (local, ssh, slurm, kubectl) ships collector.py to each node through stdin and
brings back one JSON document per node."""
