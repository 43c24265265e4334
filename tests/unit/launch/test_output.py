"""What the launcher passes on of its ranks' output (parallax/launch/output.py): TensorFlow's start-up notices
dropped unless the user chose a log level, control bytes never passed on."""

from __future__ import annotations

import pytest

from parallax.launch.output import cleaned

STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    "I0000 00:00:1796162731.225403   23526 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.\n",
    "I0000 00:00:1796162746.570736   23767 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.\n",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    "appropriate compiler flags.\n",
]


@pytest.mark.parametrize("line", STARTUP, ids=["absl", "onednn", "cpu-features", "cpu-features-2"])
def test_tensorflows_start_up_notices_are_dropped_unless_the_user_chose_a_level(line):
    assert cleaned(line, quiet=True) is None
    assert cleaned(line, quiet=False) == line


def test_parallax_lines_and_tensorflow_warnings_are_kept():
    for line in ["Parallax: run_option MPI runs as MPI\n",
                 "W0000 00:00:1.0 1 grpc_server_lib.cc:10] a warning of TensorFlow's\n",
                 "Traceback (most recent call last):\n"]:
        assert cleaned(line, quiet=True) == line


def test_control_bytes_never_reach_the_log():
    assert cleaned("\x00Parallax elastic: attempt 1 failed with exit code 137\n", quiet=True) == \
        "Parallax elastic: attempt 1 failed with exit code 137\n"
    assert cleaned("a\tb\x1b[0m\r\n", quiet=False) == "a\tb[0m\n"
