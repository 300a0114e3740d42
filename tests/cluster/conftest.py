"""Fixtures for the multi-node tests: real sshd nodes (sshd.py) and a PP2 job across them."""

from __future__ import annotations

import pytest

from tests.cluster.sshd import start_cluster, start_pp_job


@pytest.fixture
def ssh_cluster(tmp_path):
    cluster = start_cluster(tmp_path)
    yield cluster
    cluster.stop()


@pytest.fixture
def pp2_job(ssh_cluster):
    """PP0 on node-1, PP1 on node-2 (each node sees only its own)."""
    return ssh_cluster, start_pp_job(ssh_cluster)
