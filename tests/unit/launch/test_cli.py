from parallax.cli import main


def test_dry_run_prints_the_mpirun_command(tmp_path, capsys):
    resource = tmp_path / "r"
    resource.write_text("localhost: cpu:0,cpu:1\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert main(["-r", str(resource), "--dry_run", str(script), "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "-np 2 --host localhost:2" in out
    assert out.strip().endswith(f"-m mpi4py {script} --steps 5")


def test_missing_script_and_bad_resource_file(tmp_path, capsys):
    resource = tmp_path / "r"
    resource.write_text("localhost: x\n")
    assert main(["-r", str(resource), str(tmp_path / "nope.py")]) == 2
    assert "not found" in capsys.readouterr().err
    script = tmp_path / "t.py"
    script.write_text("")
    assert main(["-r", str(resource), str(script)]) == 2
    assert "line 1" in capsys.readouterr().err
