"""The trial runner's back ends on small Python commands: results as trials complete, a crash, a hang and a
lost worker reported with the rest going on, devices held by one trial at a time (no TensorFlow here)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from parallax.trials.execute import TrialSpec, run_trial
from parallax.trials.runner import DaskRunner, LocalRunner, make_runner

pytestmark = pytest.mark.timeout(180)

WRITE = ("import json, os, sys, time; t0 = time.time(); time.sleep(float(sys.argv[1])); "
         "json.dump({'began': t0, 'ended': time.time(), 'pid': os.getpid()}, "
         "open(os.environ['PARALLAX_TRIAL_RESULT'], 'w'))")


def spec(tmp_path, name: str, code: str, *args: str, devices=(), time_limit=60.0) -> TrialSpec:
    return TrialSpec(name, (sys.executable, "-c", code, *args), str(tmp_path / name), {}, time_limit,
                     tuple(devices), {"name": name})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_trial_that_writes_its_result_is_ok(tmp_path):
    result = run_trial(spec(tmp_path, "ok", WRITE, "0"))
    assert result.ok and result.returncode == 0 and set(result.value) == {"began", "ended", "pid"}
    assert result.params == {"name": "ok"} and os.path.exists(result.log)


def test_a_crash_is_reported_with_its_log(tmp_path):
    result = run_trial(spec(tmp_path, "crash", "import sys; print('loading data'); sys.exit('no such file: x.csv')"))
    assert result.status == "failed" and result.returncode == 1
    assert "exited with 1" in result.describe() and "no such file: x.csv" in result.tail
    assert "loading data" in open(result.log).read()


def test_a_trial_ending_without_a_result_failed(tmp_path):
    result = run_trial(spec(tmp_path, "silent", "pass"))
    assert result.status == "failed" and "without a result" in result.error


def test_a_trial_past_its_time_limit_is_ended_with_what_it_started(tmp_path):
    """The trial (and the process it started, in its group) is gone when the result comes back."""
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            "time.sleep(600)']); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)")
    pid_file = tmp_path / "child.pid"
    began = time.monotonic()
    result = run_trial(spec(tmp_path, "hang", code, str(pid_file), time_limit=2.0))
    assert result.status == "timeout" and "time limit of 2 s" in result.error
    assert time.monotonic() - began < 20
    assert not alive(int(pid_file.read_text()))


def test_a_killed_trial_is_reported_by_its_signal(tmp_path):
    result = run_trial(spec(tmp_path, "killed", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert result.status == "failed" and result.error == "ended by SIGKILL"


def test_local_trials_on_other_devices_overlap_and_on_the_same_devices_take_turns(tmp_path):
    with LocalRunner(max_parallel=4) as runner:
        results = {r.name: r for r in runner.run([
            spec(tmp_path, "a", WRITE, "1.5", devices=["h/cpu:0"]),
            spec(tmp_path, "b", WRITE, "1.5", devices=["h/cpu:1"]),
            spec(tmp_path, "c", WRITE, "1.5", devices=["h/cpu:0", "h/cpu:1"])])}
    a, b, c = (results[n].value for n in "abc")
    assert a["began"] < b["ended"] and b["began"] < a["ended"]  # other devices: at once
    assert c["began"] >= max(a["ended"], b["ended"]) - 0.05 or c["ended"] <= min(a["began"], b["began"]) + 0.05


def test_results_come_back_as_trials_complete(tmp_path):
    with make_runner("local") as runner:
        order = [r.name for r in runner.run([spec(tmp_path, "slow", WRITE, "3"), spec(tmp_path, "quick", WRITE, "0")])]
    assert order == ["quick", "slow"]


def test_unknown_back_end_and_an_address_without_dask_are_refused():
    with pytest.raises(ValueError, match="expected one of local, dask"):
        make_runner("ray")
    with pytest.raises(ValueError, match="needs backend='dask'"):
        make_runner("local", address="tcp://h:8786")


@pytest.mark.slow
def test_dask_reports_a_crash_a_hang_and_a_lost_worker_and_the_rest_finish(tmp_path):
    """A real LocalCluster: one trial crashes, one hangs past its limit, one kills its Dask worker (lost);
    the others finish, on the restarted worker too."""
    kill_worker = "import os, signal; os.kill(os.getppid(), signal.SIGKILL)"  # the trial's parent: the worker
    with DaskRunner(devices=2, max_parallel=2) as runner:
        assert runner.address.startswith("tcp://127.0.0.1:")
        first = {r.name: r for r in runner.run([
            spec(tmp_path, "ok1", WRITE, "0", devices=["localhost/cpu:0"]),
            spec(tmp_path, "crash", "raise SystemExit(3)", devices=["localhost/cpu:1"]),
            spec(tmp_path, "hang", "import time; time.sleep(600)", devices=["localhost/cpu:1"], time_limit=2.0)])}
        lost = {r.name: r for r in runner.run([spec(tmp_path, "lost", kill_worker, devices=["localhost/cpu:0"])])}
        after = {r.name: r for r in runner.run([spec(tmp_path, "ok2", WRITE, "0", devices=["localhost/cpu:0"])])}
        too_big = {r.name: r for r in runner.run([spec(tmp_path, "big", WRITE, "0",
                                                       devices=[f"localhost/cpu:{i}" for i in range(3)])])}
    assert first["ok1"].ok and first["ok1"].where
    assert first["crash"].status == "failed" and first["crash"].returncode == 3
    assert first["hang"].status == "timeout"
    assert lost["lost"].status == "lost" and "KilledWorker" in lost["lost"].error
    assert after["ok2"].ok
    assert too_big["big"].status == "failed" and "has 3 'devices'" in too_big["big"].error


def test_trial_results_are_plain_json(tmp_path):
    result = run_trial(spec(tmp_path, "ok", WRITE, "0"))
    assert json.loads(json.dumps(result.value)) == result.value


def test_device_slots_split_the_file_in_order(tmp_path):
    from parallax.trials.sweeps import device_slots

    path = tmp_path / "res"
    path.write_text("a: cpu:0,cpu:1,cpu:2\nb: cpu:0\n")
    assert device_slots(str(path), 2) == [("a: cpu:0,cpu:1\n", ("a/cpu:0", "a/cpu:1")),
                                          ("a: cpu:2\nb: cpu:0\n", ("a/cpu:2", "b/cpu:0"))]
    assert device_slots(str(path), None)[0][1] == ("a/cpu:0", "a/cpu:1", "a/cpu:2", "b/cpu:0")
