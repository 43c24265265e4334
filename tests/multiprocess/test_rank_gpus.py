"""Each launched rank starts with its own GPUs in ``CUDA_VISIBLE_DEVICES`` (no GPU here: the ranks
run no TensorFlow, they report the variable they were started with), and with its own share of the
machine's cores."""

from __future__ import annotations

import json
import os

import pytest

from tests.multiprocess.harness import ROOT, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.core]

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "barrier_script.py")


def test_each_rank_starts_with_its_own_gpus_and_a_rank_without_gpus_with_none(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = run_script(tmp_path, "localhost: 3,1\nlocalhost: cpu:0\nlocalhost: 2\n", script=SCRIPT, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    seen = [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in range(4)]
    assert [(s["rank"], s["size"], s["gpus"]) for s in seen] == [(0, 4, "3"), (1, 4, "1"), (2, 4, ""), (3, 4, "2")]


def test_a_bare_host_of_four_gpus_starts_four_ranks_each_with_one(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = run_script(tmp_path, "localhost\n", "--gpus", "4", script=SCRIPT, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    seen = [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in range(4)]
    assert [(s["size"], s["gpus"]) for s in seen] == [(4, "0"), (4, "1"), (4, "2"), (4, "3")]


def test_each_rank_of_a_job_on_this_machine_runs_on_its_own_share_of_the_cores(tmp_path):
    from parallax.resources.cluster import usable_cores

    cores = usable_cores()
    run = run_script(tmp_path, "localhost: cpu:0,cpu:1\n", script=SCRIPT, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    told = [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in range(2)]
    seen = [set(t["cores"]) for t in told]
    if cores < 2:  # more ranks than cores: not bound
        assert seen[0] == seen[1] and [t["bound"] for t in told] == [None, None]
    else:  # each told how many are its own (its thread pools' size: Settings.threads_per_process)
        assert not seen[0] & seen[1] and len(seen[0]) == len(seen[1]) == cores // 2
        assert [t["bound"] for t in told] == [cores // 2] * 2
        assert seen[0] | seen[1] <= os.sched_getaffinity(0)
