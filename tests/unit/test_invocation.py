"""parallax.invocation: the environment into a frozen invocation and back, what kind of process it makes, and
that no other module of the package reads a control variable."""

import ast
import os

import pytest

from parallax.invocation import (
    CONTROLS,
    FORWARDED,
    Invocation,
    LaunchIdentity,
    PlanRequest,
    TrialRequest,
    current,
    env_with,
    export,
)
from tests.package import PACKAGE, package_modules


def _every_field_set() -> Invocation:
    values = {c.attr: f"text of {c.name}" for c in CONTROLS.values()}
    values["plan"] = PlanRequest("/r/info", "PS", {"a": 1}, {"redirect_path": "/x"}, output="/o.json")
    values["trial"] = TrialRequest({"run_option": "MPI"}, 1, 3)
    values["launch"] = LaunchIdentity('[{"host": "h"}]', "HYBRID", "abc", 2, {"text": "h: cpu:0", "source": "s"})
    return Invocation(**values)


def test_an_invocation_goes_to_the_environment_and_back_unchanged():
    invocation = _every_field_set()
    env = invocation.to_env()
    assert set(env) == set(CONTROLS)
    assert Invocation.from_env(env) == invocation
    assert Invocation.from_env({}) == Invocation() and Invocation().to_env() == {}
    assert Invocation.from_env({"PARALLAX_LOG_LEVEL": ""}).log_level is None  # empty is unset


@pytest.mark.parametrize("invocation, kind", [
    (Invocation(), "plain"),
    (Invocation(plan=PlanRequest(output="/p.json")), "plan"),
    (Invocation(plan=PlanRequest(manifest={"kind": "slurm"})), "manifest"),
    (Invocation(plan=PlanRequest(tune={"space": {}})), "tune"),
    (Invocation(trial=TrialRequest()), "trial"),
    (Invocation(launch=LaunchIdentity("[]")), "launched"),
    (Invocation(launch=LaunchIdentity("[]"), trial=TrialRequest()), "launched"),  # a trial's launched rank
    (Invocation(tf_config='{"cluster": {}}'), "managed"),
])
def test_the_kind_of_process_follows_from_the_invocation(invocation, kind):
    assert invocation.kind == kind
    assert Invocation.from_env(invocation.to_env()).kind == kind


@pytest.mark.parametrize("name, text", [("PARALLAX_PLAN_ONLY", "not json"), ("PARALLAX_TRIAL", '{"steps": "x"}'),
                                        ("PARALLAX_LAUNCH", '{"job": {}}')])
def test_a_malformed_request_names_its_variable(name, text):
    with pytest.raises(ValueError, match=name):
        Invocation.from_env({name: text})


def test_the_forwarded_variables_are_the_forwarded_controls_and_what_a_program_needs():
    assert {c.name for c in CONTROLS.values() if c.forwarded} <= set(FORWARDED)
    assert "PARALLAX_LAUNCH" not in FORWARDED and "PATH" in FORWARDED  # each rank gets its own identity


def test_a_child_environment_and_this_process_take_changes(monkeypatch):
    monkeypatch.delenv("PARALLAX_TUNED", raising=False)
    env = env_with({"PATH": "/bin", "PARALLAX_DRY_RUN": "/d"}, tuned='{"a": 1}', dry_run=None)
    assert env == {"PATH": "/bin", "PARALLAX_TUNED": '{"a": 1}'}
    export(tuned='{"b": 2}')
    assert current().tuned == '{"b": 2}' and os.environ["PARALLAX_TUNED"] == '{"b": 2}'
    export(tuned=None)
    assert current().tuned is None and "PARALLAX_TUNED" not in os.environ


def _literals(path: str) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings, with their lines."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _lookups_by_imported_name(path: str) -> list[tuple[int, str]]:
    """``m.get(NAME)``, ``m[NAME]``, ``NAME in m`` where NAME is a variable's name from parallax.invocation."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module == "parallax.invocation"
             for alias in node.names if alias.name.endswith("_ENV")}
    found = []
    for node in ast.walk(tree):
        keys = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
            keys = node.args[:1]
        elif isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
            keys = [node.left]
        found += [(node.lineno, k.id) for k in keys if isinstance(k, ast.Name) and k.id in names]
    return found


def test_no_other_module_reads_a_control_variable():
    """Every other module takes the names from parallax.invocation and the values from an Invocation: none
    spells a control variable, nor looks one up in a mapping by its name."""
    found = []
    for path in package_modules("invocation.py"):
        where = os.path.relpath(path, PACKAGE)
        found += [f"{where}:{line}: {text!r}" for line, text in _literals(path)
                  if text.strip() in CONTROLS or any(text.startswith(f"{n}=") for n in CONTROLS)]
        found += [f"{where}:{line}: a lookup by {name}" for line, name in _lookups_by_imported_name(path)]
    assert not found, "\n".join(found)


def test_the_docs_list_every_control_variable_as_the_table_says():
    with open(os.path.join(os.path.dirname(PACKAGE), "docs", "environment.md"), encoding="utf-8") as f:
        text = f.read()
    for c in CONTROLS.values():
        assert f"| `{c.name}` | {'yes' if c.forwarded else 'no'} | {c.doc} |" in text, c.name
