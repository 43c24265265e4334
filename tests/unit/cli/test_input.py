"""Bad command-line input is refused before anything runs: the option named, what was expected, exit code 2 and
argparse's usage, no traceback (each CLI's main called with argv, as its console script does)."""

from __future__ import annotations

import re

import pytest

from parallax.cli import manifest_main, plan_main, tune_main


def refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    return err


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("raise SystemExit('the script must not run')\n")
    (tmp_path / "res").write_text("localhost: cpu:0,cpu:1\n")
    return str(path), str(tmp_path / "res")


@pytest.mark.parametrize("option,value,expected", [
    ("--time_budget", "-5", "a number of seconds > 0"),
    ("--time_budget", "soon", "a number of seconds > 0"),
    ("--time_limit", "0", "a number of seconds > 0"),
    ("--timeout", "nan", "a number of seconds > 0"),
    ("--trials", "0", "a whole number >= 1"),
])
def test_parallax_tune_checks_its_numbers_up_front(script, capsys, option, value, expected):
    err = refused(tune_main, [*script, option, value, "--", "--steps", "5"], capsys)
    assert re.search(rf"^parallax tune: error: argument {option}: expected {expected}, got '{value}'$", err, re.M), err


def test_parallax_tune_time_budget_from_python_is_checked_too(script):
    from parallax.tuning.tuner import tune

    with pytest.raises(ValueError, match=r"^parallax tune: time_budget must be a number of seconds > 0 \(or None: "
                                         r"no budget\), got -5$"):
        tune(*script, time_budget=-5)


def test_parallax_manifest_without_the_separator_says_the_command_goes_after_it(script, capsys):
    path, res = script
    err = refused(manifest_main, ["--kind", "tfjob", res, "python", path, "--steps", "5"], capsys)
    assert re.search(rf"^parallax manifest: error: unrecognized arguments: python {re.escape(path)} --steps 5\. The "
                     r"command every process runs \(python SCRIPT \.\.\. or python -m MODULE \.\.\.\) goes after --, "
                     rf"e\.g\. parallax manifest --kind tfjob {re.escape(res)} -- python {re.escape(path)} --steps 5$",
                     err, re.M), err
    assert err.startswith("usage: parallax manifest")


def test_parallax_tune_without_the_separator_says_the_scripts_arguments_go_after_it(script, capsys):
    path, res = script
    err = refused(tune_main, [path, res, "--lr", "0.1"], capsys)
    assert re.search(rf"^parallax tune: error: unrecognized arguments: --lr 0\.1\. The script's arguments go after "
                     rf"--, e\.g\. parallax tune {re.escape(path)} {re.escape(res)} -- --lr 0\.1$", err, re.M), err


def test_parallax_plan_without_the_separator_says_the_scripts_arguments_go_after_it(script, capsys):
    path, res = script
    err = refused(plan_main, [path, res, "--batch", "8"], capsys)
    assert "unrecognized arguments: --batch 8. The script's arguments go after --" in err


def test_an_unknown_option_before_the_separator_is_just_unknown(script, capsys):
    path, res = script
    err = refused(manifest_main, ["--kind", "tfjob", "--colour=red", res, "--", "python", path], capsys)
    assert re.search(r"^parallax manifest: error: unrecognized arguments: --colour=red$", err, re.M), err


@pytest.mark.parametrize("port", ["0", "70000", "http"])
def test_parallax_manifest_checks_its_port(script, capsys, port):
    path, res = script
    err = refused(manifest_main, ["--kind", "tfjob", "--port", port, res, "--", "python", path], capsys)
    assert re.search(rf"^parallax manifest: error: argument --port: expected a port 1-65535, got '{port}'$", err,
                     re.M), err
