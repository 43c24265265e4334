"""What is in force for a parallel_run call (parallax/job/in_force.py): every replacement of the script's settings
applied in one place, in its order, with the list the door reports from."""

from __future__ import annotations

import pytest

import parallax
from parallax.invocation import Invocation, PlanRequest, SearchRequest, TrialRequest
from parallax.job.in_force import InForce, in_force, with_tuned


def test_the_scripts_settings_stand_when_nothing_replaces_them():
    config = parallax.Config(run_option="PS")
    force = in_force(config, "resource_info", Invocation())
    assert force == InForce(config, "resource_info", (), ())


def test_the_environment_replaces_the_resources_and_run_option_and_says_so():
    force = in_force(parallax.Config(run_option="PS"), "resource_info",
                     Invocation(resource_info="/jobs/res", run_option="mpi", mpirun_options="--mca btl ^openib"))
    assert (force.resource_info, force.config.run_option) == ("/jobs/res", "MPI")
    assert [o.variable for o in force.environment] == [
        "PARALLAX_RESOURCE_INFO", "PARALLAX_RUN_OPTION", "PARALLAX_MPIRUN_OPTIONS"]


def test_a_partition_count_is_not_a_config_replacement():
    """get_partitioner applies PARALLAX_NUM_PARTITIONS while the script builds its graph; the door reports it."""
    force = in_force(parallax.Config(), None, Invocation(search=SearchRequest(partitions=8)))
    assert force.environment == ()


def test_a_plan_request_outranks_the_environment_and_adds_its_overrides_and_fields():
    request = PlanRequest(resource_info="/plan/res", run_option="HYBRID", overrides={"w": "ps"},
                          fields={"micro_batches": 2})
    force = in_force(parallax.Config(run_option="PS", plan_overrides={"v": "allreduce"}), "resource_info",
                     Invocation(run_option="MPI", plan=request))
    assert (force.resource_info, force.config.run_option) == ("/plan/res", "HYBRID")
    assert set(force.config.plan_overrides) == {"v", "w"}
    assert force.config.micro_batches == 2


def test_a_trial_runs_its_choice_and_an_elastic_rank_its_launchers_checkpoints():
    trial = TrialRequest(choice={"run_option": "MPI", "fusion_bytes": 1024})
    force = in_force(parallax.Config(run_option="PS"), None, Invocation(
        trial=trial, elastic_ckpt='{"ckpt_dir": "/ckpt", "save_ckpt_steps": 5, "save_ckpt_secs": null}'))
    assert force.config.run_option == "MPI"
    assert force.config.communication_config.mpi_config.fusion_bytes == 1024
    assert (force.config.ckpt_config.ckpt_dir, force.config.ckpt_config.save_ckpt_steps) == ("/ckpt", 5)


def test_the_launchers_elastic_options_and_timeouts_replace_the_scripts():
    force = in_force(parallax.Config(stall_shutdown=60.0), None, Invocation(
        elastic='{"max_restarts": 3}', stall_shutdown="none", staggered_start=True))
    assert force.config.elastic_config.max_restarts == 3
    assert force.config.stall_shutdown is None
    assert force.config.staggered_start is True


def test_a_run_option_that_is_none_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=r"^PARALLAX_RUN_OPTION='FOO'"):
        in_force(parallax.Config(), None, Invocation(run_option="FOO"))


def test_a_tuned_layout_is_applied_with_each_setting_it_replaced():
    force = in_force(parallax.Config(run_option="PS"), None, Invocation())
    tuned, rebuild = with_tuned(force, {"run_option": "MPI", "fusion_bytes": 4096}, None, Invocation())
    assert rebuild is None
    assert (tuned.config.run_option, tuned.config.communication_config.mpi_config.fusion_bytes) == ("MPI", 4096)
    assert tuned.tuned[0].describe() == "Config.run_option 'PS' -> 'MPI'"


def test_a_run_option_from_the_environment_is_named_as_the_value_a_tuned_layout_replaced():
    invocation = Invocation(run_option="HYBRID")
    tuned, _ = with_tuned(in_force(parallax.Config(run_option="PS"), None, invocation), {"run_option": "MPI"}, None,
                          invocation)
    assert tuned.tuned[0].describe() == "Config.run_option 'HYBRID' (from PARALLAX_RUN_OPTION) -> 'MPI'"


@pytest.mark.parametrize("given,rebuild", [(None, 8), (4, None)], ids=["tuned-count", "the-users-count-stays"])
def test_a_tuned_partition_count_the_graph_lacks_runs_the_script_again(given, rebuild):
    invocation = Invocation(search=SearchRequest(partitions=given))
    force = in_force(parallax.Config(run_option="PS"), None, invocation)
    tuned, again = with_tuned(force, {"run_option": "MPI", "partitions": 8}, 2, invocation)
    assert again == rebuild
    if rebuild:  # the run with the tuned count applies the rest
        assert tuned.config == force.config
        assert tuned.tuned[-1].describe() == "get_partitioner's partition count 2 -> 8"
    else:
        assert tuned.config.run_option == "MPI"


def test_a_step_averages_sparse_gradients_unless_the_script_says():
    assert in_force(parallax.Config(), None, Invocation(), step=True).config.average_sparse is True
    assert in_force(parallax.Config(average_sparse=False), None, Invocation(), step=True).config.average_sparse is False
    assert in_force(parallax.Config(), None, Invocation()).config.average_sparse is None  # a graph: the seed's sum


def test_a_step_left_to_the_default_layout_takes_the_cost_models_choice():
    """A TensorFlow 2 step's ``run_option=None`` is ``AUTO`` (Keras 3's optimizers update a table's every row: on
    servers it costs their round trips and a dense update); a graph keeps the seed's default (``HYBRID``, decided by
    ``derive``); so does a job a cluster manager starts, planned there or by ``parallax manifest``, and an
    asynchronous one (``PS``)."""
    step = in_force(parallax.Config(), None, Invocation(), step=True)
    assert step.config.run_option == "AUTO" and step.environment == () and step.tuned == ()
    assert in_force(parallax.Config(run_option="HYBRID"), None, Invocation(), step=True).config.run_option == "HYBRID"
    assert in_force(parallax.Config(), None, Invocation(run_option="PS"), step=True).config.run_option == "PS"
    assert in_force(parallax.Config(), None, Invocation()).config.run_option is None
    assert in_force(parallax.Config(), None, Invocation(), step=True, sync=False).config.run_option is None
    managed = '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}'
    assert in_force(parallax.Config(), None, Invocation(tf_config=managed), step=True).config.run_option is None
    manifest = PlanRequest(manifest="tfjob", manager="TF_CONFIG")
    assert in_force(parallax.Config(), None, Invocation(plan=manifest), step=True).config.run_option is None
