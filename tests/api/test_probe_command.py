"""``parallax probe``: the link between two hosts (here: two processes of this one), for --predict."""

from __future__ import annotations

import re

import pytest

from parallax.cli import parallax_main
from tests.multiprocess.harness import SCRIPT

pytestmark = [pytest.mark.multiprocess, pytest.mark.core]

LINK = re.compile(r"(inside|between) (\S+?)(?: and (\S+))?: ([0-9.e+]+) Gbit/s per direction, ([0-9.e+]+) us latency")


def test_measures_two_processes_of_one_host_over_tcp(tmp_path, capfd):
    path = tmp_path / "resource_info"
    path.write_text("localhost: cpu:0,cpu:1\n")
    assert parallax_main(["probe", str(path), "--mpirun_options=--mca btl self,tcp"]) == 0
    out = capfd.readouterr().out
    m = LINK.search(out)
    assert m and m.group(1) == "inside" and m.group(2) == "localhost", out
    assert float(m.group(4)) > 0.1 and 0 < float(m.group(5)) < 10_000  # loopback: > 100 Mbit/s, < 10 ms
    assert "--inside_bandwidth" in out and "--inside_latency" in out


def test_bad_input_is_named(tmp_path, capfd):
    assert parallax_main(["probe", str(tmp_path / "missing")]) == 1
    assert "resource file not found" in capfd.readouterr().err
    path = tmp_path / "resource_info"
    path.write_text("localhost: cpu:0\n")
    with pytest.raises(SystemExit) as stop:
        parallax_main(["probe", str(path), "--hosts", "a,b"])
    assert stop.value.code == 2
    assert "--hosts 'a,b': expected two of the resource file's hosts (localhost)" in capfd.readouterr().err


def test_plan_predict_with_a_probed_link(tmp_path, capfd):
    path = tmp_path / "resource_info"
    path.write_text("localhost: cpu:0,cpu:1\n")
    code = parallax_main(["plan", SCRIPT, str(path), "--predict", "--step_time", "10ms", "--probe", "--",
                          "--resource_info", "/replaced", "--out", str(tmp_path), "--model", "embedding",
                          "--run_option", "HYBRID"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "probed inside localhost:" in out and "fastest:" in out
