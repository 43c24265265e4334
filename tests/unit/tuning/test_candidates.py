"""The layouts parallax tune tries: the space for a graph and resources, each planned, ordered by predicted cost."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.cli import parse_space
from parallax.config import Config
from parallax.job.plan import plan_job
from parallax.resources.files import parse_resource_text
from parallax.tuning.candidates import Candidate, layout_space, plan_candidates
from tests.models import build_deep_mlp, build_embedding


def planned(model, resources: str, restrict=None, partitions=None):
    cluster = parse_resource_text(resources)
    analysis = analyse_graph(model.graph)
    choices = layout_space(cluster, analysis, partitions, restrict)
    plan_cpu = lambda config, sync, c, a: plan_job(config, sync, c, a, gpus=0)  # noqa: E731
    return choices, plan_candidates(cluster, analysis, Config(), True, choices, plan_cpu)


def test_the_space_of_a_dense_model_on_four_devices():
    choices, ranked = planned(build_deep_mlp(), "localhost: cpu:0,cpu:1,cpu:2,cpu:3\n")
    options = {c["run_option"] for c in choices}
    assert options == {"MPI", "PS", "HYBRID"}
    assert {"run_option": "MPI", "backend": "mpi", "zero_stage": 2} in choices
    assert {"run_option": "MPI", "pipeline_stages": 2, "micro_batches": 4} in choices
    assert all("local_aggregation" not in c for c in choices if c["run_option"] == "HYBRID")  # no sparse gradient
    assert len({tuple(sorted(c.items())) for c in choices}) == len(choices)
    orders = [c.order for c in ranked if c.runnable]
    assert orders == list(range(1, len(orders) + 1))


def test_the_order_follows_the_cost_model():
    _, ranked = planned(build_deep_mlp(), "localhost: cpu:0,cpu:1\n", {"run_option": ["MPI"], "backend": ["mpi"],
                                                                      "zero_stage": [0], "pipeline_stages": [1]})
    by_fusion = {c.choice["fusion_bytes"]: c for c in ranked}
    # a buffer per variable costs a collective's rounds of latency each; one fused buffer the fewest
    assert by_fusion[64 << 20].predicted_seconds < by_fusion[0].predicted_seconds
    assert by_fusion[64 << 20].order < by_fusion[0].order
    assert all(c.bytes_per_step > 0 and c.processes == 2 and c.layout == "MPI" for c in ranked)


def test_memory_saving_choices_come_after_data_parallel_ones_and_carry_their_memory():
    _, ranked = planned(build_deep_mlp(), "localhost: cpu:0,cpu:1\n", {"run_option": ["MPI"], "backend": ["mpi"],
                                                                      "fusion_bytes": [64 << 20]})
    plain, zero2 = ranked[0], next(c for c in ranked if c.choice.get("zero_stage") == 2)
    assert plain.choice.get("zero_stage") is None and zero2.order > plain.order
    assert zero2.memory_per_worker < plain.memory_per_worker  # Adam's slots sharded 1/2


def test_sparse_models_try_local_aggregation_and_partition_counts():
    choices, ranked = planned(build_embedding(), "localhost: cpu:0,cpu:1\n", {"run_option": ["PS", "HYBRID"]},
                              partitions=[2, 4])
    assert {c.get("partitions") for c in choices} == {2, 4}
    assert {c.get("local_aggregation") for c in choices if c["run_option"] == "HYBRID"} == {True, False}
    assert all(c.runnable for c in ranked)


def test_a_refused_choice_is_kept_with_its_reason_after_the_rest():
    _, ranked = planned(build_deep_mlp(), "localhost: cpu:0,cpu:1,cpu:2,cpu:3\n",
                        {"run_option": ["PS"], "replicate_variables": [True], "local_aggregation": [True]})
    assert [c.choice["run_option"] for c in ranked] == ["PS"]
    refused = Candidate.from_dict({**Candidate({"run_option": "PS"}).to_dict(), "error": "no"})
    assert not refused.runnable and refused.label == "run_option=PS"


def test_a_restriction_to_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match="unknown key.*colour"):
        planned(build_deep_mlp(), "localhost: cpu:0\n", {"colour": ["red"]})


def test_space_from_the_command_line():
    assert parse_space(["run_option=mpi,ps", "fusion_bytes=0,4194304", "local_aggregation=true,false",
                        "backend=MPI"]) == {"run_option": ["MPI", "PS"], "fusion_bytes": [0, 4194304],
                                            "local_aggregation": [True, False], "backend": ["mpi"]}
    with pytest.raises(ValueError, match="--space 'speed=fast'"):
        parse_space(["speed=fast"])


def test_after_trials_the_untried_follow_what_was_measured():
    """Kinds of layout not yet measured come first; then each candidate is its kind's fastest measured step
    plus the model's difference from it."""
    from parallax.trials.execute import TrialResult
    from parallax.tuning.tuner import TuneTrial, measured_order

    def cand(order, layout, predicted, **choice):
        return Candidate({"run_option": layout, **choice}, predicted, layout=layout, order=order)

    local_a, mpi_a = cand(1, "local", 0.0), cand(2, "MPI", 0.001)
    local_b, mpi_b = cand(3, "local", 0.0005), cand(4, "MPI", 0.0011, fusion_bytes=0)
    zero = cand(5, "MPI", 0.001, zero_stage=1)
    ran = [TuneTrial(local_a, TrialResult("t1", "ok", {}, {"step_seconds": 0.010})),
           TuneTrial(mpi_a, TrialResult("t2", "ok", {}, {"step_seconds": 0.004}))]
    assert measured_order([local_b, mpi_b, zero], ran) == [zero, mpi_b, local_b]
    assert measured_order([local_b, mpi_b], []) == [local_b, mpi_b]  # nothing measured: the model's order


def test_the_tune_command_names_a_missing_file_and_a_bad_space(tmp_path, capsys):
    from parallax.cli import parallax_main

    assert parallax_main(["tune", str(tmp_path / "train.py"), str(tmp_path / "res")]) == 1
    assert f"parallax tune: script {str(tmp_path / 'train.py')!r} not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        parallax_main(["tune", "train.py", "res", "--space", "colour=red"])
    assert bad.value.code == 2 and "--space 'colour=red': expected KEY=V1,V2" in capsys.readouterr().err
    assert parallax_main([]) == 2 and "tune      find the fastest layout" in capsys.readouterr().err


def test_sixteen_bit_formats_are_tried_only_where_the_program_allowed_them():
    cluster = parse_resource_text("localhost: cpu:0,cpu:1\n")
    analysis = analyse_graph(build_deep_mlp().graph)
    restrict = {"run_option": ["MPI"], "backend": ["mpi"], "fusion_bytes": [64 << 20], "zero_stage": [0],
                "pipeline_stages": [1]}
    assert [c.get("compression") for c in layout_space(cluster, analysis, None, restrict)] == [None]
    allowed = layout_space(cluster, analysis, None, restrict, compression="auto")
    assert [c["compression"] for c in allowed] == ["none", "fp16", "bf16"]
    plan_cpu = lambda config, sync, c, a: plan_job(config, sync, c, a, gpus=0)  # noqa: E731
    ranked = {c.choice["compression"]: c for c in plan_candidates(cluster, analysis, Config(), True, allowed, plan_cpu)}
    assert ranked["fp16"].bytes_per_step == ranked["bf16"].bytes_per_step == ranked["none"].bytes_per_step / 2
    assert ranked["bf16"].predicted_seconds < ranked["none"].predicted_seconds
