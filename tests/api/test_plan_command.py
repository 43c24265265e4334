"""``parallax plan``: the plan of a training script, printed without training."""

from __future__ import annotations

import json
import os

import pytest

from parallax.cli import parallax_main
from tests.multiprocess.harness import SCRIPT


@pytest.fixture
def resources(tmp_path):
    path = tmp_path / "resource_info"
    path.write_text("localhost: cpu:0,cpu:1,cpu:2\n")
    return str(path)


def plan(tmp_path, resources, *options, model="embedding", run_option="HYBRID"):
    out = tmp_path / "plan.json"
    code = parallax_main(["plan", SCRIPT, resources, "--json", str(out), *options, "--",
                          "--resource_info", "/nonexistent/replaced/by/the/command", "--out", str(tmp_path),
                          "--model", model, "--run_option", run_option])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_prints_the_plan_as_a_table_without_training(tmp_path, resources, capfd):
    code, data = plan(tmp_path, resources)
    assert code == 0
    printed = capfd.readouterr().out
    assert "run_option=HYBRID sync=True workers=3" in printed
    assert "estimated bytes each worker sends per step" in printed
    syncs = {v["name"]: (v["sync"], v["server"]) for v in data["variables"]}
    assert syncs["embedding"] == ("ps", 0) and syncs["proj/kernel"] == ("allreduce", None)
    assert not os.path.exists(tmp_path / "rank_0.npz")  # nothing trained


def test_run_option_and_overrides_replace_the_scripts(tmp_path, resources):
    _, data = plan(tmp_path, resources, "--run_option", "MPI")
    assert {v["name"]: v["sync"] for v in data["variables"] if v["gradient"]} == \
        {"embedding": "allgather", "proj/kernel": "allreduce"}
    _, data = plan(tmp_path, resources, "--override", "embedding=allreduce", run_option="AUTO")
    assert {v["name"]: v["sync"] for v in data["variables"] if v["gradient"]}["embedding"] == "allreduce"


def test_pipeline_choices_replace_the_scripts_and_print_stages(tmp_path, capfd):
    four = tmp_path / "four"
    four.write_text("localhost: cpu:0,cpu:1,cpu:2,cpu:3\n")
    code, data = plan(tmp_path, str(four), "--pipeline_stages", "2", "--micro_batches", "3",
                      "--override", "embedding=stage:1", run_option="MPI")
    assert code == 0
    assert (data["pipeline"]["stages"], data["pipeline"]["micro_batches"]) == (2, 3)
    assert {v["name"]: v["stage"] for v in data["variables"]}["embedding"] == 1
    printed = capfd.readouterr().out
    assert "workers=2 replicas=2" in printed and "pipeline: 2 stage(s), 3 micro-batch(es)" in printed
    assert "stage 1: from" in printed


def test_bad_input_is_named(tmp_path, resources, capfd):
    assert parallax_main(["plan", SCRIPT, resources, "--override", "embedding"]) == 2
    assert "expected VARIABLE=SYNC" in capfd.readouterr().err
    assert parallax_main(["plan", str(tmp_path / "missing.py"), resources]) == 2
    script = tmp_path / "no_parallax.py"
    script.write_text("print('hello')\n")
    assert parallax_main(["plan", str(script), resources]) == 1
    assert "ended without calling parallax.parallel_run" in capfd.readouterr().err


def test_predict_prints_each_layouts_step_from_the_plans_variables(tmp_path, resources, capfd):
    code, data = plan(tmp_path, resources, "--predict", "--step_time", "40ms", "--cluster", "6x8",
                      "--bandwidth", "10Gbit", "--latency", "0")
    assert code == 0
    printed = capfd.readouterr().out
    assert "Predicted on 6 host(s) x 8 device(s), 10 Gbit/s" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines()
            if line.strip().split(" ")[0] in ("MPI", "PS", "HYBRID")}
    assert set(rows) == {"MPI", "PS", "HYBRID"}
    # the step is the single-device 40 ms plus the predicted communication; no host costs: a bound
    assert "a bound; --measured makes it a forecast" in printed
    for layout, cols in rows.items():
        assert float(cols[2]) == 0 and float(cols[3]) == pytest.approx(40.0 + float(cols[1]), abs=0.11), layout
    # without --cluster: the resource file's one host of 3 devices
    plan(tmp_path, resources, "--predict", "--step_time", "0.04")
    assert "Predicted on 1 host(s) x 3 device(s)" in capfd.readouterr().out


def test_measured_steps_make_the_prediction_a_forecast(tmp_path, resources, capfd):
    measured = tmp_path / "measured.yaml"
    measured.write_text("MPI: {1x2: 45ms, 2x2: 47ms}\nPS:\n  1x2: 0.05\n")
    code, _ = plan(tmp_path, resources, "--predict", "--step_time", "40ms", "--cluster", "6x8", "--latency", "0",
                   "--measured", str(measured))
    assert code == 0
    printed = capfd.readouterr().out
    assert "host costs fitted to the measured steps" in printed and "forecasts: each measured layout's" in printed
    rows = {line.split()[0]: line.split() for line in printed.splitlines()
            if line.strip().split(" ")[0] in ("MPI", "PS", "HYBRID")}
    # PS measured once: its whole 10 ms less the predicted communication is a fixed cost per step
    assert float(rows["PS"][2]) > 5 and float(rows["HYBRID"][2]) == 0  # HYBRID not measured: a bound
    assert (rows["PS"][-1], rows["MPI"][-1], rows["HYBRID"][-1]) == ("forecast", "forecast", "bound")
    fastest = [line for line in printed.splitlines() if "fastest:" in line][-1]
    assert fastest.split()[1] in ("MPI", "PS") and "(of the forecasts)" in fastest
    for layout, cols in rows.items():
        assert float(cols[3]) == pytest.approx(40.0 + float(cols[1]) + float(cols[2]), abs=0.16), layout


@pytest.mark.parametrize("text, message", [
    ("RING: {1x2: 1ms}", "unknown layout 'RING'"),
    ("MPI: {1x1: 1ms}", "MPI: 1x1: expected a positive step on more than one device"),
    ("MPI: {2x2: soon}", "MPI: 2x2: latency 'soon': expected"),
    ("MPI: 3", "MPI: expected {HOSTSxDEVICES: step}"),
    ("[1, 2]", "expected a mapping of layouts"),
])
def test_measured_names_the_bad_entry(tmp_path, resources, capfd, text, message):
    measured = tmp_path / "steps.yaml"
    measured.write_text(text + "\n")
    assert parallax_main(["plan", SCRIPT, resources, "--predict", "--step_time", "1", "--measured",
                          str(measured)]) == 2
    err = capfd.readouterr().err
    assert f"{measured}: {message}" in err or (message in err and str(measured) in err), err


@pytest.mark.parametrize("options, message", [
    (["--predict"], "--predict needs --step_time"),
    (["--predict", "--step_time", "fast"], "--step_time 'fast': expected seconds"),
    (["--predict", "--step_time", "1", "--cluster", "6by8"], "cluster '6by8': expected HOSTSxDEVICES"),
    (["--predict", "--step_time", "1", "--bandwidth", "10 furlongs"], "bandwidth '10 furlongs': expected"),
    (["--predict", "--step_time", "1", "--latency", "soon"], "latency 'soon': expected"),
    (["--predict", "--step_time", "1", "--step_spread", "a lot"], "--step_spread 'a lot': expected seconds"),
    (["--predict", "--step_time", "1", "--step_spread", "-0.5"], "--step_spread '-0.5' must not be negative"),
    (["--predict", "--step_time", "1", "--measured", "/nonexistent/steps.yaml"],
     "--measured '/nonexistent/steps.yaml': No such file"),
])
def test_predict_names_a_bad_argument(tmp_path, resources, capfd, options, message):
    assert parallax_main(["plan", SCRIPT, resources, *options]) == 2
    assert message in capfd.readouterr().err
