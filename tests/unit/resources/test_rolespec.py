"""Role specs (Polyaxon's environment section) as resource descriptions: parsed, checked, laid out."""

from __future__ import annotations

import pytest

from parallax.errors import ResourceFileError
from parallax.resources.files import Device, parse_resource_text
from parallax.resources.rolespec import Resources, looks_like_role_spec, parse_role_spec

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
     'line 3: environment.tensorflow has the key "n_worker" \\(did you mean "n_workers"\\?\\); expected one of: '
     'n_workers, n_ps, default_worker, default_ps, worker, ps$'),
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


IGNORED = ("node_selector, tolerations, affinity, annotations, labels, persistence, data_refs, artifact_refs, outputs, "
           "config_map_refs, configmap_refs, secret_refs, service_account, service_account_name, image_pull_secrets, "
           "max_restarts, security_context, env_vars")


@pytest.mark.parametrize("text,message", [
    pytest.param("environment:\n  resources:\n    cpu: {requests: 1}\n  tensorfow:\n    n_workers: 2\n",
                 'line 4: environment has the key "tensorfow" \\(did you mean "tensorflow"\\?\\); expected one of: '
                 rf"resources, tensorflow \(or a key Polyaxon reads and Parallax does not: {IGNORED}\)$",
                 id="in-the-environment-section"),
    pytest.param("tensorfow:\n  n_workers: 2\n  n_ps: 1\n",
                 'line 1: the top level has the key "tensorfow" \\(did you mean "tensorflow"\\?\\); expected one of: '
                 rf"resources, tensorflow \(or a key Polyaxon reads and Parallax does not: {IGNORED}\)$",
                 id="as-the-section-itself"),
    pytest.param("version: 1\nkind: experiment\nenviroment:\n  tensorflow: {n_workers: 2}\n",
                 'line 3: the top level has the key "enviroment" \\(did you mean "environment"\\?\\); expected one '
                 r"of: environment \(or a key Polyaxon reads and Parallax does not: version, kind, name, .*\)$",
                 id="a-polyaxonfiles-environment"),
    pytest.param("environment:\n  replicas:\n    n_workers: 2\n",
                 'line 2: environment has the key "replicas"; expected one of: resources, tensorflow', id="unknown"),
])
def test_a_misspelt_or_unknown_section_is_refused_with_the_close_match_and_the_keys_expected(text, message):
    with pytest.raises(ResourceFileError, match=f"^spec.yaml, {message}"):
        parse_resource_text(text, "spec.yaml")


def test_polyaxons_keys_that_say_nothing_of_the_roles_are_accepted_and_not_read():
    spec = parse_role_spec("environment:\n  node_selector: {gpu: a100}\n  tensorflow: {n_workers: 1}\n", "s")
    assert [t.role for t in spec.tasks] == ["master", "worker"]


def test_a_host_line_without_devices_is_still_a_host_line():
    assert not looks_like_role_spec("localhost:\n") and looks_like_role_spec("tensorfow:\n  n_ps: 1\n")


V1 = """\
# written by parallax manifest
version: 1.1
kind: component
name: demo
run:
  kind: tfjob
  chief:
    replicas: 1
    container:
      name: tensorflow
      resources:
        requests: {cpu: '2', memory: 1Gi}
        limits: {cpu: 4000m, nvidia.com/gpu: 1}
  worker:
    replicas: 2
    container:
      resources:
        limits: {memory: 16384Mi, nvidia.com/gpu: 2}
  ps:
    replicas: 1
    container: {name: tensorflow}
  evaluator:
    replicas: 1
"""


def test_a_v1_polyaxonfile_reads_as_the_tfjob_it_describes():
    spec = parse_role_spec(V1, "polyaxonfile.yaml")
    assert [(t.role, t.index, t.line) for t in spec.tasks] == [("master", 0, 7), ("worker", 0, 14), ("worker", 1, 14),
                                                               ("ps", 0, 19)]  # the evaluator does not train
    assert spec.tasks[0].resources == Resources(cpu=(2, 4), memory=(1024, None), gpu=(None, 1))
    assert spec.of("worker")[1].resources == Resources(memory=(None, 16384), gpu=(None, 2))
    assert spec.of("ps")[0].resources == Resources()
    cluster = parse_resource_text(V1, "polyaxonfile.yaml")
    assert [w.devices for w in cluster.workers] == [(Device("gpu", 0),), (Device("gpu", 1), Device("gpu", 2)),
                                                    (Device("gpu", 3), Device("gpu", 4))]
    assert len(cluster.servers) == 1


def test_without_a_chief_the_first_worker_is_the_master():
    spec = parse_role_spec("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  worker: {replicas: 3}\n", "p")
    assert [(t.role, t.index) for t in spec.tasks] == [("master", 0), ("worker", 0), ("worker", 1)]


@pytest.mark.parametrize("text,message", [
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  wroker: {replicas: 2}\n",
                 'line 5: run has the key "wroker" \\(did you mean "worker"\\?\\); expected one of: kind, chief, '
                 r"worker, ps, evaluator, .* \(a tfjob's keys\)$", id="misspelt-role"),
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  worker: {replica: 2}\n",
                 'line 5: run.worker has the key "replica" \\(did you mean "replicas"\\?\\); expected one of: '
                 r"replicas, container, .* \(a replica's keys\)$", id="misspelt-replicas"),
    pytest.param("version: 1.1\nkind: component\nrnu:\n  kind: tfjob\n",
                 'line 3: the top level has the key "rnu" \\(did you mean "run"\\?\\)', id="misspelt-run"),
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: job\n",
                 r"line 4: run.kind is 'job'; expected 'tfjob' \(a chief, workers and ps tasks", id="not-a-tfjob"),
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  chief: {replicas: 2}\n",
                 r"line 5: run.chief.replicas is 2; expected at most 1 \(the chief is worker 0\)$", id="two-chiefs"),
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  ps: {replicas: 1}\n",
                 "line 3: run has no chief or worker replica; expected at least one task that trains$", id="no-worker"),
    pytest.param("version: 1.1\nkind: component\nrun:\n  kind: tfjob\n  worker:\n    container:\n"
                 "      resources: {limits: {memory: lots}}\n",
                 r"line 7: run.worker.container.resources.limits.memory is 'lots'; expected a Kubernetes memory "
                 r"quantity, e.g. '512Mi' or '8Gi'$", id="bad-quantity"),
])
def test_a_bad_v1_polyaxonfile_names_the_line_and_the_key(text, message):
    with pytest.raises(ResourceFileError, match=f"^polyaxonfile.yaml, {message}"):
        parse_resource_text(text, "polyaxonfile.yaml")
