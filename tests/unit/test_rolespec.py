"""Role specs (Polyaxon's environment section) as resource descriptions: parsed, checked, laid out."""

from __future__ import annotations

import pytest

from parallax.errors import ResourceFileError
from parallax.resources import Device, parse_resource_text
from parallax.rolespec import Resources, looks_like_role_spec, parse_role_spec

SEED_EXAMPLE = """\
environment:
  resources:
    cpu:
      requests: 1
      limits: 2
    memory:
      requests: 256
      limits: 1024
    gpu:
      request: 1
      limits: 1
  tensorflow:
    n_workers: 4
    n_ps: 2
    default_worker:
      resources:
        cpu:
          requests: 1
          limits: 2
        gpu:
          request: 1
          limits: 1
    worker:
      - index: 2
        resources:
          gpu:
            limits: 2
    default_ps:
      resources:
        cpu:
          requests: 1
          limits: 1
"""


def test_the_seed_example_reads_as_its_tasks_with_overrides():
    spec = parse_role_spec(SEED_EXAMPLE, "spec.yaml")
    assert [(t.role, t.index) for t in spec.tasks] == [("master", 0)] + [("worker", i) for i in range(4)] + \
        [("ps", 0), ("ps", 1)]
    master, w2, ps0 = spec.tasks[0], spec.of("worker")[2], spec.of("ps")[0]
    assert master.resources == Resources(cpu=(1, 2), memory=(256, 1024), gpu=(1, 1))
    assert w2.resources.gpus == 2 and w2.line == 24  # the override's line
    assert spec.of("worker")[0].resources.gpus == 1 and spec.of("worker")[0].line == 13  # n_workers' line
    assert ps0.resources.cpu == (1, 1)


def test_on_one_machine_each_worker_takes_the_next_gpus_and_ps_become_servers():
    cluster = parse_resource_text(SEED_EXAMPLE, "spec.yaml")
    assert [w.devices for w in cluster.workers] == [
        (Device("gpu", 0),), (Device("gpu", 1),), (Device("gpu", 2),), (Device("gpu", 3), Device("gpu", 4)),
        (Device("gpu", 5),)]
    assert len(cluster.servers) == 2 and cluster.explicit_roles and cluster.source == "spec.yaml"


def test_without_gpus_every_worker_has_one_cpu_replica_and_defaults_fall_back_to_the_master():
    cluster = parse_resource_text("tensorflow:\n  n_workers: 2\n", "s")
    assert [w.devices for w in cluster.workers] == [(Device("cpu", 0),)] * 3 and not cluster.servers
    spec = parse_role_spec("environment:\n  resources: {gpu: {limits: 2}}\n  tensorflow: {n_workers: 1}\n")
    assert spec.of("worker")[0].resources.gpus == 2


def test_a_whole_polyaxonfile_is_read_for_its_environment():
    text = "version: 1\nkind: experiment\nenvironment:\n  tensorflow:\n    n_ps: 1\nrun:\n  cmd: python train.py\n"
    assert looks_like_role_spec(text)
    assert len(parse_resource_text(text).servers) == 1


@pytest.mark.parametrize("text,message", [
    ("environment:\n  tensorflow:\n    n_worker: 2\n",
     'line 3: environment.tensorflow has the key "n_worker"; expected one of: n_workers, n_ps'),
    ("environment:\n  tensorflow:\n    n_workers: -1\n",
     "line 3: environment.tensorflow.n_workers -1 is less than the minimum of 0; expected an integer >= 0"),
    ("environment:\n  tensorflow:\n    n_workers: 1\n    worker:\n      - index: 3\n",
     "line 5: tensorflow.worker\\[0\\] has index 3, but n_workers is 1"),
    ("tensorflow:\n  n_workers: two\n", "line 2: tensorflow.n_workers 'two' is not of type 'integer'"),
    ("tensorflow:\n  worker:\n    - resources: {}\n",
     "line 3: tensorflow.worker\\[0\\] 'index' is a required property"),
    ("environment:\n  resources:\n    gpu: {limits: 1.5}\n", "line 3: environment.resources.gpu.limits 1.5"),
    ("environment:\n  resources:\n    tpu: {limits: 1}\n", 'line 3: environment.resources has the key "tpu"'),
    ("environment:\n  pytorch:\n    n_workers: 3\n", "line 2: environment describes another framework"),
    ("environment:\n  resources: [1\n", "line 3: not valid YAML"),
])
def test_a_bad_spec_names_the_line_and_the_key(text, message):
    with pytest.raises(ResourceFileError, match=f"^spec.yaml, {message}"):
        parse_resource_text(text, "spec.yaml")


def test_host_lines_are_not_role_specs():
    assert not looks_like_role_spec("# c\nlocalhost: cpu:0\n") and not looks_like_role_spec("ps,h,1,\n")
