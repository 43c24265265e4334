"""Run a training script as a user would, in a loopback-only network namespace when
this machine allows one (root + ``unshare -n``), bounded by a timeout."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "train_script.py")
# The all-reduce backend of every MPI and HYBRID job of these tests, when set (``make test-horovod`` sets
# ``horovod``); train_script.py takes it as its ``--backend`` default. Unset: each test's own choice.
TEST_BACKEND = os.environ.get("PARALLAX_TEST_BACKEND", "")


#: The layouts the TF2 tests train in: name -> (resource file, run option, processes that write results, replicas
#: each).
LAYOUTS = {
    "MPI-2": ("localhost: cpu:0,cpu:1\n", "MPI", 2, 1),
    "PS-2": ("localhost: cpu:0\nlocalhost: cpu:1\n", "PS", 2, 1),
    "HYBRID-2": ("localhost: cpu:0,cpu:1\n", "HYBRID", 2, 1),
    "AUTO-2": ("localhost: cpu:0\nlocalhost: cpu:1\n", "AUTO", 2, 1),
    "MPI-3": ("localhost: cpu:0,cpu:1,cpu:2\n", "MPI", 3, 1),
    "HYBRID-3": ("localhost: cpu:0,cpu:1,cpu:2\n", "HYBRID", 3, 1),
    "PS-3": ("localhost: cpu:0\nlocalhost: cpu:1\nlocalhost: cpu:2\n", "PS", 3, 1),
    "local-2-replicas": ("localhost: cpu:0,cpu:1\n", "PS", 1, 2),
    "alone": ("localhost: cpu:0\n", "MPI", 1, 1),  # one worker of one replica: the process the user started
}
#: Those of two replicas.
TWO_REPLICAS = {name: LAYOUTS[name] for name in ("MPI-2", "PS-2", "HYBRID-2", "local-2-replicas")}


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """``unshare -n`` with loopback up, or nothing where namespaces are not allowed."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip or os.environ.get("PARALLAX_TEST_NO_NETNS"):
        return ()
    probe = subprocess.run([unshare, "-n", "sh", "-c", f"{ip} link set lo up"], capture_output=True, timeout=20)
    if probe.returncode != 0:
        return ()
    return (unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "parallax-netns")


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float
    out_dir: str
    ended_at: float

    def case(self, name: str) -> Run:
        """What case ``name`` of a :func:`run_cases` job wrote (the job's return code and output)."""
        return dataclasses.replace(self, out_dir=os.path.join(self.out_dir, name))

    def rank_values(self, rank: int) -> dict[str, np.ndarray]:
        with np.load(os.path.join(self.out_dir, f"rank_{rank}.npz")) as data:
            return {k.replace("__", "/"): data[k] for k in data.files}


def start_command(tmp_path, argv: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start ``argv`` as :func:`run_command` runs it, in a session of its own; its output is piped."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.Popen([*namespace_prefix(), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=env, cwd=str(tmp_path), start_new_session=True)


def finish_command(proc: subprocess.Popen, timeout: float, out_dir: str, started: float | None = None) -> Run:
    """Wait for a command :func:`start_command` started; its whole group is killed if it runs past ``timeout``."""
    start = time.monotonic() if started is None else started
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        raise AssertionError(f"job did not finish in {timeout}s:\n{output[-4000:]}") from None
    except BaseException:  # pytest's own timeout, ^C: the job must not run on beside the next test
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    return Run(proc.returncode, output, time.monotonic() - start, str(out_dir), time.time())


def run_command(tmp_path, argv: list[str], timeout: float = 180, out_dir=None, env: dict | None = None) -> Run:
    """Run ``argv`` (a user's command: a script, ``parallax tune``, ...) in the test's network namespace,
    from ``tmp_path``, with the repository importable; its whole group is killed if it runs past ``timeout``."""
    start = time.monotonic()
    return finish_command(start_command(tmp_path, argv, env), timeout, out_dir or tmp_path, start)


def run_script(tmp_path, resource_text: str, *args: str, timeout: float = 180, script: str = SCRIPT) -> Run:
    tmp_path.mkdir(parents=True, exist_ok=True)
    resource = tmp_path / "resource_info"
    resource.write_text(resource_text)
    out_dir = tmp_path / "out"
    return run_command(tmp_path, [sys.executable, script, "--resource_info", str(resource), "--out", str(out_dir),
                                  *args], timeout, out_dir)


def leftover_processes(tmp_path) -> list[int]:
    """PIDs of processes still running a job of this test (there must be none)."""
    marker = str(tmp_path).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def seconds_after(run: Run, tmp_path, what: str) -> float:
    """How long the job ran on after the moment the script wrote to ``<out>/<what>`` (``killed_at``,
    ``raised_at``): what a user waits once a process has failed, whatever the machine's load at start-up."""
    return run.ended_at - float((tmp_path / "out" / what).read_text())


def assert_killed_rank_ended_the_job(run: Run, tmp_path, rank: str) -> None:
    """The job exited non-zero within 30 s of the kill the script recorded, named the
    killed rank (a regex) and its host, and left no process behind."""
    assert run.returncode != 0
    assert seconds_after(run, tmp_path, "killed_at") < 30, seconds_after(run, tmp_path, "killed_at")
    assert re.search(rf"Parallax job failed: rank {rank} on host \S+ \(pid \d+\) was killed by signal 9",
                     run.output), run.output[-3000:]
    assert not leftover_processes(tmp_path)


def launch_ranks(script: str, resource_info: str, rank_args: list[str], mpirun_options: str = "") -> int:
    """The launching side of a script of ranks (``allreduce_script.py`` ...): one rank per device of
    ``resource_info``, each running ``script`` with ``rank_args``, as Parallax's launcher starts them; the
    job's exit code."""
    from parallax.launch.launcher import launch
    from parallax.launch.layout import ranks_per_device
    from parallax.resources.files import parse_resource_text

    with open(resource_info) as f:
        ranks = ranks_per_device(parse_resource_text(f.read()))
    return launch(ranks, [os.path.abspath(script), *rank_args], mpirun_options=mpirun_options).returncode


def rank_script(script: str, rank_main, mpirun_options: str = "") -> None:
    """The command line of a script of ranks without options of its own: ``--resource_info FILE --out DIR``
    starts the ranks (:func:`launch_ranks`), ``--rank --out DIR`` is one of them (``rank_main(out)``)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--resource_info")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.rank:
        rank_main(args.out)
        return
    sys.exit(launch_ranks(script, args.resource_info, ["--rank", "--out", args.out], mpirun_options))


def rank_results(tmp_path, script: str, ranks: int, timeout: float = 300) -> list[dict]:
    """Run a script of ranks (:func:`launch_ranks`) on ``ranks`` CPU devices of localhost and read each rank's
    ``rank_<r>.json``; the run must succeed."""
    run = run_script(tmp_path, "localhost: " + ",".join(f"cpu:{i}" for i in range(ranks)) + "\n", script=script,
                     timeout=timeout)
    assert run.returncode == 0, run.output[-4000:]
    out = []
    for rank in range(ranks):
        with open(os.path.join(run.out_dir, f"rank_{rank}.json")) as f:
            out.append(json.load(f))
    return out


def run_cases(tmp_path, resource_text: str, cases: dict[str, list[str]], *args: str, timeout: float = 300) -> Run:
    """One job (one launch) that trains every case in turn, each a ``parallel_run`` call of its own with
    ``args`` and its own options, into ``<out>/<case>``: tests of the same layout share the cost of
    starting the processes, and each still checks its own case (:meth:`Run.case`)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    return run_script(tmp_path, resource_text, "--cases", str(spec), *args, timeout=timeout)


def in_group(group: str) -> pytest.MarkDecorator:
    """The mark that keeps the tests of one shared job on one pytest-xdist worker (``--dist loadgroup``)."""
    return pytest.mark.xdist_group(group)


class SharedJobs:
    """The jobs a test module's cases share, by group: ``{group: (resource text, options of every case,
    {case: its own options})}``. Each group's job runs once, when a test first asks for it (mark the
    tests of a group with :func:`in_group` so one test worker runs them all)."""

    def __init__(self, tmp_path_factory, groups: dict[str, tuple[str, list[str], dict[str, list[str]]]]) -> None:
        self._factory = tmp_path_factory
        self._groups = groups
        self._runs: dict[str, Run] = {}

    def case(self, group: str, case: str) -> Run:
        if group not in self._runs:
            resources, options, cases = self._groups[group]
            self._runs[group] = run_cases(self._factory.mktemp(group), resources, cases, *options)
        return self._runs[group].case(case)


class ScriptJobs:
    """One job per group: ``script`` run once over the group's cases (a ``parallel_run`` call each, as a program
    that trains several models would), when a test first asks for one of them; each case's results land in
    ``<out>/<case>`` (``:`` in a case's name becomes ``-``). ``groups`` maps a group to its resource text and
    the script's options; ``cases`` is every group's list, or a list per group (:func:`selected`); the script
    takes ``--resource_info``, ``--out``, those options and the cases."""

    def __init__(self, factory, script: str, groups: dict[str, tuple[str, list[str]]],
                 cases: list[str] | dict[str, list[str]], timeout: float = 420) -> None:
        self._factory = factory
        self._script = script
        self._groups = groups
        self._cases = cases if isinstance(cases, dict) else {group: cases for group in groups}
        self._timeout = timeout
        self._runs: dict[str, tuple[Run, str] | AssertionError] = {}

    def case(self, group: str, case: str) -> str:
        """The directory case ``case`` of ``group`` wrote into (the group's job having succeeded). A job that
        failed or ran past its timeout fails every case of its group, run once."""
        if group not in self._runs:
            text, options = self._groups[group]
            tmp = self._factory.mktemp(group)
            (tmp / "resource_info").write_text(text)
            try:
                run = run_command(tmp, [sys.executable, self._script, "--resource_info", str(tmp / "resource_info"),
                                        "--out", str(tmp / "out"), *options, *self._cases[group]],
                                  timeout=self._timeout)
                self._runs[group] = (run, str(tmp / "out"))
            except AssertionError as timed_out:
                self._runs[group] = timed_out
        if isinstance(self._runs[group], AssertionError):
            raise self._runs[group]
        run, out = self._runs[group]
        assert run.returncode == 0, run.output[-4000:]
        return os.path.join(out, case.replace(":", "-"))


def selected(request, groups, case: str = "name") -> dict[str, list[str]]:
    """Of each of ``groups``, the cases (parameter ``case``, beside parameter ``group``) of the tests of
    ``request``'s module that this session runs (``-m`` having chosen): a shared job trains the cases of its group
    that run, ``make test``'s in one launch and ``make test-extended``'s in another."""
    running = [(item.callspec.params["group"], item.callspec.params[case]) for item in request.session.items
               if hasattr(item, "callspec") and item.module is request.module]
    return {g: [c for group, c in running if group == g] for g in groups}
