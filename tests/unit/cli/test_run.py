"""``parallax-run``: the script's own parallel_run decides the layout from its run option."""

import sys
import textwrap

import pytest

from parallax.cli import main

SCRIPT = textwrap.dedent("""
    import sys
    import tensorflow as tf
    import parallax

    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [4], initializer=tf.compat.v1.zeros_initializer())
        emb = tf.compat.v1.get_variable("emb", [100, 4])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids) * w)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    parallax.parallel_run(graph, "the_script_names_another_file", parallax_config=parallax.Config(
        run_option=sys.argv[1], communication_config=parallax.CommunicationConfig(
            mpi_config=parallax.MPIConfig(mpirun_options="--mca from_config 1"))))
    raise SystemExit("not reached in a dry run")
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


ONE_LINE, TWO_LINES = "localhost: cpu:0,cpu:1\n", "localhost: cpu:0\nlocalhost: cpu:1\n"


@pytest.mark.parametrize("run_option, resources, processes",
                         [("MPI", ONE_LINE, 2), ("HYBRID", ONE_LINE, 3), ("PS", TWO_LINES, 3)])
def test_dry_run_prints_the_layout_of_the_scripts_run_option(tmp_path, capsys, script, run_option, resources,
                                                              processes):
    resource = tmp_path / "r"
    resource.write_text(resources)
    assert main(["-r", str(resource), "--mpirun_options", "--mca from_cli 2", "--dry_run", str(script),
                 run_option]) == 0
    out = capsys.readouterr().out
    assert f"run_option {run_option}, {processes} processes" in out
    assert f"-np {processes} " in out or out.count("-np ") > 1
    assert "--mca from_config 1 --mca from_cli 2" in out
    assert out.strip().endswith(f"-m parallax.member.entry {script} {run_option}")


def test_dry_run_shows_the_gpus_each_rank_starts_with(tmp_path, capsys, script, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resource = tmp_path / "r"
    resource.write_text("hostA: 0,1\nhostB: 3\n")
    assert main(["-r", str(resource), "--dry_run", str(script), "MPI"]) == 0
    command = capsys.readouterr().out.splitlines()[-1]
    assert " --host hostA:2,hostB:1 " in command
    program = f"-m parallax.member.entry {script} MPI"
    assert command.endswith(f" -np 1 env CUDA_VISIBLE_DEVICES=0 {sys.executable} {program} : "
                            f"-np 1 env CUDA_VISIBLE_DEVICES=1 {sys.executable} {program} : "
                            f"-np 1 env CUDA_VISIBLE_DEVICES=3 {sys.executable} {program}")


def test_dry_run_of_one_device_trains_in_process(tmp_path, capsys, script):
    resource = tmp_path / "r"
    resource.write_text("localhost: cpu:0\n")
    assert main(["-r", str(resource), "--dry_run", str(script), "MPI"]) == 0
    assert "nothing is launched" in capsys.readouterr().out


def test_dry_run_of_a_script_without_parallel_run(tmp_path, capsys):
    resource = tmp_path / "r"
    resource.write_text("localhost: cpu:0,cpu:1\n")
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    assert main(["-r", str(resource), "--dry_run", str(script)]) == 1
    assert "without calling parallax.parallel_run" in capsys.readouterr().err


def test_missing_script_and_bad_resource_file(tmp_path, capsys):
    resource = tmp_path / "r"
    resource.write_text("localhost: x\n")
    assert main(["-r", str(resource), str(tmp_path / "nope.py")]) == 2
    assert "not found" in capsys.readouterr().err
    script = tmp_path / "t.py"
    script.write_text("")
    assert main(["-r", str(resource), str(script)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_dry_run_of_a_module_with_options(tmp_path, capsys, monkeypatch):
    (tmp_path / "trainmod.py").write_text(SCRIPT)
    resource = tmp_path / "r"
    resource.write_text(ONE_LINE)
    monkeypatch.chdir(tmp_path)
    assert main(["-r", str(resource), "--dry_run", "-m", "trainmod", "MPI", "--an_option"]) == 0
    assert capsys.readouterr().out.strip().endswith("-m parallax.member.entry -m trainmod MPI --an_option")


def test_the_command_line_starts_without_loading_tensorflow():
    import subprocess
    import sys

    code = "import sys, parallax.cli; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_inside_a_slurm_allocation_the_resource_file_may_be_left_out(capsys, script, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(SystemExit):
        main([str(script), "MPI"])
    assert "inside a Slurm allocation or an MPIJob's launcher their hosts are used" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    assert main(["--dry_run", str(script), "MPI"]) == 0
    out = capsys.readouterr().out
    assert "run_option MPI, 3 processes" in out and "--host localhost:3 " in out


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_stall_shutdown_takes_positive_seconds_or_none(capsys, script, value):
    with pytest.raises(SystemExit):
        main(["--stall-shutdown", value, "-r", "resource_info", str(script), "MPI"])
    assert "--stall-shutdown: expected seconds (a positive number) or 'none', got" in capsys.readouterr().err


def test_stall_shutdown_replaces_the_scripts_config_in_its_parallel_run(monkeypatch):
    from dataclasses import replace

    import parallax.api as api
    from parallax.config import Config
    from parallax.invocation import Invocation

    seen = []
    monkeypatch.setattr(api, "_run", lambda run, force, sync, invocation: seen.append(run.config) or 0)
    for text, expected in (("42.0", 42.0), ("none", None)):
        monkeypatch.setattr(api, "current", lambda text=text: replace(Invocation(), stall_shutdown=text))
        with pytest.raises(SystemExit):
            api.parallel_run(tf_graph(), "resource_info", parallax_config=Config())
        assert seen[-1].stall_shutdown == expected


def tf_graph():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("w", [1])
    return graph
