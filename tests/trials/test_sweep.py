"""parallax.sweep: every trial a Parallax job on its share of the devices, on local processes or a real Dask
LocalCluster; each result equals single-device training with that trial's parameters, also where trials run
side by side; a crashing trial is reported with its log while the others finish."""

from __future__ import annotations

import json

import pytest

import parallax
from parallax.trials.sweeps import Uniform, grid_points, random_points
from tests.multiprocess.harness import leftover_processes
from tests.trials.programs import train, train_single_device

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(600)]

FOUR = "localhost: cpu:0,cpu:1,cpu:2,cpu:3\n"


def resources(tmp_path, text: str = FOUR) -> str:
    path = tmp_path / "res"
    path.write_text(text)
    return str(path)


def check_against_single_device(report, replicas: int) -> None:
    for r in report.completed:
        lr = r.value["params"]["learning_rate"]
        assert r.value["value"]["workers"] == replicas
        assert report.value_of(r) == pytest.approx(train_single_device(lr, replicas), rel=1e-5), r.name


def test_a_grid_on_two_slots_with_a_crashing_trial_on_local_processes(tmp_path):
    """Four trials, two at a time side by side: each that ends equals single-device training with its
    parameters (a test that side-by-side trials equal the same trials one by one, 98 s in CI, went for CI's
    time: this one's comparison with one device covers it)."""
    report = parallax.sweep(train, {"learning_rate": [0.05, 0.2], "crash": [False, True]}, resources(tmp_path),
                            devices_per_trial=2, metric="loss", output=str(tmp_path / "sweep"), progress=False)
    assert len(report.results) == 4
    crashed = [r for r in report.results if r.params.get("crash")]
    assert [r.status for r in crashed] == ["failed", "failed"]
    assert all("this trial crashes on purpose" in r.tail for r in crashed)
    assert len(report.completed) == 2
    check_against_single_device(report, 2)
    assert report.best_params == {"learning_rate": 0.2, "crash": False}
    saved = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert saved["best"] == report.best_params and len(saved["trials"]) == 4
    assert (tmp_path / "sweep" / "sweep.png").exists()
    assert "* trial-" in report.table() and "crashes on purpose" not in report.table()  # the log, not the table
    assert not leftover_processes(tmp_path)


def test_random_draws_on_a_real_dask_local_cluster(tmp_path):
    report = parallax.sweep(train, {"learning_rate": Uniform(0.01, 0.3, log=True)}, resources(tmp_path),
                            method="random", trials=2, devices_per_trial=2, backend="dask", metric="loss",
                            output=str(tmp_path / "sweep"), progress=False)
    assert [r.status for r in report.results] == ["ok", "ok"], [r.describe() for r in report.results]
    drawn = sorted(r.value["params"]["learning_rate"] for r in report.results)
    assert drawn == sorted(p["learning_rate"] for p in random_points({"learning_rate": Uniform(0.01, 0.3, log=True)},
                                                                     2, 0))
    check_against_single_device(report, 2)


def test_bayesian_suggestions_are_made_on_the_workers(tmp_path):
    report = parallax.sweep(train, {"learning_rate": Uniform(0.01, 0.3)}, resources(tmp_path), method="bayes",
                            trials=3, devices_per_trial=2, metric="loss", output=str(tmp_path / "sweep"),
                            progress=False)
    assert len(report.completed) == 3
    assert all(0.01 <= r.value["params"]["learning_rate"] <= 0.3 for r in report.completed)
    check_against_single_device(report, 2)


def test_bad_sweeps_are_refused_before_anything_starts(tmp_path):
    res = resources(tmp_path)
    with pytest.raises(ValueError, match="devices_per_trial=3 does not divide the 4 devices"):
        parallax.sweep(train, {"learning_rate": [0.1]}, res, devices_per_trial=3)
    with pytest.raises(ValueError, match="a grid needs a list of values"):
        parallax.sweep(train, {"learning_rate": Uniform(0.1, 0.2)}, res)
    with pytest.raises(ValueError, match="method='random' needs trials >= 1"):
        parallax.sweep(train, {"learning_rate": [0.1]}, res, method="random")
    with pytest.raises(ValueError, match="method 'annealing'"):
        parallax.sweep(train, {"learning_rate": [0.1]}, res, method="annealing")


def test_slots_and_points():
    assert grid_points({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert random_points({"a": [1, 2], "u": Uniform(0, 1)}, 3, 7) == random_points({"a": [1, 2], "u": Uniform(0, 1)},
                                                                                    3, 7)
