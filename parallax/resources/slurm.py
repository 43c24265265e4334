"""Read a Slurm allocation as a resource file (``resource_info="slurm"``, or none given inside one).

Inside an ``sbatch`` script or ``salloc`` shell, Slurm describes the job's
nodes in the environment: ``SLURM_JOB_NODELIST`` (a host list such as
``node[01-04,07]``), ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) and, for GPU jobs,
``SLURM_GPUS_PER_NODE`` / ``SLURM_GPUS_ON_NODE``. :func:`allocation_text` turns
them into the text of a resource file, one line per node:

* a node with GPUs: one replica per GPU, ``node01: 0,1,2,3``;
* a node without: one replica per task, ``node01: cpu:0,cpu:1``.

Everything here is pure (the environment is an argument), so it is tested
without Slurm; launching inside the allocation is Open MPI's own Slurm support
(``mpirun`` starts its daemons with ``srun``), see ``docs/launching.md``.

>>> expand_hostlist("vhost[1-3],login,gpu[08-10]")
['vhost1', 'vhost2', 'vhost3', 'login', 'gpu08', 'gpu09', 'gpu10']
>>> expand_counts("2(x3),1")
[2, 2, 2, 1]
>>> print(allocation_text({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}),
...       end="")
# the Slurm allocation of job 7: SLURM_JOB_NODELIST=n[1-2], SLURM_TASKS_PER_NODE=2(x2)
n1: cpu:0,cpu:1
n2: cpu:0,cpu:1
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from parallax.errors import ResourceFileError

__all__ = ["SLURM", "in_allocation", "expand_hostlist", "expand_counts", "allocation_text", "allocation_name",
           "allocation_hosts", "tasks_per_node"]

#: The ``resource_info`` value that means "the Slurm allocation this process runs in".
SLURM = "slurm"

_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is that of a process inside a Slurm allocation (a job's nodes are known)."""
    return bool(environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"))


def allocation_name(environ: Mapping[str, str]) -> str:
    """How messages call the allocation: ``the Slurm allocation of job 7``."""
    return f"the Slurm allocation of job {environ.get('SLURM_JOB_ID', '?')}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``a[1-3,07],b``) as host names, in order.

    Raises:
        ValueError: ``text`` is not a host list (unbalanced brackets, a bad range).
    """
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = [_expand_range(p[1:-1]) if p.startswith("[") else [p] for p in parts if p]
        hosts.extend("".join(c) for c in itertools.product(*choices))
    if not hosts:
        raise ValueError("no host in it")
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced brackets in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    items.append(text[start:])
    return [i for i in items if i]


def _expand_range(text: str) -> list[str]:
    """``1-3,07`` -> ``['1', '2', '3', '07']`` (a range keeps the width of its first number)."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"bad range {part!r}")
        if not high:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"bad range {part!r}")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts (``2(x3),1``) as one number per node.

    Raises:
        ValueError: ``text`` is not such a list.
    """
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _COUNT.match(part.strip())
        if not match:
            raise ValueError(f"bad count {part!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _gpus_per_node(environ: Mapping[str, str]) -> int:
    """GPUs of each node: ``SLURM_GPUS_PER_NODE`` (``4`` or ``a100:4``), else what the batch node got
    (``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``); 0 for a CPU job."""
    per_node = environ.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node:
        return int(per_node.rsplit(":", 1)[-1].split("(")[0])
    on_node = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit():
        return int(on_node)
    job_gpus = environ.get("SLURM_JOB_GPUS", "").strip()
    return len([g for g in job_gpus.split(",") if g]) if job_gpus else 0


def allocation_hosts(environ: Mapping[str, str]) -> list[str]:
    """The allocation's nodes, in order.

    Raises:
        ResourceFileError: not inside an allocation, or ``SLURM_JOB_NODELIST`` is malformed.
    """
    if not in_allocation(environ):
        raise ResourceFileError(
            f"resource_info {SLURM!r}: this process is not inside a Slurm allocation (SLURM_JOB_ID and "
            "SLURM_JOB_NODELIST are not set). Run it from an sbatch script or an salloc shell, or give the path "
            "of a resource file.")
    nodelist = environ["SLURM_JOB_NODELIST"]
    try:
        return expand_hostlist(nodelist)
    except ValueError as e:
        raise ResourceFileError(f"{allocation_name(environ)}: SLURM_JOB_NODELIST={nodelist!r} is not a Slurm "
                                f"host list ({e}); expected e.g. 'node[01-04],gpu7'") from None


def tasks_per_node(environ: Mapping[str, str]) -> dict[str, int] | None:
    """The allocation's tasks on each node (Open MPI's slots there), or ``None`` outside one (or when
    Slurm's variables cannot be read: then ``mpirun`` judges alone)."""
    if not in_allocation(environ):
        return None
    try:
        hosts = expand_hostlist(environ["SLURM_JOB_NODELIST"])
        return dict(zip(hosts, _node_tasks(environ, hosts)))
    except ValueError:
        return None


def _tasks_variable(environ: Mapping[str, str]) -> str:
    return environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_NTASKS_PER_NODE") or "1"


def _node_tasks(environ: Mapping[str, str], hosts: list[str]) -> list[int]:
    """The tasks of each of ``hosts``. Raises ValueError: the variable is malformed or disagrees."""
    counts = expand_counts(_tasks_variable(environ))
    if len(counts) == 1:
        counts *= len(hosts)
    if len(counts) != len(hosts):
        raise ValueError(f"it gives {len(counts)} nodes, SLURM_JOB_NODELIST {len(hosts)}")
    return counts


def allocation_text(environ: Mapping[str, str]) -> str:
    """The allocation as the text of a resource file (see the module docstring).

    Raises:
        ResourceFileError: not inside an allocation, or its variables are malformed or disagree.
    """
    hosts = allocation_hosts(environ)
    name = allocation_name(environ)
    shown = [f"SLURM_JOB_NODELIST={environ['SLURM_JOB_NODELIST']}"]
    try:
        gpus = _gpus_per_node(environ)
    except ValueError:
        raise ResourceFileError(f"{name}: cannot read the GPUs per node from SLURM_GPUS_PER_NODE="
                                f"{environ.get('SLURM_GPUS_PER_NODE')!r}; expected e.g. '4' or 'a100:4'") from None
    if gpus:
        shown.append(f"{gpus} GPUs per node")
        lines = [f"{h}: {','.join(str(i) for i in range(gpus))}" for h in hosts]
    else:
        tasks = _tasks_variable(environ)
        try:
            counts = _node_tasks(environ, hosts)
        except ValueError as e:
            raise ResourceFileError(f"{name}: cannot read SLURM_TASKS_PER_NODE={tasks!r} ({e}); expected one "
                                    "count per node, e.g. '2(x3),1'") from None
        shown.append(f"SLURM_TASKS_PER_NODE={tasks}")
        lines = [f"{h}: {','.join(f'cpu:{i}' for i in range(max(1, n)))}" for h, n in zip(hosts, counts)]
    return f"# {name}: {', '.join(shown)}\n" + "\n".join(lines) + "\n"
