"""The test suite's own machinery: what make test relies on to run in its time."""

from __future__ import annotations


def test_a_group_name_in_the_node_id_reaches_the_scheduler(request):
    """pytest-xdist's --dist loadgroup keeps the tests of one xdist_group (cases sharing one
    multi-process job, tests/multiprocess/harness.py) on one worker by appending the group to
    each item's node id; a pytest whose Node.nodeid ignores it splits the group, and its job
    runs once on each worker."""
    node = request.node
    before = node.nodeid
    node._nodeid = before + "@probe"
    try:
        assert node.nodeid == before + "@probe", "pin pytest<9 (setup.py, the dev extra)"
    finally:
        node._nodeid = before
