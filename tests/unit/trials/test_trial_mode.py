"""A job started as a trial: its choice becomes Config fields, its training steps are timed, its result written."""

from __future__ import annotations

import json

import pytest

from parallax.config import Config
from parallax.invocation import RESULT_ENV, TRIAL_ENV, Invocation
from parallax.job.choice import choice_env, describe_choice, with_choice
from parallax.trials.mode import TrialOver, TrialRequest, TrialSession, trial_env, trial_request


class FakeSession:
    def __init__(self) -> None:
        self.runs: list = []
        self.closed = False

    def run(self, fetches, *args, **kwargs):
        self.runs.append(fetches)
        return "values"

    def close(self) -> None:
        self.closed = True


def test_a_choice_sets_nested_config_fields():
    config = with_choice(Config(), {"run_option": "HYBRID", "fusion_bytes": 4 << 20, "backend": "collective",
                                    "local_aggregation": False, "replicate_variables": False, "zero_stage": 1,
                                    "partitions": 8})
    mpi, ps = config.communication_config.mpi_config, config.communication_config.ps_config
    assert (config.run_option, mpi.fusion_bytes, mpi.backend, config.zero_stage) == ("HYBRID", 4 << 20,
                                                                                      "collective", 1)
    assert (ps.local_aggregation, ps.replicate_variables) == (False, False)
    assert choice_env({"partitions": 8}) == {"PARALLAX_NUM_PARTITIONS": "8"} and choice_env({}) == {}
    assert describe_choice({"fusion_bytes": 0, "run_option": "MPI"}) == "run_option=MPI fusion_bytes=off"


def test_a_bad_choice_names_what_is_wrong():
    with pytest.raises(ValueError, match="unknown choice.*fusion"):
        with_choice(Config(), {"fusion": 1})
    with pytest.raises(ValueError, match="zero_stage"):
        with_choice(Config(), {"zero_stage": 7})


def test_the_request_round_trips_through_the_environment():
    assert trial_request(Invocation.from_env({})) is None
    env = trial_env({"run_option": "PS"}, 1, 3)
    assert trial_request(Invocation.from_env(env)) == TrialRequest({"run_option": "PS"}, 1, 3)
    with pytest.raises(ValueError, match="PARALLAX_TRIAL='five': expected JSON"):
        Invocation.from_env({TRIAL_ENV: "five"})


def test_only_training_steps_count_and_the_result_is_written(tmp_path):
    """The chief's extra fetches (a loss read) are not steps, so every worker ends at the same step."""
    result = tmp_path / "result.json"
    path = Invocation.from_env({RESULT_ENV: str(result)}).trial_result  # as parallel_run reads it
    inner = FakeSession()
    session = TrialSession(inner, TrialRequest({"run_option": "MPI"}, warmup=1, steps=2),
                           facts={"layout": "MPI", "train_ops": {"train/Adam"}}, result_path=path)
    assert session.run(["loss:0", "train/Adam"]) == "values"  # warm-up
    session.run({"w": "w:0"})  # not a step
    session.run(["train/Adam"])
    assert len(session.times) == 1 and not result.exists()
    with pytest.raises(TrialOver) as ended:
        session.run("train/Adam")
    assert ended.value.code == 0 and inner.closed
    written = json.loads(result.read_text())
    assert written["layout"] == "MPI" and written["choice"] == {"run_option": "MPI"}
    assert written["step_seconds"] == max(written["worker_medians"]) and len(written["times"]) == 2
    assert "train_ops" not in written


def test_the_workers_agree_on_the_slowest_median(tmp_path):
    class Comm:
        def allgather(self, value):
            return [value, 9.0]

        def Get_rank(self):  # noqa: N802 - mpi4py's name
            return 0

    session = TrialSession(FakeSession(), TrialRequest({}, 0, 1), comm=Comm(), result_path=str(tmp_path / "r.json"))
    with pytest.raises(TrialOver):
        session.run("anything")  # no train ops known: every call is a step
    assert json.loads((tmp_path / "r.json").read_text())["step_seconds"] == 9.0
