"""What every test runs with: its own Parallax cache, stored tunes off, quiet TensorFlow.

Set at import time, before any test or subprocess starts, so the processes tests launch inherit it:

* ``PARALLAX_CACHE_DIR``: a directory of this pytest process (removed when it ends), so a layout a
  user once stored with ``parallax tune`` (``~/.cache/parallax/tuned.json``), or a partition count a
  search kept, cannot change what a test trains. The compiled all-reduce op is the one exception: it
  depends only on its source and this environment (its directory name is a hash of them), so the
  user's build is linked in rather than compiled again in every run of the suite.
* ``PARALLAX_USE_TUNED=0``: no stored tune applies; a test of the cache asks for it with the
  :func:`tuned_cache` fixture (or ``PARALLAX_USE_TUNED=1`` in its subprocess's environment).
"""

import atexit
import importlib.util
import logging
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: The prefix of the suite's own cache directory (tests/unit/test_suite_setup.py checks it is in force).
TEST_CACHE_PREFIX = "parallax-tests-cache-"


def _own_cache() -> str:
    """A fresh cache directory for this pytest process, with the user's compiled ops linked in."""
    users = os.environ.get("PARALLAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "parallax")
    native = os.path.realpath(os.path.join(users, "native"))  # an xdist worker: through its controller's link
    root = tempfile.mkdtemp(prefix=TEST_CACHE_PREFIX)
    atexit.register(shutil.rmtree, root, True)
    if os.path.isdir(native):
        os.symlink(native, os.path.join(root, "native"))
    return root


os.environ["PARALLAX_CACHE_DIR"] = _own_cache()
os.environ["PARALLAX_USE_TUNED"] = "0"

import pytest  # noqa: E402


def pytest_configure(config):
    # `make test-horovod` runs the multi-process tests with PARALLAX_TEST_BACKEND=horovod (see harness.py)
    if os.environ.get("PARALLAX_TEST_BACKEND") == "horovod" and importlib.util.find_spec("horovod") is None:
        raise pytest.UsageError("PARALLAX_TEST_BACKEND=horovod, but horovod is not installed in this Python "
                                "(`make test-horovod` builds a venv with it)")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects: make test and make test-extended split by this marker
def pytest_collection_modifyitems(items):
    """A multi-process test is ``extended`` unless it is marked ``core``.

    ``make test`` runs the core: in each mode and for each kind of program, one job that trains equal to one
    device and the failures a job must end on (a killed or raising process), so that it stays under 15 minutes on
    two cores; ``make test-extended`` (in CI) runs every other multi-process case. A new multi-process test is
    extended until someone decides it belongs to the core. The virtual cluster's tests have suites of their own.

    A multi-process test's own jobs are bounded by timeouts of their own (a shared job's 420 s, harness.py), which
    pytest's must exceed, with the single-device reference the test trains after it: 600 s unless marked."""
    for item in items:
        if not item.get_closest_marker("multiprocess"):
            continue
        if not item.get_closest_marker("core") and not item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.extended)
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(600))


@pytest.fixture
def tuned_cache(tmp_path, monkeypatch):
    """A test that exercises the stored tunes: an empty cache directory of its own, stored tunes on."""
    cache = tmp_path / "parallax-cache"
    cache.mkdir()
    monkeypatch.setenv("PARALLAX_CACHE_DIR", str(cache))
    monkeypatch.setenv("PARALLAX_USE_TUNED", "1")
    monkeypatch.delenv("PARALLAX_TUNED", raising=False)
    return cache


@pytest.fixture
def parallax_warnings():
    """The messages the PARALLAX logger (``parallax.log``) emits at WARNING and above while the test runs.

    Taken by a handler on that logger: it does not pass its records on to the root logger (where pytest's
    ``caplog`` listens), and its own handler writes to a stream pytest may have swapped."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("PARALLAX")
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


@pytest.fixture
def resource_file(tmp_path):
    """Write a resource file and return its path: ``resource_file("localhost: cpu:0,cpu:1")``."""
    counter = iter(range(1000))

    def write(text: str) -> str:
        path = tmp_path / f"resource_info_{next(counter)}"
        path.write_text(text)
        return str(path)

    return write


def cpu_resources(resource_file, num_replicas: int) -> str:
    return resource_file("localhost: " + ",".join(f"cpu:{i}" for i in range(num_replicas)) + "\n")
