"""``parallax.fit`` in a job whose tasks a cluster manager starts, each told its task in TF_CONFIG (every task a
separate process started by tests/multiprocess/task_manager.py, none by Parallax, no MPI among them): the workers
sum their metrics over worker 0's server (parallax/comm/chief_queues.py), and every worker's History, weights,
sharded evaluation and predictions equal ``model.fit``'s on one device, as in a launched job
(tests/multiprocess/test_keras_fit.py, whose program and checks these are): two workers alone (MPI over
TensorFlow's collectives), and two beside a parameter server (PS). Until 2026-12-07 ``parallax.fit`` refused such
jobs ("sums the metrics over the workers, which the tasks of a job a cluster manager starts cannot do")."""

from __future__ import annotations

import os

import pytest

from tests.multiprocess.harness import ROOT, leftover_processes
from tests.multiprocess.test_keras_fit import check_case
from tests.multiprocess.test_tf_config_jobs import run_managed, tf_cluster

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "fit_script.py")
WORKERS = 2


@pytest.mark.parametrize("layout, servers, case", [("MPI", 0, "shuffled"), ("PS", 1, "tf_keras-legacy")])
def test_parallax_fit_in_tasks_a_cluster_manager_started_equals_model_fit(tmp_path, layout, servers, case):
    run = run_managed(tmp_path, tf_cluster(worker=WORKERS, ps=servers), "--run_option", layout, case, script=SCRIPT,
                      timeout=180, sized=False)
    assert all(task["rc"] == 0 for task in run.tasks.values()), (run.tasks, run.output[-4000:])
    assert f"job: layout {layout}" in run.log("worker_0"), run.log("worker_0")[-3000:]
    check_case(os.path.join(run.out_dir, case), case, WORKERS, f"TF_CONFIG {layout}")
    assert not leftover_processes(tmp_path)
