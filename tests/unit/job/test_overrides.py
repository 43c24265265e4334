"""What replaced the script's own settings is said at WARNING: a stored tuned layout names each setting it
replaced with both values, and so does each PARALLAX_* variable; once per job, by the process the user started."""

from __future__ import annotations

import json
import re

import pytest
import tensorflow as tf

import parallax
from parallax.api import _speaks_for_the_job
from parallax.invocation import Invocation, current
from parallax.job.overrides import environment_overrides, environment_warning
from parallax.managers.tf_config import read_tf_config
from parallax.member.joined import JoinedProcess
from parallax.resources.files import parse_resource_file
from parallax.tuning.cache import store_tuned, tune_key

SOURCE = r"\(\S+/tuned\.json \([0-9a-f]{12}\); PARALLAX_USE_TUNED=0 ignores it\)"


def small_graph() -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_mean(tf.square(w * x), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
    return graph


def run_locally(graph: tf.Graph, resources: str, config: parallax.Config) -> None:
    sess, *_ = parallax.parallel_run(graph, resources, parallax_config=config)
    sess.close()


def about(lines: list[str], word: str) -> list[str]:
    return [line for line in lines if word in line]


def test_a_tuned_layout_names_each_setting_it_replaced_with_the_scripts_value_and_the_tuned_one(
        tuned_cache, resource_file, parallax_warnings):
    graph, res = small_graph(), resource_file("localhost: cpu:0,cpu:1\n")
    store_tuned(tune_key(graph, parse_resource_file(res).text, True),
                {"run_option": "PS", "local_aggregation": False, "replicate_variables": True, "zero_stage": 0}, {},
                str(tuned_cache))
    run_locally(graph, res, parallax.Config(run_option="MPI"))  # as tuned: PS, in this process
    (line,) = about(parallax_warnings, "parallax tune")
    assert re.match(rf"^Parallax: using the layout parallax tune found for this graph and resources {SOURCE}: it "
                    r"replaces 2 of the script's settings: Config\.run_option 'MPI' -> 'PS', "
                    r"PSConfig\.local_aggregation True -> False$", line), line


def test_a_tuned_layout_equal_to_the_scripts_settings_says_it_replaces_none(tuned_cache, resource_file,
                                                                           parallax_warnings):
    graph, res = small_graph(), resource_file("localhost: cpu:0,cpu:1\n")
    store_tuned(tune_key(graph, parse_resource_file(res).text, True), {"run_option": "PS", "zero_stage": 0}, {},
                str(tuned_cache))
    run_locally(graph, res, parallax.Config(run_option="ps"))
    (line,) = about(parallax_warnings, "parallax tune")
    assert re.match(rf"^Parallax: using the layout parallax tune found for this graph and resources {SOURCE}: it "
                    r"replaces none of the script's settings \(run_option=PS zero_stage=0: the script's own "
                    r"values\)$", line), line


def test_a_tuned_layout_keeps_applying_to_its_graph_and_resources_only(tuned_cache, resource_file,
                                                                      parallax_warnings):
    graph, res = small_graph(), resource_file("localhost: cpu:0,cpu:1\n")
    store_tuned(tune_key(graph, parse_resource_file(res).text, True), {"run_option": "PS"}, {}, str(tuned_cache))
    run_locally(small_graph(), res, parallax.Config(run_option="PS"))  # the same graph again: applies
    run_locally(small_graph(), resource_file("localhost: cpu:0\n"), parallax.Config(run_option="PS"))  # other
    assert len(about(parallax_warnings, "parallax tune")) == 1


def test_the_suite_ignores_a_stored_layout_unless_a_test_asks(resource_file, parallax_warnings, monkeypatch,
                                                               tmp_path):
    graph, res = small_graph(), resource_file("localhost: cpu:0,cpu:1\n")
    monkeypatch.setenv("PARALLAX_CACHE_DIR", str(tmp_path))  # PARALLAX_USE_TUNED stays the suite's 0
    store_tuned(tune_key(graph, parse_resource_file(res).text, True), {"run_option": "PS"}, {}, str(tmp_path))
    run_locally(graph, res, parallax.Config(run_option="PS"))
    assert not about(parallax_warnings, "parallax tune")


def test_a_tuned_layout_over_an_environment_override_says_where_the_value_it_replaced_came_from(
        tuned_cache, resource_file, parallax_warnings, monkeypatch):
    graph, res = small_graph(), resource_file("localhost: cpu:0,cpu:1\n")
    store_tuned(tune_key(graph, parse_resource_file(res).text, True), {"run_option": "PS"}, {}, str(tuned_cache))
    monkeypatch.setenv("PARALLAX_RUN_OPTION", "HYBRID")
    run_locally(graph, res, parallax.Config(run_option="MPI"))
    assert [line.split(": ", 2)[-1] for line in about(parallax_warnings, "replaces")] == [
        "Config.run_option 'MPI' -> 'HYBRID'; unset PARALLAX_RUN_OPTION to use the script's",
        "it replaces 1 of the script's settings: Config.run_option 'HYBRID' (from PARALLAX_RUN_OPTION) -> 'PS'"]


def test_parallax_run_option_in_the_environment_is_said_at_warning(resource_file, parallax_warnings, monkeypatch):
    monkeypatch.setenv("PARALLAX_RUN_OPTION", "ps")
    run_locally(small_graph(), resource_file("localhost: cpu:0,cpu:1\n"), parallax.Config(run_option="MPI"))
    (line,) = about(parallax_warnings, "PARALLAX_RUN_OPTION")
    assert re.match(r"^Parallax: PARALLAX_RUN_OPTION \(set by parallax manifest --run_option\) replaces the "
                    r"script's setting: Config\.run_option 'MPI' -> 'PS'; unset PARALLAX_RUN_OPTION to use the "
                    r"script's$", line), line


def test_an_environment_override_equal_to_the_scripts_setting_is_not_reported(resource_file, parallax_warnings,
                                                                              monkeypatch):
    monkeypatch.setenv("PARALLAX_RUN_OPTION", "PS")
    res = resource_file("localhost: cpu:0\n")
    monkeypatch.setenv("PARALLAX_RESOURCE_INFO", res)
    run_locally(small_graph(), res, parallax.Config(run_option="ps"))
    assert not about(parallax_warnings, "PARALLAX_")


def test_every_variable_that_replaces_a_scripts_setting_is_listed_with_both_values():
    config = parallax.Config(run_option="HYBRID")
    config.communication_config.mpi_config.mpirun_options = "--bind-to none"
    environ = {"PARALLAX_RESOURCE_INFO": "/jobs/res", "PARALLAX_RUN_OPTION": "mpi",
               "PARALLAX_MPIRUN_OPTIONS": "--mca btl ^openib", "PARALLAX_NUM_PARTITIONS": "8",
               "PARALLAX_FINISH_TIMEOUT": "5"}  # a timeout no script setting covers: not an override
    found = environment_overrides(config, "resource_info", 2, Invocation.from_env(environ))
    assert [(o.variable, o.replaced.describe()) for o in found] == [
        ("PARALLAX_RESOURCE_INFO", "resource_info 'resource_info' -> '/jobs/res'"),
        ("PARALLAX_RUN_OPTION", "Config.run_option 'HYBRID' -> 'MPI'"),
        ("PARALLAX_MPIRUN_OPTIONS", "MPIConfig.mpirun_options '--bind-to none' -> '--bind-to none --mca btl ^openib'"),
        ("PARALLAX_NUM_PARTITIONS", "get_partitioner's partition count 2 -> 8")]
    assert re.match(r"^Parallax: PARALLAX_RESOURCE_INFO \(set by parallax-run --resource_info\) replaces the "
                    r"script's setting: resource_info 'resource_info' -> '/jobs/res'; unset PARALLAX_RESOURCE_INFO "
                    r"to use the script's$", environment_warning(found[0]))


@pytest.mark.parametrize("environ", [
    pytest.param({"PARALLAX_RESOURCE_INFO": "/jobs/res"}, id="the-script-names-no-resource-file"),
    pytest.param({"PARALLAX_NUM_PARTITIONS": "2"}, id="a-count-the-script-asks-for-already"),
    pytest.param({"PARALLAX_RUN_OPTION": " "}, id="an-empty-run-option"),
])
def test_what_replaces_nothing_is_not_listed(environ):
    assert environment_overrides(parallax.Config(), None, 2, Invocation.from_env(environ)) == ()


def test_a_run_option_that_is_none_is_refused_naming_the_variable(monkeypatch):
    with pytest.raises(ValueError, match=r"^PARALLAX_RUN_OPTION='FOO' \(in the environment, replacing "
                                         r"Config\.run_option\): expected one of PS, MPI, HYBRID, AUTO; unset it"):
        environment_overrides(parallax.Config(), None, None, Invocation.from_env({"PARALLAX_RUN_OPTION": "FOO"}))


def test_only_the_process_the_user_started_speaks_for_the_job():
    assert _speaks_for_the_job(None, None)
    assert not _speaks_for_the_job(object(), None)  # a process mpirun started: its launcher spoke
    assert not _speaks_for_the_job(None, None, rerun=True)  # the script run again: its starter spoke


def test_the_overrides_come_from_the_invocation_not_from_this_processs_environment(monkeypatch):
    monkeypatch.setenv("PARALLAX_RUN_OPTION", "MPI")
    assert environment_overrides(parallax.Config(run_option="PS"), None, None, Invocation()) == ()
    (found,) = environment_overrides(parallax.Config(run_option="PS"), None, None, current())
    assert found.replaced.describe() == "Config.run_option 'PS' -> 'MPI'"


@pytest.mark.parametrize("task,speaks", [({"type": "chief", "index": 0}, True), ({"type": "worker", "index": 0}, False),
                                         ({"type": "ps", "index": 0}, False)])
def test_in_a_job_a_cluster_manager_started_its_worker_0_speaks(task, speaks):
    config = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, "task": task})
    assert _speaks_for_the_job(None, JoinedProcess(read_tf_config({"TF_CONFIG": config}))) is speaks
