import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


def pytest_configure(config):
    # `make test-horovod` runs the multi-process tests with PARALLAX_TEST_BACKEND=horovod (see harness.py)
    if os.environ.get("PARALLAX_TEST_BACKEND") == "horovod" and importlib.util.find_spec("horovod") is None:
        raise pytest.UsageError("PARALLAX_TEST_BACKEND=horovod, but horovod is not installed in this Python "
                                "(`make test-horovod` builds a venv with it)")


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
