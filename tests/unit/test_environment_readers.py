"""The environment is read at the doors only: ``parallel_run`` (parallax/api.py), the commands (parallax/cli/),
the invocation itself, the logger and the user-facing partitioner read it, and hand what it says down as
arguments; no module below them reads ``os.environ``, ``os.getenv``, ``invocation.current()`` or
``invocation.setting()``, and none but the launcher's side writes ``os.environ``.

A few modules read variables that are not Parallax's controls, each for the reason :data:`HANDED_THROUGH` gives
(this process's environment handed to a child process, a Slurm allocation, a compiler); they may not read a
control (``current()``, ``setting()``). The ``main()`` of a module run with ``python -m`` is the door of its own
process, and may read and write its environment.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from tests.package import PACKAGE, package_modules

#: The doors: they read the environment (paths relative to the package; a folder ends with "/").
DOORS = ("api.py", "cli/", "invocation/", "logs.py", "partitioner.py")

#: Modules that read variables other than Parallax's controls from ``os.environ``, and why.
HANDED_THROUGH = {
    "launch/launcher.py": "the ranks' environment: this process's, handed through to mpirun (and whether this "
                          "process has its own CUDA_VISIBLE_DEVICES, which the ranks' GPU ids count within)",
    "launch/runner.py": "mpirun's environment (this process's, handed through) and TF_CPP_MIN_LOG_LEVEL",
    "launch/probe.py": "the link probe's mpirun environment (this process's, handed through)",
    "launch/preflight.py": "the Slurm allocation the hosts' checks run in (SLURM_*)",
    "resources/files.py": "resource_info 'slurm', 'mpijob' or None: the allocation the environment describes (SLURM_*, "
                    "an MPIJob's host file)",
    "comm/native.py": "CXX: the compiler the user chose for the compiled op",
    "member/servers.py": "TF_NUM_INTEROP_THREADS: TensorFlow's own default, which the inter-op pool is sized from",
    "manifests/validate.py": "SLURM_CONF, CONDOR_CONFIG: what the validating tools read",
    "trials/sweeps.py": "PYTHONPATH: handed to a sweep's trial process",
}

#: Modules that write ``os.environ`` (besides the invocation's own ``export``), and why.
WRITERS = {
    "manifests/validate.py": "CONDOR_CONFIG=/dev/null before importing HTCondor's parser (no pool is asked)",
}

_WRITING_METHODS = {"setdefault", "pop", "update", "clear", "popitem", "__setitem__", "__delitem__"}


@dataclass(frozen=True)
class Found:
    """One access to the environment: where, what, and whether it writes or reads a control."""

    line: int
    text: str
    writes: bool = False
    control: bool = False  # current(), setting() or Invocation.from_env() of this process's environment
    in_main: bool = False


def _is_os_attr(node: ast.AST, names: tuple[str, ...]) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
        and node.attr in names


def scan(source: str) -> list[Found]:
    """Every read and write of the environment in a module's ``source``."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    imported = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "parallax.invocation" for alias in node.names}
    modules = {alias.asname or "invocation" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "parallax" for alias in node.names if alias.name == "invocation"}
    modules |= {alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names if alias.name == "parallax.invocation" and alias.asname}
    environ_names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                     and node.module == "os" for alias in node.names if alias.name == "environ"}

    def in_main(node: ast.AST) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
                return True
        return False

    def invocation_function(func: ast.AST) -> str | None:
        if isinstance(func, ast.Name) and func.id in imported:
            return imported[func.id]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
            return func.attr
        if isinstance(func, ast.Attribute) and func.attr == "from_env" and isinstance(func.value, ast.Name) \
                and imported.get(func.value.id) == "Invocation":
            return "from_env"
        return None

    found = []
    for node in ast.walk(tree):
        main = in_main(node)
        if _is_os_attr(node, ("environ",)) or (isinstance(node, ast.Name) and node.id in environ_names):
            parent = parents.get(node)
            writes = (isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del))) or \
                (isinstance(parent, ast.Attribute) and parent.attr in _WRITING_METHODS)
            found.append(Found(node.lineno, "os.environ", writes=writes, in_main=main))
        elif isinstance(node, ast.Call):
            if _is_os_attr(node.func, ("getenv",)):
                found.append(Found(node.lineno, "os.getenv", in_main=main))
            elif _is_os_attr(node.func, ("putenv", "unsetenv")):
                found.append(Found(node.lineno, f"os.{node.func.attr}", writes=True, in_main=main))
            name = invocation_function(node.func)
            given = node.args[1:2] if name == "setting" else node.args[:1]
            given = given or [k.value for k in node.keywords if k.arg == "environ"]
            mapping = bool(given) and not (isinstance(given[0], ast.Constant) and given[0].value is None)
            if name == "current" or (name in ("setting", "from_env") and not mapping):
                found.append(Found(node.lineno, f"invocation.{name}()", control=True, in_main=main))
            elif name == "export":
                found.append(Found(node.lineno, "invocation.export()", writes=True, in_main=main))
    return sorted(found, key=lambda f: f.line)


def _allowed(where: str, found: Found) -> bool:
    if found.in_main or where.startswith("invocation/"):
        return True
    if found.writes:
        return where in WRITERS or where == "launch/launcher.py"
    if any(where == door or (door.endswith("/") and where.startswith(door)) for door in DOORS):
        return True
    return where in HANDED_THROUGH and not found.control


def test_only_the_doors_read_the_environment_and_only_the_launchers_side_writes_it():
    bad = []
    for path in package_modules():
        where = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
        with open(path, encoding="utf-8") as f:
            found = scan(f.read())
        bad += [f"parallax/{where}:{f.line}: {'writes' if f.writes else 'reads'} {f.text}"
                for f in found if not _allowed(where, f)]
    assert not bad, ("these modules below the doors read or write the environment; take the value as an "
                     "argument from parallel_run or the command that read the invocation:\n" + "\n".join(bad))


def test_every_exception_is_still_needed():
    """An entry of HANDED_THROUGH or WRITERS whose module no longer reads (or writes) the environment goes."""
    for table, writes in ((HANDED_THROUGH, False), (WRITERS, True)):
        for where in table:
            with open(os.path.join(PACKAGE, where), encoding="utf-8") as f:
                found = [f for f in scan(f.read()) if not f.in_main and f.writes == writes]
            assert found, f"parallax/{where} no longer {'writes' if writes else 'reads'} the environment"


def test_the_scan_sees_every_way_of_reading_and_writing():
    source = '''
import os
from os import environ as env
from parallax import invocation
from parallax.invocation import Invocation, current, export, setting

a = os.environ["HOME"]
b = os.getenv("HOME")
c = "X" in os.environ
d = current().tuned
e = setting("log_level")
f = invocation.current()
g = Invocation.from_env()
h = env.get("HOME")
os.environ["A"] = "1"
os.environ.pop("A")
export(tuned=None)
fine = setting("tf_config", {"TF_CONFIG": "{}"}), Invocation.from_env({})


def main():
    return current()
'''
    found = scan(source)
    assert [(f.line, f.text, f.writes, f.control) for f in found if not f.in_main] == [
        (7, "os.environ", False, False), (8, "os.getenv", False, False), (9, "os.environ", False, False),
        (10, "invocation.current()", False, True), (11, "invocation.setting()", False, True),
        (12, "invocation.current()", False, True), (13, "invocation.from_env()", False, True),
        (14, "os.environ", False, False), (15, "os.environ", True, False), (16, "os.environ", True, False),
        (17, "invocation.export()", True, False)]
    assert [f.line for f in found if f.in_main] == [22]
    assert not _allowed("search.py", found[0]) and _allowed("launch/launcher.py", found[0])
    assert not _allowed("launch/launcher.py", found[3])  # the launcher's side reads no control
    assert not _allowed("api.py", found[9]) and _allowed("launch/launcher.py", found[9])
