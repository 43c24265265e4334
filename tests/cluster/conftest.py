"""The virtual cluster the multi-host tests run on (tests/cluster/virtual_cluster.py).

One cluster of three hosts for the whole session, made on first use and removed at the
end, also when a test fails; Slurm on it (tests/cluster/slurm_cluster.py) likewise.
``make test-cluster`` installs what it needs and runs these tests (``-m cluster``). Where
they cannot run (not root, no namespaces, a package missing) they skip, saying why, except
under CI (``CI=true``): there they fail, so that ``make test-cluster`` cannot pass without
having run them (tests/requirements.py).
"""

from __future__ import annotations

import pytest

from tests.cluster.slurm_cluster import SlurmCluster, missing_slurm
from tests.cluster.virtual_cluster import VirtualCluster, missing_requirements
from tests.requirements import unavailable

HOSTS = ("vhost1", "vhost2", "vhost3")
REMEDY = "run `make test-cluster` as root (it installs openssh-server, slurm-wlm, munge, iproute2)"


def require_cluster() -> None:
    """Return if a virtual cluster can be made here; else fail (under CI) or skip, saying why."""
    reason = missing_requirements()
    if reason:
        unavailable(reason, REMEDY)


@pytest.fixture
def cluster_possible() -> None:
    """For a test that makes virtual clusters of its own (benchmarks/scale.py does)."""
    require_cluster()


@pytest.fixture(scope="session")
def cluster():
    require_cluster()
    with VirtualCluster(HOSTS) as made:
        yield made


@pytest.fixture(scope="session")
def slurm(cluster):
    """Slurm (munged, slurmctld, a slurmd per host) on the session's cluster, ended at the end."""
    reason = missing_slurm()
    if reason:
        unavailable(reason, REMEDY)
    with SlurmCluster(cluster) as made:
        yield made
