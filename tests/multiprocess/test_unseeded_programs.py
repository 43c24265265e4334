"""A program that seeds nothing (tests/tf2/unseeded_script.py: TensorFlow's "Load NumPy data" shape, synthetic arrays
from ``np.random``, an unseeded ``Dataset.shuffle``, a vocabulary read from a ``set`` of words, weights initialised
without seeds) trained by ``parallax.fit`` on 2 processes (MPI in ``make test``, HYBRID in the extended
suite): every rank seeds its generators with the job's seed before the program runs (parallax/member/seeds.py), so
both workers prepare the same data and draw the same order, and the job equals ``model.fit`` of the same program on
one device with its generators so seeded (History and weights, rtol 1e-5). Until 2026-12-06 ``parallax.fit`` refused
such data at its first batch: each worker had shuffled its own order."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, run_command, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = f"{ROOT}/tests/tf2/unseeded_script.py"
RESOURCES = "localhost: cpu:0\nlocalhost: cpu:1\n"


# (PS out for CI's time, 2026-12-07: 30 s; HYBRID seeds both of its paths, the table the chief initialises on a
# server as PS does and the dense weights each worker initialises as MPI does)
@pytest.mark.parametrize("mode", [pytest.param("MPI", marks=pytest.mark.core), "HYBRID"])
def test_a_program_that_seeds_nothing_trains_as_one_device_with_the_jobs_seed(tmp_path, mode):
    job = run_script(tmp_path / "job", RESOURCES, "--run_option", mode, timeout=240, script=SCRIPT)
    assert job.returncode == 0, job.output[-4000:]
    ranks = [json.loads((tmp_path / "job" / "out" / f"rank_{r}.json").read_text()) for r in range(2)]
    seed, hash_seed = ranks[0]["seed"], ranks[0]["hash_seed"]
    assert [(r["seed"], r["hash_seed"]) for r in ranks] == [(seed, hash_seed)] * 2 and seed is not None
    reference = run_command(tmp_path / "reference", [sys.executable, SCRIPT, "--resource_info", "-", "--run_option",
                                                     "-", "--out", str(tmp_path / "job" / "out"), "--reference",
                                                     str(seed)], env={"PYTHONHASHSEED": hash_seed}, timeout=240)
    assert reference.returncode == 0, reference.output[-4000:]
    expected = json.loads((tmp_path / "job" / "out" / "rank_reference.json").read_text())
    for worker, got in enumerate(ranks):
        for key, values in expected["history"].items():
            np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, err_msg=f"worker {worker}: {key}")
        for i, (a, b) in enumerate(zip(got["weights"], expected["weights"], strict=True)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=f"worker {worker}: weight {i}")
