"""Predicted speed of a model's training on a cluster, per run option (``parallax plan --predict``).

Inputs: the model's variables (shapes, dtypes, which gradients are sparse and
how many rows a device's gradient touches per step, as the plan says), a
measured single-device step time ``T``, and a cluster of ``H`` hosts with
``G`` devices each (``N = H * G`` devices, one replica each), joined by a
link between hosts and one inside a host, each a bandwidth per direction and
a latency.

The bytes of one step are those of :mod:`parallax.plan.traffic` (checked
against measured bytes on two virtual hosts within 0.2-6 %,
``benchmarks/scale.py``): hierarchical collectives (a host's first device
speaks for it), a parameter server on every host holding ``1/H`` of each
variable, sparse rows merged by index before they reach a server and read
once per distinct row. Each host sends its share, ``1/H`` of what crosses
between hosts, over its link between hosts, and each device its share, ``1/N``
of what stays inside hosts, over its link inside the host. For a dense variable of ``B`` bytes, and a sparse one
whose gradient touches ``k`` rows of ``r`` bytes per device and step
(``s = k (r + 8)`` with the indices), a host's link to the others carries per
step about:

==============  ===============================  =====================================
layout          dense                            sparse
==============  ===============================  =====================================
all-reduce      ``2 (H-1)/H * B``                all-gather: ``(H-1)/H * N * s``
TF PS           ``2 G (H-1)/H * B``              ``2 G (H-1)/H * s``
PS, HYBRID      ``2 (H-1)/H * B`` (PS)           ``2 (H-1)/H * min(G k, rows) (r + 8)``
==============  ===============================  =====================================

Each collective also costs its rounds of latency: ``2 (N-1)`` for the
all-reduce, ``N-1`` for an all-gather, 2 for a push and a pull.

The layouts: **MPI** (and Horovod) all-reduces dense gradients and
all-gathers sparse ones; **PS** is Parallax's parameter servers (per host:
``PSConfig.local_aggregation``); **HYBRID** all-reduces dense gradients and
sends sparse ones to the servers per host; **TF PS** is TensorFlow's own
(``replica_device_setter``: every device pushes and pulls). A step takes
``T + communication`` (no overlap: a bound), so the cluster processes
``N / step`` device batches a second, a speedup of ``N T / step`` over one
device and a scaling efficiency of ``T / step``.

Bytes alone are a bound. What a step spends besides them is the processes'
own work, :class:`HostCosts`, per layout: a ``fixed`` cost per step of
synchronising at all (the session, the in-graph calls, waiting for the last
device), a ``row_rate`` at which the busiest process takes in sparse rows from
other hosts (all-gathered rows at every worker; pushed rows at a server:
copies through host memory, summing, applying), and a ``transfer`` cost per
push or read a parameter server serves (they queue there). The drivers,
:class:`HostLoad`, per step:

==============  =========================================  ================================
layout          rows taken in from other hosts             transfers a server serves
==============  =========================================  ================================
all-reduce      ``(N-G) k (r+8)`` per sparse variable       none
TF PS           ``(N-G)/H k (r+8)``                         ``2 N`` (every device)
PS, HYBRID      ``(H-1)/H min(G k, rows) (r+8)``            ``2 H`` (a process per host)
==============  =========================================  ================================

And a synchronous step waits for its slowest device: with ``spread`` the
standard deviation of one device's step time, ``spread * E[max of N standard
normals]`` (:func:`waiting`; 0.56 for 2 devices, 1.27 for 6, 2.23 for 48).

The costs are the host's and the implementation's, not the model's: measure
them (:func:`fit_costs` fits them to steps measured on a small cluster, as
``parallax plan --predict --measured`` does) and the prediction becomes a
forecast for larger ones; without them (all zero) it is a bound.
docs/benchmarks.md calibrates them on the Parallax paper's one- and
two-machine figures and sets the forecast for four and eight machines beside
the published ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from parallax.plan.traffic import Payload, Traffic, variable_traffic
from parallax.plan.vocabulary import Sync

__all__ = ["Link", "ClusterShape", "VariableCost", "HostCosts", "HostLoad", "Prediction", "LAYOUTS", "predict",
           "communication", "host_load", "fit_costs", "waiting", "expected_max", "parse_bandwidth", "parse_latency",
           "parse_cluster", "variables_of_plan", "cluster_of_plan", "format_predictions", "format_costs",
           "parse_measured"]

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
class HostLoad:
    """What the busiest process of a layout handles per step besides bytes over links: bytes of
    sparse rows it takes in from other hosts, and the pushes and reads a server serves."""

    rows_in: float = 0.0
    transfers: int = 0


@dataclass(frozen=True)
class HostCosts:
    """A layout's own costs on a host (module docstring): seconds per step of synchronising at
    all (negative: communication overlapped with computing), bytes per second of sparse rows
    taken in from other hosts, seconds per transfer a parameter server serves. All zero (the
    default): the prediction is a bound."""

    fixed: float = 0.0
    row_rate: float = math.inf
    transfer: float = 0.0

    def seconds(self, load: HostLoad) -> float:
        return self.fixed + load.rows_in / self.row_rate + load.transfers * self.transfer


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step: seconds communicating, seconds of the processes' own work
    (:class:`HostCosts`) and of waiting for the slowest device, the whole step, the speedup over
    one device, the scaling efficiency, the bytes over a host's link to the others per step, and
    whether it is a forecast (the layout's :class:`HostCosts` given) or a bound."""

    layout: str
    communication_s: float
    step_s: float
    speedup: float
    efficiency: float
    between_hosts_bytes: float
    host_s: float = 0.0
    forecast: bool = False  # with the layout's measured HostCosts; else a bound


def _workers(layout: str, cluster: ClusterShape) -> tuple[list[str], int]:
    """The host of each worker process of ``layout``, and the devices each one trains: Parallax's PS
    runs a process per host with a replica per device, the others a process per device."""
    names = [f"host{i}" for i in range(cluster.hosts)]
    if layout == "PS":
        return names, cluster.devices
    return [h for h in names for _ in range(cluster.devices)], 1


def _sync(layout: str, v: VariableCost) -> Sync:
    if layout == "MPI":
        return Sync.ALLGATHER if v.sparse else Sync.ALLREDUCE
    if layout == "HYBRID":
        return Sync.PS if v.sparse else Sync.ALLREDUCE
    return Sync.PS


def communication(variables: Iterable[VariableCost], layout: str, cluster: ClusterShape) -> tuple[float, float]:
    """Seconds and bytes over a host's link to the others of one step's synchronisation.

    The bytes are :mod:`parallax.plan.traffic`'s (hierarchical collectives, a server on each
    host, rows merged by index before they go to a server; TF PS merges nothing): each host
    sends ``1/H`` of what crosses between hosts over its link, each device ``1/N`` of what
    stays inside hosts over its link inside. Rounds of latency: ``2 (N-1)`` for the all-reduce of
    every dense gradient, ``N-1`` per all-gather, 2 (push, pull) for the dense variables on
    servers and per sparse one.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    n, h, g = cluster.workers, cluster.hosts, cluster.devices
    if n < 2:
        return 0.0, 0.0
    variables = list(variables)
    hosts, replicas = _workers(layout, cluster)
    total, rounds = Traffic(), 0
    for sync in (Sync.ALLREDUCE, Sync.PS):  # the dense gradients: one collective, one push and pull
        dense = sum(v.num_bytes for v in variables if not v.sparse and _sync(layout, v) == sync)
        if dense:
            total = total + variable_traffic(Payload(dense), sync, hosts)
            rounds += 2 * (n - 1) if sync is Sync.ALLREDUCE else 2
    for v in variables:
        if not v.sparse:
            continue
        p = Payload(v.num_bytes, True, v.rows, v.row_bytes, _INDEX_BYTES, v.rows_touched * replicas)
        sync = _sync(layout, v)
        total = total + variable_traffic(p, sync, hosts, merged=layout != "TF PS",
                                         host_aggregation=layout == "HYBRID" and h > 1 and g > 1)
        rounds += n - 1 if sync is Sync.ALLGATHER else 2
    if replicas > 1:  # a PS worker first sums its replicas' gradients, inside its host
        per_device = sum(v.rows_touched * (v.row_bytes + _INDEX_BYTES) if v.sparse else v.num_bytes
                         for v in variables)
        total = total + Traffic(inside=h * (replicas - 1) * per_device)
    between = total.crossing / h
    latency = (cluster.between if h > 1 else cluster.inside).latency
    seconds = between / cluster.between.bandwidth + total.inside / n / cluster.inside.bandwidth + rounds * latency
    return seconds, between


@cache
def expected_max(n: int) -> float:
    """The expected largest of ``n`` independent standard normal variables (0 for one).

    >>> round(expected_max(2), 4), round(expected_max(48), 3)
    (0.5642, 2.233)
    """
    if n < 2:
        return 0.0
    step = 1e-3  # E[max] = integral of x n phi(x) Phi(x)^(n-1) dx (18,001 points: cached per n)
    total = 0.0
    for i in range(-9000, 9001):
        x = i * step
        density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * n * density * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1)
    return total * step


def waiting(cluster: ClusterShape, spread: float) -> float:
    """Seconds a synchronous step waits for its slowest device: ``spread`` (the standard deviation
    of one device's step time) times the expected largest of ``N`` standard normals."""
    return spread * expected_max(cluster.workers) if spread > 0 else 0.0


def host_load(variables: Iterable[VariableCost], layout: str, cluster: ClusterShape) -> HostLoad:
    """The :class:`HostLoad` of the busiest process of ``layout`` (module docstring); nothing on one device."""
    n, h, g = cluster.workers, cluster.hosts, cluster.devices
    if n < 2:
        return HostLoad()
    rows_in = 0.0
    for v in variables:
        if not v.sparse:
            continue
        each = v.row_bytes + _INDEX_BYTES
        if _sync(layout, v) is Sync.ALLGATHER:  # every worker takes in every other host's rows
            rows_in += (n - g) * min(v.rows, v.rows_touched) * each
        elif layout == "TF PS":  # a server's share of every other host's device's rows, none merged
            rows_in += (n - g) / h * v.rows_touched * each
        else:  # a server's share of every other host's rows, merged there
            rows_in += (h - 1) / h * min(v.rows, g * v.rows_touched) * each
    servers = layout in ("PS", "TF PS") or (layout == "HYBRID" and any(v.sparse for v in variables))
    transfers = 0 if not servers else 2 * (n if layout == "TF PS" else h)
    return HostLoad(rows_in, transfers)


def predict(variables: Iterable[VariableCost], step_time: float, cluster: ClusterShape,
            layouts: Iterable[str] = LAYOUTS, costs: Mapping[str, HostCosts] | None = None,
            spread: float = 0.0) -> list[Prediction]:
    """One :class:`Prediction` per layout (see the module docstring); ``costs``: each layout's
    :class:`HostCosts` (a layout not in it: none, a bound); ``spread``: the standard deviation of
    one device's step time, for :func:`waiting` (in ``host_s``).

    Raises:
        ValueError: a step time or cluster that is not positive.
    """
    if not step_time > 0:
        raise ValueError(f"the single-device step time must be positive, got {step_time}")
    if cluster.hosts < 1 or cluster.devices < 1:
        raise ValueError(f"a cluster needs at least one host and one device, got {cluster.hosts}x{cluster.devices}")
    variables = list(variables)
    costs = costs or {}
    n = cluster.workers
    out = []
    for layout in layouts:
        seconds, between = communication(variables, layout, cluster)
        own = costs[layout].seconds(host_load(variables, layout, cluster)) if layout in costs and n > 1 else 0.0
        own += waiting(cluster, spread)
        step = max(step_time, step_time + seconds + own)  # overlap (fixed < 0) hides at most the communication
        out.append(Prediction(layout, seconds, step, n * step_time / step, step_time / step, between, own,
                              layout in costs))
    return out


def fit_costs(variables: Iterable[VariableCost], step_time: float, measured: Mapping[ClusterShape, float],
              layout: str, spread: float = 0.0) -> HostCosts:
    """The :class:`HostCosts` of ``layout`` that best explain steps measured on small clusters
    (``measured``: seconds per step on each cluster of several devices), by least squares of
    what each step spends besides ``step_time``, the predicted communication and the waiting for
    the slowest device (:func:`waiting`, from ``spread``): ``fixed`` and one rate, the one that
    grows with the cluster for this layout (``row_rate`` where sparse rows are all-gathered,
    ``transfer`` where there are servers). One cluster, or no growth between them: ``fixed``
    alone. The rate is never negative; ``fixed`` is negative when the layout overlaps
    communication with computing (:func:`predict` never makes a step shorter than ``step_time``).

    Raises:
        ValueError: no cluster of more than one device, or a step that is not positive.
    """
    import numpy as np

    variables = list(variables)
    points = [(c, t) for c, t in measured.items() if c.workers > 1]
    if not points:
        raise ValueError(f"{layout}: fitting its costs needs a step measured on more than one device")
    for c, t in points:
        if not t > 0:
            raise ValueError(f"{layout}: the step measured on {c.hosts}x{c.devices} must be positive, got {t}")
    loads = [host_load(variables, layout, c) for c, _ in points]
    by_rows = not any(load.transfers for load in loads)
    drive = np.array([load.rows_in if by_rows else load.transfers for load in loads], dtype=float)
    extra = np.array([t - step_time - communication(variables, layout, c)[0] - waiting(c, spread) for c, t in points])
    fixed, slope = float(np.mean(extra)), 0.0
    if np.ptp(drive) > 0:
        (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(drive), drive], axis=1), extra, rcond=None)
        if b > 0:  # a cost that falls as the cluster grows is noise: fixed alone
            fixed, slope = float(a), float(b)
    if by_rows:
        return HostCosts(fixed, 1.0 / slope if slope > 0 else math.inf)
    return HostCosts(fixed, transfer=float(slope))


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


def parse_measured(text: str, source: str) -> dict[str, dict[tuple[int, int], float]]:
    """Steps measured on small clusters, per layout, from YAML (``parallax plan --predict --measured``)::

        MPI: {1x2: 2.1ms, 2x2: 3.4ms}     # layout: {HOSTSxDEVICES: seconds per step}
        PS:
          2x2: 0.0061

    Raises:
        ValueError: naming ``source``, the entry and what was expected.
    """
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: not YAML: {e}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{source}: expected a mapping of layouts ({', '.join(LAYOUTS)}) to "
                         "{HOSTSxDEVICES: step}, e.g. 'MPI: {1x2: 2.1ms, 2x2: 3.4ms}'")
    out: dict[str, dict[tuple[int, int], float]] = {}
    for layout, steps in data.items():
        if layout not in LAYOUTS:
            raise ValueError(f"{source}: unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
        if not isinstance(steps, dict) or not steps:
            raise ValueError(f"{source}: {layout}: expected {{HOSTSxDEVICES: step}}, e.g. {{1x2: 2.1ms}}")
        out[layout] = {}
        for shape, step in steps.items():
            where = f"{source}: {layout}: {shape}"
            try:
                cluster = parse_cluster(str(shape))
                seconds = float(step) if isinstance(step, (int, float)) else parse_latency(str(step))
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if not seconds > 0 or cluster[0] * cluster[1] < 2:
                raise ValueError(f"{where}: expected a positive step on more than one device, got {step!r}")
            out[layout][cluster] = seconds
    return out


def format_costs(costs: Mapping[str, HostCosts]) -> str:
    """One line per layout's :class:`HostCosts`, as ``parallax plan --predict --measured`` prints them."""
    lines = []
    for layout, c in costs.items():
        rate = "none" if math.isinf(c.row_rate) else f"{c.row_rate / 1e9:.3g} GB/s"
        lines.append(f"  {layout:<8} fixed {c.fixed * 1e3:.3g} ms per step, rows from other hosts {rate}, "
                     f"{c.transfer * 1e3:.3g} ms per server transfer")
    return "\n".join(lines)


def format_predictions(predictions: list[Prediction], cluster: ClusterShape, step_time: float) -> str:
    """The table ``parallax plan --predict`` prints."""
    gbit = cluster.between.bandwidth * 8 / 1e9
    forecasts = [p for p in predictions if p.forecast]
    kind = ("forecasts: each measured layout's host costs; the others bytes only, a bound" if forecasts else
            "bytes only, communication not overlapped: a bound; --measured makes it a forecast")
    lines = [f"Predicted on {cluster.hosts} host(s) x {cluster.devices} device(s), {gbit:g} Gbit/s and "
             f"{cluster.between.latency * 1e6:g} us between hosts, single-device step {step_time * 1e3:g} ms "
             f"({kind}; see parallax/plan/predict.py):",
             f"  {'layout':<8} {'comm ms':>9} {'host ms':>9} {'step ms':>9} {'speedup':>8} {'efficiency':>10} "
             f"{'MB between hosts':>17}  kind"]
    for p in predictions:
        lines.append(f"  {p.layout:<8} {p.communication_s * 1e3:>9.1f} {p.host_s * 1e3:>9.1f} {p.step_s * 1e3:>9.1f} "
                     f"{p.speedup:>7.1f}x {p.efficiency * 100:>9.0f}% {p.between_hosts_bytes / 1e6:>17.1f}  "
                     f"{'forecast' if p.forecast else 'bound'}")
    best = min(forecasts or predictions, key=lambda p: p.step_s)
    lines.append(f"  fastest: {best.layout}" + (" (of the forecasts)" if forecasts else ""))
    return "\n".join(lines)
