"""The backend registry, the backends' run-time hooks, and the import layout of ``parallax.comm``."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
from tensorflow.core.protobuf import config_pb2

from parallax.comm import ProcessComms, backend_class, backend_for, backends_in_use, horovod_available
from parallax.comm.base import Backend
from parallax.errors import PlanError
from parallax.plan.model import CommSpec, GradientRef, Plan, PSSpec, VariablePlacement, WorkerPlan

COMM = pathlib.Path(__file__).resolve().parents[3] / "parallax" / "comm"
PARALLAX = COMM.parent


def imports_of(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_backend_modules_import_only_the_base_so_there_is_no_circle():
    leaves = {"parallax.comm.base", "parallax.comm.packing", "parallax.comm.native",  # import nothing of comm
              "parallax.comm.arrival"}
    for name in ("base", "packing", "native", "arrival"):
        assert not {m for m in imports_of(COMM / f"{name}.py") if m.startswith("parallax.comm")}, name
    below = set(leaves)
    for name in ("mpi_calls", "mpi_lowering", "mpi_binding"):  # the mpi backend's parts: leaves and those before
        imported = {m for m in imports_of(COMM / f"{name}.py") if m.startswith("parallax.comm")}
        assert imported <= below, name
        below.add(f"parallax.comm.{name}")
    for name in ("mpi", "collective", "horovod"):
        imported = {m for m in imports_of(COMM / f"{name}.py") if m.startswith("parallax.comm")}
        assert imported <= below, name


def test_no_module_outside_comm_switches_on_a_backend_name():
    for path in PARALLAX.rglob("*.py"):
        if COMM in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                assert not {"mpi", "collective", "horovod"} & set(constants), f"{path}:{node.lineno}"


@pytest.mark.parametrize("name, needs_server, groups", [
    ("mpi", False, True), ("collective", True, False),
], ids=["mpi", "collective"])
def test_each_backend_says_what_its_process_needs(name, needs_server, groups):
    cls = backend_class(name)
    assert issubclass(cls, Backend) and cls.name == name
    assert (cls.needs_server, cls.supports_groups) == (needs_server, groups)


def test_the_collective_backend_names_the_group_leader_in_the_session_config():
    config = config_pb2.ConfigProto()
    backend_class("collective").configure_session(config, ProcessComms(group_leader="/job:worker/replica:0/task:0"))
    assert config.experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    plain = config_pb2.ConfigProto()
    backend_class("mpi").configure_session(plain, ProcessComms(group_leader="/job:worker/replica:0/task:0"))
    assert plain == config_pb2.ConfigProto()


def test_unknown_backends_and_groups_are_refused_with_the_choices():
    with pytest.raises(PlanError, match=r"^unknown all-reduce backend 'nccl'; known: mpi, collective, horovod$"):
        backend_class("nccl")
    with pytest.raises(PlanError, match=r"^the collective backend cannot communicate within a group of workers$"):
        backend_for(CommSpec(backend="collective"), 2, group="host")


@pytest.mark.skipif(horovod_available(), reason="horovod is installed")
def test_horovod_asked_for_but_missing_says_what_to_use_instead():
    with pytest.raises(PlanError, match=r"horovod is not installed .* Use MPIConfig\(backend='mpi'\)"):
        backend_class("horovod")


def _var(name, sync, sparse=False):
    gradient = GradientRef(f"{name}_grad:0", f"{name}_idx:0" if sparse else None, "float32",
                           "int64" if sparse else None)
    return VariablePlacement(name, (4, 2), "float32", True, gradient, sync=sync, server=0 if sync == "ps" else None)


@pytest.mark.parametrize("variables, ps, expected", [
    ((_var("a", "allreduce"),), PSSpec(), ("collective",)),
    ((_var("a", "allreduce"), _var("e", "allgather", True)), PSSpec(), ("collective", "mpi")),
    ((_var("e", "ps", True),), PSSpec(host_aggregation=True), ("mpi",)),
    ((_var("e", "ps", True),), PSSpec(), ()),
    ((_var("a", "local"),), PSSpec(), ()),
], ids=["dense", "dense-and-gathered", "host-aggregation", "ps-only", "local"])
def test_backends_in_use_are_those_the_plan_has_ops_of(variables, ps, expected):
    worker = WorkerPlan("h", ("/device:CPU:0",), "/device:CPU:0")
    plan = Plan("MPI", True, (worker, worker), variables, ("train",),
                comm=CommSpec(backend="collective", use_allgatherv=True), ps=ps)
    assert tuple(cls.name for cls in backends_in_use(plan)) == expected


def test_mpi_ops_are_bound_to_this_process_and_released_with_the_session(tmp_path):
    """In a child process (MPI is initialised there, as a one-rank job without mpirun)."""
    script = tmp_path / "bind.py"
    script.write_text(textwrap.dedent('''
        import numpy as np
        import tensorflow as tf
        from tensorflow.python.ops import script_ops
        from parallax.comm import ProcessComms, backend_class
        from parallax.plan.model import CommSpec

        graph = tf.Graph()
        with graph.as_default():
            x = tf.constant([1.0, 2.0], name="x")
            backend = backend_class("mpi")(CommSpec(), 1)
            total = backend.allreduce_sum([x])[0]
        graph_def = graph.as_graph_def()
        backend.finalize_nodes(graph_def.node)
        tokens = [n.attr["token"].s.decode() for n in graph_def.node if n.op == "PyFunc"]
        assert tokens == ["parallax_comm:mpi_allreduce"], tokens
        before = len(script_ops._py_funcs._funcs)
        prepared = backend_class("mpi").prepare(graph_def, ProcessComms())
        run = tf.Graph()
        with run.as_default():
            tf.graph_util.import_graph_def(prepared.graph_def, name="")
            with tf.compat.v1.Session() as sess:
                print("sum", sess.run(total.name).tolist())
        assert len(script_ops._py_funcs._funcs) == before + 6  # one function per MPI call kind
        prepared.release()
        assert len(script_ops._py_funcs._funcs) == before
        print("released")
    '''))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PARALLAX.parent)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sum [1.0, 2.0]\nreleased" in out.stdout
