"""parallax.invocation: the environment into a frozen invocation of typed fields and records and back, what
kind of process it makes, the clear error of a bad value, and that no other module of the package reads a
control variable."""

import ast
import os

import pytest

from parallax.invocation import (
    CONTROLS,
    FORWARDED,
    CommTuning,
    Invocation,
    Kind,
    LaunchIdentity,
    PlanRequest,
    RankChannel,
    SearchRequest,
    TrialRequest,
    current,
    env_with,
    export,
)
from tests.package import PACKAGE, package_modules


def _every_field_set() -> Invocation:
    """An invocation whose every field is away from its default (so every variable is written)."""
    values = {c.attr: f"text of {c.name}" for c in CONTROLS.values() if c.form == "text" and c.record is None}
    return Invocation(
        **values, plan=PlanRequest("/r/info", "PS", {"a": 1}, {"redirect_path": "/x"}, output="/o.json"),
        trial=TrialRequest({"run_option": "MPI"}, 1, 3),
        launch=LaunchIdentity('[{"host": "h"}]', "HYBRID", "abc", 2, {"text": "h: cpu:0", "source": "s"}),
        skip_host_check=True, use_tuned=False, tuned={"run_option": "PS"}, sweep_params={"lr": 0.1},
        finish_timeout=7.5, stall_shutdown=30.0, staggered_start=False,
        channel=RankChannel("/jobs/7", "10.0.0.1:5000", 12.0),
        search=SearchRequest(8, (1, 3), "dask", "tcp://s:8786", 90.0, True),
        comm=CommTuning(native_ops=False, huge_pages=False, arrival_spin=250e-6, slot_device="gpu"))


def test_an_invocation_goes_to_the_environment_and_back_unchanged():
    invocation = _every_field_set()
    env = invocation.to_env()
    assert set(env) == set(CONTROLS)
    assert Invocation.from_env(env) == invocation
    assert Invocation.from_env({}) == Invocation() and Invocation().to_env() == {}
    assert Invocation.from_env({"PARALLAX_LOG_LEVEL": ""}).log_level is None  # empty is unset


def test_numbers_flags_and_records_are_parsed_once_with_their_defaults():
    invocation = Invocation.from_env({
        "PARALLAX_NUM_PARTITIONS": " 8", "PARALLAX_SEARCH_STEPS": "0,0", "PARALLAX_TRIAL_BACKEND": " Dask ",
        "PARALLAX_TRIAL_TIMEOUT": "90", "PARALLAX_RERUN": "1", "PARALLAX_FINISH_TIMEOUT": "5",
        "PARALLAX_STALL_TIMEOUT": "2.5", "PARALLAX_JOB_DIR": "/j", "PARALLAX_NATIVE_OPS": "0",
        "PARALLAX_HUGE_PAGES": "off", "PARALLAX_ARRIVAL_SPIN_US": "250", "PARALLAX_SLOT_DEVICE": "GPU",
        "PARALLAX_USE_TUNED": "no", "PARALLAX_SKIP_HOST_CHECK": "1", "PARALLAX_STAGGERED_START": "0",
        "PARALLAX_STALL_SHUTDOWN": "none", "PARALLAX_TUNED": '{"run_option": "MPI"}'})
    assert invocation.search == SearchRequest(8, (0, 1), "dask", None, 90.0, True)
    assert invocation.channel == RankChannel("/j", None, 2.5)
    assert invocation.comm == CommTuning(native_ops=False, huge_pages=False, arrival_spin=250e-6, slot_device="gpu")
    assert (invocation.finish_timeout, invocation.use_tuned, invocation.skip_host_check) == (5.0, False, True)
    assert (invocation.staggered_start, invocation.stall_shutdown) == (False, "none")
    assert invocation.tuned == {"run_option": "MPI"}
    unset = Invocation.from_env({})
    assert (unset.search, unset.channel, unset.comm) == (SearchRequest(), RankChannel(), CommTuning())
    assert unset.search.steps == (2, 5) and unset.search.trial_timeout == 600.0 and unset.search.backend == "local"
    assert unset.comm.native_ops and unset.comm.huge_pages and unset.use_tuned and not unset.skip_host_check
    assert unset.finish_timeout is None and unset.staggered_start is None and unset.search.partitions is None
    assert Invocation.from_env({"PARALLAX_ARRIVAL_SPIN_US": "OFF"}).comm.arrival_spin == "off"


@pytest.mark.parametrize("name, text, expected", [
    ("PARALLAX_NUM_PARTITIONS", "many", "a count"),
    ("PARALLAX_SEARCH_STEPS", "five", "'warmup,timed'"),
    ("PARALLAX_TRIAL_TIMEOUT", "soon", "seconds"),
    ("PARALLAX_FINISH_TIMEOUT", "1m", "seconds"),
    ("PARALLAX_STALL_TIMEOUT", "x", "seconds"),
    ("PARALLAX_STALL_SHUTDOWN", "never", "seconds"),
    ("PARALLAX_NATIVE_OPS", "maybe", "1 or 0"),
    ("PARALLAX_USE_TUNED", "2", "1 or 0"),
    ("PARALLAX_ARRIVAL_SPIN_US", "-1", "'off' or microseconds"),
    ("PARALLAX_ARRIVAL_SPIN_US", "soon", "'off' or microseconds"),
    ("PARALLAX_ARRIVAL_SPIN_US", "nan", "'off' or microseconds"),
    ("PARALLAX_TUNED", "[1]", "a JSON object"),
    ("PARALLAX_SWEEP_PARAMS", "{", "a JSON object"),
])
def test_a_bad_value_names_its_variable_and_what_it_expected(name, text, expected):
    with pytest.raises(ValueError) as raised:
        Invocation.from_env({name: text})
    assert str(raised.value).startswith(f"{name}={text!r}: expected {expected}")


@pytest.mark.parametrize("invocation, kind", [
    (Invocation(), Kind.PLAIN),
    (Invocation(plan=PlanRequest(output="/p.json")), Kind.PLAN),
    (Invocation(plan=PlanRequest(manifest={"kind": "slurm"})), Kind.MANIFEST),
    (Invocation(plan=PlanRequest(tune={"space": {}})), Kind.TUNE),
    (Invocation(trial=TrialRequest()), Kind.TRIAL),
    (Invocation(launch=LaunchIdentity("[]")), Kind.LAUNCHED),
    (Invocation(launch=LaunchIdentity("[]"), trial=TrialRequest()), Kind.LAUNCHED),  # a trial's launched rank
    (Invocation(tf_config='{"cluster": {}}'), Kind.MANAGED),
])
def test_the_kind_of_process_follows_from_the_invocation(invocation, kind):
    assert invocation.kind is kind and invocation.kind == kind.value  # a str: "plan", "launched", ...
    assert Invocation.from_env(invocation.to_env()).kind is kind


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
    assert env_with({}, tuned={"b": 2, "a": 1}, partitions=8, rerun=True, use_tuned=False) == {  # typed values
        "PARALLAX_TUNED": '{"a": 1, "b": 2}', "PARALLAX_NUM_PARTITIONS": "8", "PARALLAX_RERUN": "1",
        "PARALLAX_USE_TUNED": "0"}
    export(tuned='{"b": 2}')
    assert current().tuned == {"b": 2} and os.environ["PARALLAX_TUNED"] == '{"b": 2}'
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
    for path in package_modules("invocation/__init__.py", "invocation/records.py"):
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
