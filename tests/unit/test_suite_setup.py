"""The test suite's own machinery: what make test relies on to run in its time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from parallax.invocation import USE_TUNED_ENV, current
from parallax.tuning.cache import tuned_choice
from parallax.tuning.search import cache_path
from tests.multiprocess.harness import ROOT
from tests.requirements import unavailable

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


# --- a test that cannot run here: a failure under CI, a skip elsewhere (tests/requirements.py) ---------------

@pytest.mark.parametrize("ci, ends_as", [
    ("true", pytest.fail.Exception), ("1", pytest.fail.Exception), ("TRUE", pytest.fail.Exception),
    ("", pytest.skip.Exception), ("false", pytest.skip.Exception), ("0", pytest.skip.Exception),
    (None, pytest.skip.Exception),
], ids=["true", "1", "TRUE", "empty", "false", "0", "unset"])
def test_a_missing_requirement_fails_under_ci_and_skips_elsewhere(ci, ends_as):
    environ = {} if ci is None else {"CI": ci}
    with pytest.raises(ends_as) as ended:
        unavailable("sbatch is not installed", "make cluster-packages installs it", environ)
    assert "sbatch is not installed; make cluster-packages installs it" in str(ended.value)
    assert ("CI=true, so this test must run here" in str(ended.value)) == (ends_as is pytest.fail.Exception)


def test_without_root_the_cluster_tests_fail_under_ci_naming_the_reason(monkeypatch):
    """`make test-cluster` under CI cannot pass with every test skipped: the cluster fixture fails."""
    from tests.cluster.conftest import require_cluster

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true, so this test must run here, but a virtual cluster "
                                                    r"needs root .*; run `make test-cluster` as root"):
        require_cluster()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="a virtual cluster needs root"):
        require_cluster()


def test_without_namespaces_the_cluster_tests_fail_under_ci_naming_the_reason(monkeypatch):
    """Root in a container that may not make namespaces: unshare fails, and the tests say so."""
    import subprocess

    from tests.cluster import virtual_cluster
    from tests.cluster.conftest import require_cluster

    refused = subprocess.CompletedProcess(["unshare"], 1, "", "unshare: unshare failed: Operation not permitted")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(virtual_cluster.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(virtual_cluster.os, "access", lambda path, mode: True)
    monkeypatch.setattr(virtual_cluster.subprocess, "run", lambda *a, **k: refused)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"namespaces, which this machine refuses even to root "
                                                    r"\(unshare --net --uts --mount: unshare: unshare failed: "
                                                    r"Operation not permitted\)"):
        require_cluster()


def test_a_missing_sbatch_is_not_a_valid_manifest(monkeypatch):
    """The manifest tests' check: a validator that is not installed fails under CI, never counts as valid."""
    from parallax.manifests import validate as validators
    from tests.unit.manifests.test_manifests import checked

    monkeypatch.setattr(validators.shutil, "which", lambda tool: None)
    [shell, sbatch] = validators.validate("slurm", {"job.sbatch": "#!/bin/bash\n#SBATCH --nodes=2\ntrue\n"})
    assert shell.ok and sbatch.missing and not sbatch.ok
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"a validator is not installed: job.sbatch: install Slurm's "
                                                    r"sbatch .*`make cluster-packages` installs Slurm"):
        checked("slurm", {"job.sbatch": "#!/bin/bash\n"})
def test_the_suite_runs_with_its_own_cache_directory_and_stored_tunes_off():
    """tests/conftest.py sets both at import time: a user's earlier parallax tune (in ~/.cache/parallax)
    cannot change what a test trains."""
    root = os.environ["PARALLAX_CACHE_DIR"]
    assert os.path.basename(root).startswith(TEST_CACHE_PREFIX) and os.path.isdir(root)
    assert os.path.dirname(cache_path("tuned.json", current().cache_root())) == root
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
    assert tuned_choice(None, "localhost: cpu:0\n", True, False, current()) == (None, "")


def test_a_test_that_asks_for_stored_tunes_gets_an_empty_cache_of_its_own(tuned_cache):
    assert os.environ["PARALLAX_CACHE_DIR"] == str(tuned_cache) and os.environ[USE_TUNED_ENV] == "1"
    assert os.listdir(tuned_cache) == []


# --- which suite runs which test: make test's core, make test-extended, make test-elastic, make test-cluster -----

_COLLECT = """
import json, sys
import pytest

class Selected:
    def pytest_collection_finish(self, session):
        self.ids = [item.nodeid for item in session.items]

out = {}
for name, expression in json.loads(sys.argv[1]).items():
    plugin = Selected()
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", expression, "tests"], plugins=[plugin])
    out[name] = plugin.ids
print("SELECTED " + json.dumps(out))
"""


def _makefile_selection(target: str) -> str:
    """The ``-m`` expression of the pytest command in a Makefile target's recipe (or in a variable it uses:
    ``make test`` and ``make test-nightly`` share ``CORE_SUITE``)."""
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    recipe = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    for variable in re.findall(r"\$\((\w+)\)", recipe):
        defined = re.search(rf"^{variable}\s*[:?]?=((?:.*\\\n)*.*)$", makefile, re.MULTILINE)
        recipe += "\n" + (defined.group(1) if defined else "")
    found = re.search(r'-m "([^"]+)"', recipe)
    assert found, f"no -m expression in the recipe of {target}: {recipe}"
    return found.group(1)


def test_every_test_runs_in_exactly_one_suite_and_the_core_in_make_test():
    """Nothing is left out of CI by the split, nothing runs twice, and a multi-process test marked ``core`` runs in
    ``make test`` (tests/conftest.py marks the others ``extended``)."""
    suites = {target: _makefile_selection(target) for target in ("test", "test-extended", "test-elastic",
                                                                 "test-cluster")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run([sys.executable, "-c", _COLLECT, json.dumps({**suites, "all": "", "core": "core",
                                                                      "multiprocess": "multiprocess"})],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in run.stdout.splitlines() if x.startswith("SELECTED ")]
    assert line, run.stdout[-3000:] + run.stderr[-3000:]
    selected = {name: set(ids) for name, ids in json.loads(line[0][len("SELECTED "):]).items()}
    assert len(selected["all"]) > 1000
    assert set().union(*(selected[t] for t in suites)) == selected["all"]
    assert sum(len(selected[t]) for t in suites) == len(selected["all"])
    assert selected["core"] and selected["core"] <= selected["test"]
    assert selected["test"] & selected["multiprocess"] == selected["core"]
