"""The test suite's own machinery: what make test relies on to run in its time."""

from __future__ import annotations

import os
import subprocess
import sys

from parallax.search import cache_path
from parallax.tuning.cache import USE_TUNED_ENV, tuned_choice

TEST_CACHE_PREFIX = "parallax-tests-cache-"  # tests/conftest.py's


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


def test_the_suite_runs_with_its_own_cache_directory_and_stored_tunes_off():
    """tests/conftest.py sets both at import time: a user's earlier parallax tune (in ~/.cache/parallax)
    cannot change what a test trains."""
    root = os.environ["PARALLAX_CACHE_DIR"]
    assert os.path.basename(root).startswith(TEST_CACHE_PREFIX) and os.path.isdir(root)
    assert os.path.dirname(cache_path("tuned.json")) == root
    assert not os.path.realpath(root).startswith(os.path.realpath(os.path.expanduser("~/.cache")))
    assert os.environ[USE_TUNED_ENV] == "0"


def test_a_subprocess_of_a_test_inherits_the_suites_cache_and_setting():
    code = "import os; print(os.environ['PARALLAX_CACHE_DIR'], os.environ['PARALLAX_USE_TUNED'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [os.environ["PARALLAX_CACHE_DIR"], "0"]


def test_with_stored_tunes_off_a_stored_layout_is_not_looked_up(monkeypatch):
    def no_lookup(*args):
        raise AssertionError("the cache was read")

    monkeypatch.setattr("parallax.tuning.cache.tuned_entry", no_lookup)
    assert tuned_choice(None, "localhost: cpu:0\n", True, launched=False) == (None, "")


def test_a_test_that_asks_for_stored_tunes_gets_an_empty_cache_of_its_own(tuned_cache):
    assert os.environ["PARALLAX_CACHE_DIR"] == str(tuned_cache) and os.environ[USE_TUNED_ENV] == "1"
    assert os.listdir(tuned_cache) == []
