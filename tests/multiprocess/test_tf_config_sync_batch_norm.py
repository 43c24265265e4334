"""Synchronised batch norm in a job whose tasks a cluster manager starts, each told its task in TF_CONFIG (every task
a separate process started by tests/multiprocess/task_manager.py, none by Parallax): a Keras 3 model with a
``BatchNormalization(synchronized=True)`` trained by a ``tf.function`` step through ``parallel_run``, each of 2
workers taking its part of every global batch, trains as the same program on one device on the union batch (every
step's loss, every weight, the moving mean and variance among them), with workers only (layout MPI over TF collectives)
and refused beside a ps task (whose workers would sum with MPI, which such tasks lack);
``Config(sync_batch_norm=True)`` with a step's plain ``BatchNormalization()`` is refused in every task, as it is in
a launched job (it reaches the layers of ``parallax.fit``'s model only: docs/tf2_programs.md). The program:
tests/tf2/sync_batch_norm_script.py."""

from __future__ import annotations

import functools
import os
import re

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, leftover_processes
from tests.multiprocess.test_mpi_mode import BATCH, STEPS
from tests.multiprocess.test_tf_config_jobs import check_ids, run_managed, tf_cluster

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "sync_batch_norm_script.py")
WORKERS = 2


@functools.cache
def single_device(norm: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The program on one device, on the whole global batches: each step's loss and every weight, by name."""
    from tests.tf2.sync_batch_norm_script import train

    losses, weights, _ = train(norm, STEPS, BATCH)
    return losses[:, 0], weights


def test_synchronized_batch_norm_trains_as_one_device_on_the_union_batch(tmp_path):
    run = run_managed(tmp_path, tf_cluster(worker=WORKERS), "--norm", "synchronized", script=SCRIPT, timeout=90)
    assert all(task["rc"] == 0 for task in run.tasks.values()), (run.tasks, run.output[-4000:])
    assert f"job: layout MPI, {WORKERS} process(es)" in run.log("worker_0"), run.log("worker_0")
    losses, weights = single_device("synchronized")
    names = list(weights)
    got = [run.rank_values(w) for w in range(WORKERS)]
    # each worker's loss is its own part's mean; the parts are equal, so their mean is the union batch's loss
    union = np.mean([g["losses"][:, 0] for g in got], axis=0)
    np.testing.assert_allclose(union, losses, rtol=1e-5, err_msg="the loss of each step")
    for worker, values in enumerate(got):
        assert len(names) == len([k for k in values if k.startswith("v")]), (names, list(values))
        for i, name in enumerate(names):
            np.testing.assert_allclose(values[f"v{i}"], weights[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"worker {worker}: {name}")
    check_ids(run, WORKERS)  # and no task loaded MPI
    assert not leftover_processes(tmp_path)


def test_synchronized_batch_norm_beside_a_parameter_server_is_refused_in_every_worker(tmp_path):
    """Beside a ps task the statistics would be summed with MPI, which the tasks of a cluster manager do not have
    (their MPI world is each task alone): every worker refuses at its start, naming the way out, rather than
    normalising its part by that part's statistics (what it did, silently, before), and the job ends."""
    run = run_managed(tmp_path, tf_cluster(worker=WORKERS, ps=1), "--norm", "synchronized", script=SCRIPT,
                      timeout=90)
    for name in (f"worker_{w}" for w in range(WORKERS)):
        assert run.tasks[name]["rc"] not in (0, None), (name, run.tasks, run.output[-4000:])
        assert re.search(r"PlanError: the plan sums values over the job's 2 workers with MPI .* its MPI world has 1 "
                         r"process\(es\) .* use run_option='MPI'", run.log(name)), run.log(name)[-3000:]
    assert not leftover_processes(tmp_path)


def test_config_sync_batch_norm_with_a_steps_plain_batch_norm_is_refused_in_every_task(tmp_path):
    """``Config(sync_batch_norm=True)`` asks it of the batch norms of ``parallax.fit``'s model; a ``tf.function``
    step's own layers are the program's (build them with ``synchronized=True``): every task raises the
    ``PlanError`` naming the layer and ends with exit code 1, rather than training otherwise than one device."""
    run = run_managed(tmp_path, tf_cluster(worker=WORKERS), "--norm", "plain", "--sync_batch_norm", script=SCRIPT,
                      timeout=60)
    for name, task in run.tasks.items():
        assert task["rc"] == 1, (name, run.output[-4000:])
        assert re.search(r"PlanError: Config\(sync_batch_norm=True\): \S*/norm\S* normalise by their batch's "
                         "statistics in a way Parallax does not synchronise", run.log(name)), run.log(name)[-3000:]
    assert not leftover_processes(tmp_path)
