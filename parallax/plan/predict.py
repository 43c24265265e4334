"""Predicted speed of a model's training on a cluster, per run option (``parallax plan --predict``).

Inputs: the model's variables (shapes, dtypes, which gradients are sparse and
how many rows a device's gradient touches per step, as the plan says), a
measured single-device step time ``T``, and a cluster of ``H`` hosts with
``G`` devices each (``N = H * G`` devices, one replica each), joined by a
link between hosts and one inside a host, each a bandwidth per direction and
a latency.

For a dense variable of ``B`` bytes, and a sparse one whose gradient touches
``k`` rows of ``r`` bytes per device and step (``s = k * (r + 8)`` bytes with
the indices), the bytes over the busiest link of one step are:

==============  =============================  ==========================================
layout          dense                          sparse
==============  =============================  ==========================================
all-reduce      ``2 (N-1)/N * B`` (ring)       all-gather: ``(N-1) * s`` (ring)
PS per device   ``2 G (H-1)/H * B`` per host   ``2 G (H-1)/H * s`` per host
PS per host     ``2 (H-1)/H * B`` per host     ``2 (H-1)/H * min(G k, rows) (r + 8)``
==============  =============================  ==========================================

(A ring's busiest link is the one between two hosts, which every block
crosses once; a server per host holds ``1/H`` of each variable, so a host
sends what its devices push to the other hosts' servers and what its server
returns to the other hosts' devices. "Per host": the devices of a host sum
their gradients first, over the link inside the host, and a row touched by
several of them travels once.) Each collective also costs its rounds of
latency: ``2 (N-1)`` for a ring all-reduce, ``N-1`` for an all-gather, 2 for a
push and a pull.

The layouts: **MPI** (and Horovod) all-reduces dense gradients and
all-gathers sparse ones; **PS** is Parallax's parameter servers (per host:
``PSConfig.local_aggregation``); **HYBRID** all-reduces dense gradients and
sends sparse ones to the servers per host; **TF PS** is TensorFlow's own
(``replica_device_setter``: every device pushes and pulls). A step takes
``T + communication`` (no overlap: a bound), so the cluster processes
``N / step`` device batches a second, a speedup of ``N T / step`` over one
device and a scaling efficiency of ``T / step``.

What it leaves out, and why measured figures can be lower: copies between
device and host memory, the servers' own work (summing, applying the update),
stragglers, and collectives slower than a ring (docs/benchmarks.md compares it
with the Parallax paper's figures).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Link", "ClusterShape", "VariableCost", "Prediction", "LAYOUTS", "predict", "communication",
           "parse_bandwidth", "parse_latency", "parse_cluster", "variables_of_plan", "cluster_of_plan",
           "format_predictions"]

#: The layouts predicted, in the order printed.
LAYOUTS = ("MPI", "PS", "HYBRID", "TF PS")
_INDEX_BYTES = 8


@dataclass(frozen=True)
class Link:
    """A link's bandwidth (bytes per second, each direction) and latency (seconds)."""

    bandwidth: float
    latency: float = 0.0

    def seconds(self, num_bytes: float, rounds: int) -> float:
        return num_bytes / self.bandwidth + rounds * self.latency


@dataclass(frozen=True)
class ClusterShape:
    """``hosts`` hosts of ``devices`` devices, the link between hosts and the one inside a host."""

    hosts: int
    devices: int
    between: Link
    inside: Link

    @property
    def workers(self) -> int:
        return self.hosts * self.devices


@dataclass(frozen=True)
class VariableCost:
    """What a variable costs to synchronise: its bytes, and for a sparse gradient its rows,
    the bytes of a row and the rows one device's gradient touches per step."""

    name: str
    num_bytes: int
    sparse: bool = False
    rows: int = 1
    row_bytes: int = 0
    rows_touched: float = 0.0


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step: seconds communicating, the whole step, the speedup over one
    device, the scaling efficiency, and the bytes over a host's link to the others per step."""

    layout: str
    communication_s: float
    step_s: float
    speedup: float
    efficiency: float
    between_hosts_bytes: float


def _ring_allreduce(num_bytes: float, cluster: ClusterShape) -> tuple[float, float]:
    """(seconds, bytes over the busiest link between hosts) of a ring all-reduce."""
    n = cluster.workers
    if n < 2 or num_bytes == 0:
        return 0.0, 0.0
    link = cluster.between if cluster.hosts > 1 else cluster.inside
    moved = 2 * (n - 1) / n * num_bytes
    return link.seconds(moved, 2 * (n - 1)), moved if cluster.hosts > 1 else 0.0


def _ring_allgather(per_device: float, cluster: ClusterShape) -> tuple[float, float]:
    n = cluster.workers
    if n < 2 or per_device == 0:
        return 0.0, 0.0
    link = cluster.between if cluster.hosts > 1 else cluster.inside
    moved = (n - 1) * per_device
    return link.seconds(moved, n - 1), moved if cluster.hosts > 1 else 0.0


def _servers(per_sender: float, senders_per_host: int, cluster: ClusterShape,
             aggregated_inside: float = 0.0) -> tuple[float, float]:
    """Push and pull through a server per host: ``senders_per_host`` senders of ``per_sender``
    bytes each on every host; ``aggregated_inside``: bytes first summed over the link inside a host."""
    h = cluster.hosts
    if cluster.workers < 2 or per_sender == 0:
        return 0.0, 0.0
    inside = cluster.inside.seconds(aggregated_inside, 1) if aggregated_inside else 0.0
    if h < 2:  # the host's own server, over the link inside it
        return inside + cluster.inside.seconds(2 * senders_per_host * per_sender, 2), 0.0
    moved = 2 * senders_per_host * per_sender * (h - 1) / h
    return inside + cluster.between.seconds(moved, 2), moved


def communication(variables: Iterable[VariableCost], layout: str, cluster: ClusterShape) -> tuple[float, float]:
    """Seconds and bytes between hosts (per host, the busiest link) of one step's synchronisation."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    variables = list(variables)
    g = cluster.devices
    dense = sum(v.num_bytes for v in variables if not v.sparse)
    sparse = [v for v in variables if v.sparse]
    parts: list[tuple[float, float]] = []
    if layout in ("MPI", "HYBRID"):
        parts.append(_ring_allreduce(dense, cluster))  # fused: one collective of every dense gradient
    elif layout == "TF PS":
        parts.append(_servers(dense, g, cluster))
    else:  # PS, per host
        parts.append(_servers(dense, 1, cluster, aggregated_inside=(g - 1) * dense))
    for v in sparse:
        per_device = v.rows_touched * (v.row_bytes + _INDEX_BYTES)
        if layout == "MPI":
            parts.append(_ring_allgather(per_device, cluster))
        elif layout == "TF PS":
            parts.append(_servers(per_device, g, cluster))
        else:  # PS and HYBRID: a host's devices merge their rows, then its first one sends them
            merged = min(g * v.rows_touched, v.rows) * (v.row_bytes + _INDEX_BYTES)
            parts.append(_servers(merged, 1, cluster, aggregated_inside=(g - 1) * per_device))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def predict(variables: Iterable[VariableCost], step_time: float, cluster: ClusterShape,
            layouts: Iterable[str] = LAYOUTS) -> list[Prediction]:
    """One :class:`Prediction` per layout (see the module docstring).

    Raises:
        ValueError: a step time or cluster that is not positive.
    """
    if not step_time > 0:
        raise ValueError(f"the single-device step time must be positive, got {step_time}")
    if cluster.hosts < 1 or cluster.devices < 1:
        raise ValueError(f"a cluster needs at least one host and one device, got {cluster.hosts}x{cluster.devices}")
    variables = list(variables)
    n = cluster.workers
    out = []
    for layout in layouts:
        seconds, between = communication(variables, layout, cluster)
        step = step_time + seconds
        out.append(Prediction(layout, seconds, step, n * step_time / step, step_time / step, between))
    return out


# --------------------------------------------------------------------------- #
# From a plan, and from the command line
# --------------------------------------------------------------------------- #

def variables_of_plan(plan_dict: dict) -> list[VariableCost]:
    """The trained variables of a plan (``Plan.to_dict()``, as ``parallax plan --json`` writes it).
    A plan's density is per worker process; a device's share is that over the worker's replicas."""
    import numpy as np

    workers = plan_dict.get("workers") or [{}]
    replicas = max(1, len(workers[0].get("replica_devices") or ()))
    out = []
    for v in plan_dict["variables"]:
        gradient = v.get("gradient")
        if not gradient:
            continue
        shape = tuple(d or 1 for d in v["shape"])
        itemsize = np.dtype(v["dtype"].replace("_ref", "")).itemsize
        num_bytes = itemsize * math.prod(shape)
        if gradient.get("indices") is None:
            out.append(VariableCost(v["name"], num_bytes))
            continue
        rows = shape[0] if shape else 1
        density = v.get("density")
        touched = (density if density is not None else 0.01) * rows / replicas
        out.append(VariableCost(v["name"], num_bytes, True, rows, num_bytes // max(1, rows), touched))
    return out


def cluster_of_plan(plan_dict: dict) -> tuple[int, int]:
    """``(hosts, devices of the busiest host)`` of a plan's workers (``Plan.to_dict()``).

    >>> cluster_of_plan({"workers": [{"host": "a", "replica_devices": ["g0", "g1"]}, {"host": "b",
    ...                                "replica_devices": ["g0"]}, {"host": "b", "replica_devices": ["g1"]}]})
    (2, 2)
    """
    devices: dict[str, int] = {}
    for worker in plan_dict["workers"]:
        devices[worker["host"]] = devices.get(worker["host"], 0) + max(1, len(worker.get("replica_devices") or ()))
    return len(devices), max(devices.values())


_RATE_UNITS = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "gb": 1e9, "mb": 1e6, "gib": 2**30, "mib": 2**20}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_bandwidth(text: str) -> float:
    """``10Gbit`` / ``100gbit`` / ``12.5GB`` (per second) / ``800MB`` -> bytes per second.

    >>> parse_bandwidth("10Gbit"), parse_bandwidth("1.25GB/s")
    (1250000000.0, 1250000000.0)
    """
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([a-zA-Z]+)(?:/s|ps)?\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise ValueError(f"bandwidth {text!r}: expected a number and one of Gbit, Mbit, GB, MB, GiB, MiB "
                         "(per second), e.g. 10Gbit")
    value = float(m.group(1)) * _RATE_UNITS[unit]
    if value <= 0:
        raise ValueError(f"bandwidth {text!r} must be positive")
    return value


def parse_latency(text: str) -> float:
    """``20us`` / ``0.5ms`` / ``0`` -> seconds.

    >>> parse_latency("1.5ms"), parse_latency("0")
    (0.0015, 0.0)
    """
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = (m.group(2) or "s").lower() if m else ""
    if not m or unit not in _TIME_UNITS:
        raise ValueError(f"latency {text!r}: expected a number and one of s, ms, us, ns, e.g. 20us")
    return float(m.group(1)) * _TIME_UNITS[unit]


def parse_cluster(text: str) -> tuple[int, int]:
    """``6x8`` (hosts x devices per host) -> ``(6, 8)``."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"cluster {text!r}: expected HOSTSxDEVICES, e.g. 6x8 (6 hosts of 8 GPUs)")
    return int(m.group(1)), int(m.group(2))


def format_predictions(predictions: list[Prediction], cluster: ClusterShape, step_time: float) -> str:
    """The table ``parallax plan --predict`` prints."""
    gbit = cluster.between.bandwidth * 8 / 1e9
    lines = [f"Predicted on {cluster.hosts} host(s) x {cluster.devices} device(s), {gbit:g} Gbit/s and "
             f"{cluster.between.latency * 1e6:g} us between hosts, single-device step {step_time * 1e3:g} ms "
             "(communication not overlapped: a bound; see parallax/plan/predict.py):",
             f"  {'layout':<8} {'comm ms':>9} {'step ms':>9} {'speedup':>8} {'efficiency':>10} "
             f"{'MB between hosts':>17}"]
    for p in predictions:
        lines.append(f"  {p.layout:<8} {p.communication_s * 1e3:>9.1f} {p.step_s * 1e3:>9.1f} {p.speedup:>7.1f}x "
                     f"{p.efficiency * 100:>9.0f}% {p.between_hosts_bytes / 1e6:>17.1f}")
    best = min(predictions, key=lambda p: p.step_s)
    lines.append(f"  fastest: {best.layout}")
    return "\n".join(lines)
