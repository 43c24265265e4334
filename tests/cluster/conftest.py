"""The virtual cluster the multi-host tests run on (tests/cluster/virtual_cluster.py).

One cluster of three hosts for the whole session, made on first use and removed at the
end, also when a test fails; Slurm on it (tests/cluster/slurm_cluster.py) likewise.
``make test-cluster`` installs what it needs and runs
these tests (``-m cluster``); elsewhere they skip, saying why.
"""

from __future__ import annotations

import pytest

from tests.cluster.slurm_cluster import SlurmCluster, missing_slurm
from tests.cluster.virtual_cluster import VirtualCluster, missing_requirements

HOSTS = ("vhost1", "vhost2", "vhost3")


@pytest.fixture(scope="session")
def cluster():
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with VirtualCluster(HOSTS) as made:
        yield made


@pytest.fixture(scope="session")
def slurm(cluster):
    """Slurm (munged, slurmctld, a slurmd per host) on the session's cluster, ended at the end."""
    reason = missing_slurm()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(cluster) as made:
        yield made
