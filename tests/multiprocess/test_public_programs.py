"""Public TF1 programs (tests/programs: the CIFAR-10 tutorial, tf_cnn_benchmarks, the PTB language model),
rewritten small and run as their authors wrote them, in every mode on two processes, against the same
program on one device: every variable, what each step fetched, what the hooks logged.

Every worker reads the same batches (the input is a queue or an iterator in the graph, as in the programs),
so one device on those batches is the reference. Sparse gradients are averaged (``average_sparse``).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, ScriptJobs

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "programs", "run.py")
RESOURCES = {"PS": "localhost: cpu:0\nlocalhost: cpu:1\n", "MPI": "localhost: cpu:0,cpu:1\n",
             "HYBRID": "localhost: cpu:0,cpu:1\n", "AUTO": "localhost: cpu:0\nlocalhost: cpu:1\n"}
CASES = ("cifar10:queue", "cifar10:dataset", "cnn_benchmark:ref", "cnn_benchmark:resource", "ptb:ref", "ptb:resource",
         "ptb:resume")
STEPS, EPOCHS = 6, 2  # as run.py


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One job per mode trains every case in turn."""
    groups = {mode: (text, ["--run_option", mode]) for mode, text in RESOURCES.items()}
    return ScriptJobs(tmp_path_factory, SCRIPT, groups, list(CASES))


@functools.cache
def reference(case: str):
    """(what one device's run fetched or logged, its final variables)."""
    from tests.programs import cifar10, cnn_benchmark, ptb

    name, _, variant = case.partition(":")
    if name == "cifar10":
        program, values = cifar10.single_device(variant, STEPS)
        return program.logger.lines, values
    if name == "cnn_benchmark":
        fetched, values = cnn_benchmark.single_device(variant == "resource", STEPS)
        return [{"global_step": int(f["global_step"]), "loss": float(f["loss"])} for f in fetched], values
    with tempfile.TemporaryDirectory() as directory:
        fetched, values = ptb.single_device(variant != "ref", EPOCHS, directory)
        if variant == "resume":
            fetched, values = ptb.single_device(True, 1, directory, first=EPOCHS)
    return [(float(assigned), [float(c) for c in costs]) for assigned, costs in fetched], values


def rank_output(out: str, rank: int) -> tuple[dict, dict]:
    with open(os.path.join(out, f"rank_{rank}.json")) as f:
        record = json.load(f)
    with np.load(os.path.join(out, f"rank_{rank}.npz")) as data:
        return record, {k.replace("__", "/"): data[k] for k in data.files}


def check_values(got: dict, expected: dict, where: str) -> None:
    assert sorted(got) == sorted(expected), where
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{where}: {name}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=[pytest.mark.xdist_group(f"programs-{m}")]
                                                 + [pytest.mark.core] * (m == "MPI"))  # make test: MPI's job
                                  for m in ("MPI", "PS", "HYBRID", "AUTO")])
def test_a_public_program_in_two_processes_equals_the_same_program_on_one_device(jobs, mode, case):
    out = jobs.case(mode, case)
    fetched, values = reference(case)
    for rank in range(2):
        record, got = rank_output(out, rank)
        where = f"{mode} {case} rank {rank}"
        check_values(got, values, where)
        if case.startswith("cifar10"):  # the hooks saw the program's steps, with one device's losses, and no more
            assert record["runs"] == STEPS and record["logged"] == fetched, where
        elif case.startswith("cnn_benchmark"):  # the increment it fetches: the global step after each step
            assert [f["global_step"] for f in record["fetched"]] == [[f["global_step"]] for f in fetched], where
            np.testing.assert_allclose([f["loss"][0] for f in record["fetched"]], [f["loss"] for f in fetched],
                                       rtol=1e-5, err_msg=where)
        else:  # the learning rate the program assigned, and every step's cost
            assert [a[0] for a, _ in record["fetched"]] == [a for a, _ in fetched], where
            np.testing.assert_allclose([[c[0] for c in costs] for _, costs in record["fetched"]],
                                       [costs for _, costs in fetched], rtol=1e-5, err_msg=where)
    if case in ("ptb:ref", "ptb:resource"):  # the program's own Saver wrote one device's names and values
        import tensorflow as tf

        from tests.programs import ptb

        reader = tf.train.load_checkpoint(os.path.join(out, "ckpt"))
        assert record["saved"].endswith(f"model.ckpt-{EPOCHS * ((ptb.WORDS // ptb.BATCH - 1) // ptb.NUM_STEPS)}")
        check_values({n: reader.get_tensor(n) for n in values}, values, f"{mode} {case} checkpoint")
