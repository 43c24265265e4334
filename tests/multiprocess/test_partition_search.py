"""search_partitions: trials inside the running job, the best count trains, the next run reuses it."""

from __future__ import annotations

import json
import re

import pytest

from tests.models import DATA, build_sequence, train_single_device
from tests.multiprocess.harness import run_script
from tests.multiprocess.test_mpi_mode import BATCH, check_ranks_match, resources

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6  # 1 warm-up + 2 timed steps per trial, then the real run


def search_run(tmp_path, monkeypatch, resource_text, run_option):
    monkeypatch.setenv("PARALLAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PARALLAX_SEARCH_STEPS", "1,2")
    # up to 4 trial jobs and the real run, one after the other: 180 s was too little in CI beside another suite
    return run_script(tmp_path, resource_text, "--run_option", run_option, "--model", "sequence",
                      "--average_sparse", "--steps", str(STEPS), "--batch", str(BATCH), "--search_partitions",
                      timeout=420)


# (HYBRID's trials are jobs as MPI's are: out, for CI's time)
# (one process out for CI's time, 2026-12-04: 73 s; the search's trials and its choice are the same code there)
@pytest.mark.parametrize("resource_text, run_option, workers", [(resources(2), "MPI", 2)], ids=["mpi"])
def test_search_picks_a_count_trains_with_it_and_caches_it(tmp_path, monkeypatch, resource_text, run_option,
                                                           workers):
    run = search_run(tmp_path, monkeypatch, resource_text, run_option)
    assert run.returncode == 0, run.output[-5000:]
    chosen = re.search(r"partition search chose (\d+) partitions \((.*)\) in ([\d.]+) s", run.output)
    assert chosen, run.output[-3000:]
    count = int(chosen.group(1))
    tried = [int(p) for p in re.findall(r"(\d+): [\d.]+ ms/step", chosen.group(2))]
    assert tried[:2] == [2, 4] and count in tried  # from get_partitioner's minimum, doubling
    assert run.output.count("done") == workers  # the script's end ran once per worker: the real run only
    expected = train_single_device(build_sequence("adam", partitions=count), DATA["sequence"](STEPS, BATCH))
    check_ranks_match(run, expected, workers)
    cache = json.loads((tmp_path / "cache" / "partitions.json").read_text())
    assert [entry["partitions"] for entry in cache.values()] == [count]

    again = search_run(tmp_path, monkeypatch, resource_text, run_option)
    assert f"using {count} partitions found by an earlier search" in again.output
    assert "partition search chose" not in again.output
    check_ranks_match(again, expected, workers)
