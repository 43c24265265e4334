"""TF_CONFIG read into the job's cluster and this task (pure, no processes)."""

from __future__ import annotations

import json

import pytest

from parallax.errors import LaunchError, ResourceFileError
from parallax.managers.tf_config import Task, read_tf_config
from parallax.resources.files import parse_resource_text


def env(cluster, task=None, **extra) -> dict[str, str]:
    data = {"cluster": cluster, **extra}
    if task is not None:
        data["task"] = task
    return {"TF_CONFIG": json.dumps(data)}


TFJOB = {"chief": ["job-chief-0.ns.svc:2222"], "worker": ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"],
         "ps": ["job-ps-0.ns.svc:2222", "job-ps-1.ns.svc:2222"], "evaluator": ["job-evaluator-0.ns.svc:2222"]}


def test_a_tfjob_becomes_an_explicit_role_cluster_chief_first():
    job = read_tf_config(env(TFJOB, {"type": "worker", "index": 1}))
    cluster = parse_resource_text(job.cluster_text, source=job.source)
    assert [(w.host, w.port) for w in cluster.workers] == [
        ("job-chief-0.ns.svc", 2222), ("job-worker-0.ns.svc", 2222), ("job-worker-1.ns.svc", 2222)]
    assert [(s.host, s.port) for s in cluster.servers] == [("job-ps-0.ns.svc", 2222), ("job-ps-1.ns.svc", 2222)]
    assert job.task == Task("worker", "job-worker-1.ns.svc", 2222, "worker 1")
    assert job.source == "TF_CONFIG (task worker 1)"
    assert job.name_of("job-ps-1.ns.svc", 2222) == "ps 1"


def test_the_evaluator_is_left_out_and_refused_in_its_own_task():
    job = read_tf_config(env(TFJOB, {"type": "chief", "index": 0}))
    assert "evaluator" not in job.cluster_text and len(job.tasks) == 5
    with pytest.raises(LaunchError, match="evaluator task: Parallax trains on the chief/master, worker and ps"):
        read_tf_config(env(TFJOB, {"type": "evaluator", "index": 0}))


def test_sagemaker_names_the_chief_master():
    job = read_tf_config(env({"master": ["algo-1:2223"], "worker": ["algo-2:2223"], "ps": ["algo-1:2222"]},
                             {"type": "master", "index": 0}, environment="cloud"))
    assert job.task.name == "master 0" and job.task.role == "worker"
    assert job.cluster_text == "worker,algo-1,2223,\nworker,algo-2,2223,\nps,algo-1,2222,\n"


def test_workers_only_and_ipv6_addresses():
    job = read_tf_config(env({"worker": ["[::1]:5000", "[::1]:5001"]}, {"type": "worker", "index": 1}))
    assert job.task == Task("worker", "[::1]", 5001, "worker 1")
    assert parse_resource_text(job.cluster_text).workers[1].port == 5001


@pytest.mark.parametrize("value", ["", "  ", json.dumps({"cluster": {}}), json.dumps({"task": {"type": "worker"}})])
def test_no_cluster_means_no_managed_job(value):
    assert read_tf_config({"TF_CONFIG": value}) is None
    assert read_tf_config({}) is None


@pytest.mark.parametrize("config,message", [
    ("{not json", "TF_CONFIG is not JSON"),
    ("[1, 2]", "TF_CONFIG is list, not a JSON object"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "TF_CONFIG has a cluster but no task"),
    (json.dumps({"cluster": {"boss": ["a:1"]}, "task": {"type": "boss"}}), 'cluster has task type "boss"'),
    (json.dumps({"cluster": {"worker": ["a"]}, "task": {"type": "worker"}}),
     'cluster.worker\\[0\\] is "a"; expected "host:port"'),
    (json.dumps({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker"}}), "port 1-65535"),
    (json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}), "cluster.worker is str"),
    (json.dumps({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker"}}),
     "worker 1 and worker 0 share the address a:1"),
    (json.dumps({"cluster": {"chief": ["a:1"], "master": ["b:1"]}, "task": {"type": "chief"}}),
     "more than one chief"),
    (json.dumps({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}}), "no chief, master or worker task"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}),
     "task worker 3 is not in the cluster \\(it has 1 worker task\\(s\\)\\)"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}}), "task.index is \"x\""),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "boss"}}), 'task.type is "boss"'),
])
def test_malformed_tf_config_names_the_key(config, message):
    with pytest.raises(ResourceFileError, match=message):
        read_tf_config({"TF_CONFIG": config})


@pytest.mark.parametrize("task", [{"type": "worker", "index": 0}, {"type": "chief", "index": 0}, {}])
def test_an_empty_cluster_whose_task_is_worker_0_trains_alone(task):
    assert read_tf_config({"TF_CONFIG": json.dumps({"cluster": {}, "task": task})}) is None


@pytest.mark.parametrize("task,named", [({"type": "worker", "index": 1}, "worker 1"), ({"type": "ps"}, "ps 0"),
                                        ({"type": "evaluator", "index": 0}, "evaluator 0")])
def test_an_empty_cluster_whose_task_is_not_worker_0_is_refused_naming_the_mismatch(task, named):
    config = json.dumps({"cluster": {}, "task": task})
    with pytest.raises(ResourceFileError, match=(
            rf"^TF_CONFIG: the cluster is empty, but the task is {named}: with no cluster this process would train "
            rf"alone as worker 0, not as {named} of a job\. Expected \"cluster\" to list every task of the job "
            r"\(.*\), or, for one process training alone, \"task\": \{\"type\": \"worker\", \"index\": 0\} "
            r"\(or no TF_CONFIG\)$")):
        read_tf_config({"TF_CONFIG": config})


def test_an_empty_cluster_with_a_malformed_task_names_the_task():
    with pytest.raises(ResourceFileError, match=r'^TF_CONFIG: the cluster is empty, and the task is "worker"; '
                                                r'expected "task": \{"type": "worker", "index": 0\}'):
        read_tf_config({"TF_CONFIG": json.dumps({"cluster": {}, "task": "worker"})})


def test_a_sparse_cluster_is_read_by_index():
    job = read_tf_config(env({"worker": {"1": "b:2", "0": "a:1"}}, {"type": "worker", "index": 0}))
    assert [t.host for t in job.tasks] == ["a", "b"]
