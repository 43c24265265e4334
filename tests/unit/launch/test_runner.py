import io
import subprocess
import sys

from parallax.launch.command import LaunchCommand
from parallax.launch.runner import parse_failure, read_registry, register_rank, run_job

SIGNAL_REPORT = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 3864 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
ABORT_REPORT = """prterun has exited due to process rank 2 with PID 0 on node n7 calling
"abort". This may have caused other processes in the application to be
"""
EXIT_REPORT = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-4406@1,1]
   Exit code:    3
"""


def test_signal_report_names_rank_host_pid_and_signal():
    registry = {1: {"rank": 1, "host": "node-b", "pid": 77, "log": "/logs/worker_1.stderr"}}
    error = parse_failure(SIGNAL_REPORT, registry, 137)
    assert (error.rank, error.host, error.exit_code, error.log_path) == (1, "node-b", -9, "/logs/worker_1.stderr")
    assert str(error) == ("Parallax job failed: rank 1 on host node-b (pid 77) was killed by signal 9 (SIGKILL); "
                          "every other rank was stopped. Its output: /logs/worker_1.stderr")


def test_abort_report_without_registry_uses_mpiruns_host():
    error = parse_failure(ABORT_REPORT, {}, 1)
    assert (error.rank, error.host) == (2, "n7")
    assert "rank 2 on host n7 failed" in str(error)


def test_exit_code_report():
    error = parse_failure(EXIT_REPORT, {1: {"host": "vm", "pid": 5}}, 3)
    assert (error.rank, error.exit_code) == (1, 3)
    assert "exited with code 3" in str(error)


def test_unknown_report():
    error = parse_failure("something else", {}, 2)
    assert error.rank is None and str(error) == "Parallax job failed: mpirun exited with code 2"


def test_registry_round_trip(tmp_path):
    register_rank(str(tmp_path), 3, "h", None)
    assert read_registry(str(tmp_path))[3]["host"] == "h"


def test_run_job_passes_stderr_through_and_reports(tmp_path):
    script = "import sys; sys.stderr.write(" + repr(SIGNAL_REPORT) + "); sys.exit(137)"
    command = LaunchCommand((sys.executable, "-c", script), {"X": "1"})
    sink = io.StringIO()
    result = run_job(command, str(tmp_path), frozenset({"localhost"}), popen=subprocess.Popen, stderr_sink=sink)
    assert result.returncode == 137
    assert result.failure.rank == 1
    assert "prterun noticed" in sink.getvalue()


def test_run_job_success(tmp_path):
    result = run_job(LaunchCommand((sys.executable, "-c", "pass"), {}), str(tmp_path), frozenset(),
                     stderr_sink=io.StringIO())
    assert (result.returncode, result.failure) == (0, None)


def test_the_rank_that_ended_first_is_named_instead_of_the_peer_mpirun_picked():
    from parallax.launch.runner import LostRank, parse_failure

    output = ("prterun has exited due to process rank 2 with PID 0 on node c calling\n\"abort\". This may ...\n")
    registry = {1: {"host": "b", "pid": 41}, 2: {"host": "c", "pid": 42}}
    failure = parse_failure(output, registry, 1, first=1)
    assert str(failure).startswith("Parallax job failed: rank 1 on host b (pid 41) ended first, without an error of "
                                   "its own (killed, or its host failed)")
    assert failure.rank == 1 and failure.host == "b"
    assert "rank 2 on host c (pid 42) failed (an exception" in str(parse_failure(output, registry, 1, first=2))
    lost = LostRank({4: "d"})
    lost.set(4, 10.4)
    lost.set(1, 99)  # only the first counts
    assert str(lost.failure({})) == ("Parallax job failed: rank 4 on host d was lost: no heartbeat for 10 s (its host "
                                     "or the network to it is gone); every other rank was stopped")
