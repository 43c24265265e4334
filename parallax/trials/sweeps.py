"""``parallax.sweep``: hyper-parameter sweeps where every trial is a Parallax job.

::

    def train(params, resource_info):
        graph, loss, train_op = build(params["learning_rate"])
        sess, *_ = parallax.parallel_run(graph, resource_info)
        for _ in range(100):
            value, _ = sess.run([loss, train_op], feed_dict=...)
        return float(np.mean(value))          # or a dict of metrics

    report = parallax.sweep(train, {"learning_rate": [0.01, 0.1, 0.5]}, "resource_info",
                            devices_per_trial=2)

Each trial runs ``train`` in a process of its own (``python -m
parallax.trials.child``), on its share of the resource file's devices
(``devices_per_trial`` of them, consecutive; default: all, one trial at a time),
on the trial runner: local processes (the default) or Dask
(:mod:`parallax.trials.runner`). Its ``parallel_run`` launches the job its
devices need, and worker 0's return value is the trial's result.

Methods: ``"grid"`` (every combination of the listed values), ``"random"``
(``trials`` draws; a list is drawn from, a :class:`Uniform` range sampled) and
``"bayes"`` (Optuna's TPE sampler, run on the workers as the seed does: each
trial's process suggests its own parameters from the results known when it
was submitted). Results come back as trials complete; a trial that crashes or
runs past ``time_limit`` is reported with its log and the others go on.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallax.resources.files import parse_resource_file
from parallax.trials.execute import TrialResult, TrialSpec
from parallax.trials.report import Progress, bar_plot, write_rows
from parallax.trials.runner import make_runner

__all__ = ["sweep", "Uniform", "SweepReport", "METHODS", "device_slots", "grid_points", "random_points",
           "optuna_distribution"]

METHODS = ("grid", "random", "bayes")


@dataclass(frozen=True)
class Uniform:
    """A range to sample (random, bayes): floats in ``[low, high]`` (``log``: uniform in the log),
    integers with ``integer=True``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ValueError(f"Uniform({self.low}, {self.high}): expected low < high (and low > 0 with log=True)")

    def sample(self, rng) -> float | int:
        if self.integer:
            return int(rng.integers(int(self.low), int(self.high) + 1))
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


def _check_space(space: dict[str, Any], method: str) -> None:
    if not isinstance(space, dict) or not space:
        raise ValueError("sweep: space must be a non-empty dict of parameter name -> list of values or Uniform")
    for name, values in space.items():
        if isinstance(values, Uniform):
            if method == "grid":
                raise ValueError(f"sweep: space[{name!r}] is a range (Uniform); a grid needs a list of values")
        elif not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"sweep: space[{name!r}] must be a non-empty list of values or a parallax.Uniform, "
                             f"got {values!r}")


def _check_picklable(train_fn: Any, space: dict[str, Any]) -> None:
    """Each trial runs ``train_fn`` in a process of its own, which gets it (and the space) pickled: refuse
    what cannot be, before anything starts.

    Raises:
        TypeError: ``train_fn`` is not callable, or it (or a value of ``space``) cannot be pickled.
    """
    import cloudpickle

    if not callable(train_fn):
        raise TypeError(f"sweep: train_fn must be a function (params, resource_info) -> metric, got "
                        f"{type(train_fn).__name__}")
    name = getattr(train_fn, "__qualname__", None) or repr(train_fn)
    try:
        cloudpickle.dumps(train_fn)
    except Exception as e:  # cloudpickle raises what the object's reduction raises (TypeError, PicklingError, ...)
        raise TypeError(
            f"sweep: train_fn {name!r} cannot be pickled ({type(e).__name__}: {e}). Each trial runs train_fn in a "
            "process of its own (on this machine or a Dask worker), which gets it pickled with what it refers to; "
            "a function of the script you run is pickled by value, with the globals it uses. Create what cannot "
            "be pickled (locks, threads, sessions, open files, connections) inside train_fn, or define train_fn "
            "at module level in a module the trials can import (it is then pickled by name)") from e
    for key, values in space.items():
        try:
            cloudpickle.dumps(values)
        except Exception as e:
            raise TypeError(f"sweep: space[{key!r}] cannot be pickled ({type(e).__name__}: {e}); each trial gets "
                            "the space pickled: use plain values (numbers, strings, lists) or parallax.Uniform"
                            ) from e


def grid_points(space: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the listed values, in order.

    >>> grid_points({"lr": [0.1, 0.5], "batch": [8]})
    [{'lr': 0.1, 'batch': 8}, {'lr': 0.5, 'batch': 8}]
    """
    names = list(space)
    return [dict(zip(names, combo)) for combo in itertools.product(*(space[n] for n in names))]


def random_points(space: dict[str, Any], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` draws: a value of each list, a sample of each range."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        point = {}
        for name, values in space.items():
            point[name] = values.sample(rng) if isinstance(values, Uniform) else values[int(rng.integers(len(values)))]
        out.append(point)
    return out


def optuna_distribution(name: str, values: Any):
    """The Optuna distribution of one parameter of the space."""
    import optuna

    if isinstance(values, Uniform):
        if values.integer:
            return optuna.distributions.IntDistribution(int(values.low), int(values.high), log=values.log)
        return optuna.distributions.FloatDistribution(values.low, values.high, log=values.log)
    return optuna.distributions.CategoricalDistribution(list(values))


def device_slots(resource_info: str, per_trial: int | None) -> list[tuple[str, tuple[str, ...]]]:
    """The resource file's devices in groups of ``per_trial`` (consecutive, in file order): each group's
    resource text and devices (``host/device``). ``None``: one group, the whole file.

    Raises:
        ValueError: ``per_trial`` does not divide the devices, or the file gives hosts without devices.
    """
    cluster = parse_resource_file(resource_info)
    if per_trial is None:
        return [(cluster.text, cluster.device_keys())]
    if cluster.explicit_roles or any(not w.devices for w in cluster.workers):
        raise ValueError(f"sweep: devices_per_trial needs a resource file that lists each host's devices "
                         f"({cluster.source}); or leave it None to give every trial the whole file")
    flat = [(w.host, d) for w in cluster.workers for d in w.devices]
    if per_trial < 1 or len(flat) % per_trial:
        raise ValueError(f"sweep: devices_per_trial={per_trial} does not divide the {len(flat)} devices of "
                         f"{cluster.source}")
    slots = []
    for i in range(0, len(flat), per_trial):
        group = flat[i:i + per_trial]
        hosts: dict[str, list[str]] = {}
        for host, d in group:
            hosts.setdefault(host, []).append(str(d))
        text = "".join(f"{h}: {','.join(ds)}\n" for h, ds in hosts.items())
        slots.append((text, tuple(f"{h}/{d}" for h, d in group)))
    return slots


@dataclass
class SweepReport:
    """Every trial's parameters and result (in the order they completed), and the best."""

    metric: str
    minimize: bool
    results: list[TrialResult]
    seconds: float
    directory: str
    plot: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def value_of(self, r: TrialResult) -> float | None:
        if not r.ok or not isinstance(r.value, dict):
            return None
        found = r.value.get("value", {}).get(self.metric)
        return None if found is None else float(found)

    @property
    def completed(self) -> list[TrialResult]:
        return [r for r in self.results if self.value_of(r) is not None]

    @property
    def best(self) -> TrialResult | None:
        done = self.completed
        if not done:
            return None
        return (min if self.minimize else max)(done, key=self.value_of)

    @property
    def best_params(self) -> dict[str, Any] | None:
        return dict(self.best.value["params"]) if self.best else None

    def table(self) -> str:
        best = self.best
        lines = [f"  {'trial':<10} {'status':<8} {self.metric:>12} {'seconds':>8}  params"]
        for r in self.results:
            params = r.value["params"] if r.ok and isinstance(r.value, dict) else r.params
            value = self.value_of(r)
            shown = f"{value:12.6g}" if value is not None else f"{'-':>12}"
            lines.append(f"{'* ' if r is best else '  '}{r.name:<10} {r.status:<8} {shown} {r.seconds:8.1f}  "
                         f"{_params_text(params)}")
        for r in self.results:
            if not r.ok:
                lines.append(f"  {r.describe()}")
        return "\n".join(lines)


def _params_text(params: Any) -> str:
    if not params:
        return "(suggested on the worker)"
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def sweep(train_fn: Callable[[dict, str], Any], space: dict[str, Any], resource_info: str, *,
          method: str = "grid", trials: int | None = None, metric: str = "value", mode: str = "min",
          devices_per_trial: int | None = None, backend: str = "local", scheduler: str | None = None,
          time_limit: float | None = 600.0, seed: int = 0, output: str | None = None,
          progress: bool = True) -> SweepReport:
    """Run ``train_fn(params, resource_info)`` once per point of ``space``, each a Parallax job.

    Args:
        train_fn: builds a graph, calls ``parallax.parallel_run(graph, resource_info, ...)``, trains, and
            returns a number (the metric ``"value"``) or a dict of metrics. It must be importable or
            picklable by cloudpickle (a function of the calling script is).
        space: parameter name -> list of values (grid, random, bayes) or :class:`Uniform` (random, bayes).
        resource_info: the resource file whose devices the trials share.
        method: ``"grid"``, ``"random"`` or ``"bayes"`` (needs ``optuna``).
        trials: how many (random, bayes; required there); a grid runs every point.
        metric: the metric to rank by (a key of the dict ``train_fn`` returns).
        mode: ``"min"`` or ``"max"``.
        devices_per_trial: devices each trial gets (consecutive in the file); trials on different devices
            run at once. ``None``: every trial gets the whole file.
        backend: ``"local"`` (processes) or ``"dask"``.
        scheduler: a Dask scheduler's address (``None``: an embedded LocalCluster).
        time_limit: seconds a trial may run.
        seed: for random draws and the Bayesian sampler.
        output: where trial logs, results (JSON, CSV) and the plot go (default ``./parallax_sweep``).
        progress: a live progress line.

    Raises:
        ValueError: a bad space, method, mode, count or device split.
        TypeError: ``train_fn`` is not a function, or it (or the space) cannot be pickled.
    """
    if method not in METHODS:
        raise ValueError(f"sweep: method {method!r}: expected one of {', '.join(METHODS)}")
    if mode not in ("min", "max"):
        raise ValueError(f"sweep: mode {mode!r}: expected 'min' or 'max'")
    _check_space(space, method)
    if method != "grid" and (not isinstance(trials, int) or trials < 1):
        raise ValueError(f"sweep: method={method!r} needs trials >= 1, got {trials!r}")
    if method == "bayes":
        import optuna  # noqa: F401 - a clear ImportError now, not in every trial
    import cloudpickle

    _check_picklable(train_fn, space)
    began = time.monotonic()
    directory = os.path.abspath(output or "parallax_sweep")
    os.makedirs(directory, exist_ok=True)
    slots = device_slots(resource_info, devices_per_trial)
    for i, (text, _) in enumerate(slots):
        with open(os.path.join(directory, f"resources-{i}"), "w", encoding="utf-8") as f:
            f.write(text)
    points: list[dict | None] = grid_points(space) if method == "grid" else \
        random_points(space, trials, seed) if method == "random" else [None] * trials
    minimize = mode == "min"
    history: list[dict[str, Any]] = []
    results: list[TrialResult] = []
    total_devices = sum(len(d) for _, d in slots)  # the embedded Dask worker owns them all
    bar = Progress("parallax sweep", len(points), progress)
    report = SweepReport(metric, minimize, results, 0.0, directory)

    def spec(index: int, params: dict | None, slot: int) -> TrialSpec:
        name = f"trial-{index + 1:03d}"
        trial_dir = os.path.join(directory, name)
        os.makedirs(trial_dir, exist_ok=True)
        payload = {"fn": train_fn, "params": params, "resource_info": os.path.join(directory, f"resources-{slot}"),
                   "suggest": {"space": space, "history": list(history), "seed": seed + index, "minimize": minimize}}
        path = os.path.join(trial_dir, "payload.pkl")
        with open(path, "wb") as f:
            cloudpickle.dump(payload, f)
        return TrialSpec(name, (sys.executable, "-m", "parallax.trials.child", path), trial_dir, env, time_limit,
                         slots[slot][1], dict(params or {}))

    # the trial imports what this process can (train_fn's module, pickled by reference when importable)
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(
        [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *(p for p in sys.path if p and os.path.isdir(p))]))
        .strip(os.pathsep)}

    with make_runner(backend, scheduler, devices=total_devices, max_parallel=len(slots)) as runner:
        submitted: dict[Any, tuple[TrialSpec, int]] = {}
        pending = list(enumerate(points))
        # bayes: at most one trial per slot in flight, so each suggestion sees the results before it
        window = len(slots) if method == "bayes" else len(points)
        while pending or submitted:
            while pending and len(submitted) < window:
                index, params = pending.pop(0)
                busy = [slot for _, slot in submitted.values()]
                slot = min(range(len(slots)), key=lambda i: (busy.count(i), i))  # the least busy device group
                s = spec(index, params, slot)
                submitted[runner.submit(s)] = (s, slot)
            future = next(iter(runner.wait_any(set(submitted))))
            s, _ = submitted.pop(future)
            result = runner.result_of(s, future)
            results.append(result)
            value = report.value_of(result)
            if value is not None:
                history.append({"params": result.value["params"], "value": value})
            best = report.best
            bar.done(s.name, f"{metric}={value:.6g}" if value is not None else result.status,
                     f"{metric}={report.value_of(best):.6g}" if best else "none")
    bar.close()
    report.seconds = time.monotonic() - began
    report.rows = [{"trial": r.name, "status": r.status, metric: report.value_of(r), "seconds": round(r.seconds, 2),
                    **{f"param.{k}": v for k, v in ((r.value or {}).get("params") or r.params or {}).items()},
                    "error": r.error, "log": r.log} for r in results]
    write_rows(directory, report.rows, {"metric": metric, "mode": mode, "method": method, "backend": backend,
                                        "best": report.best_params, "seconds": report.seconds})
    done = report.completed
    if done:
        report.plot = bar_plot(os.path.join(directory, "sweep.png"), [f"{r.name} {_params_text(r.value['params'])}"
                                                                      for r in done],
                               [report.value_of(r) for r in done], done.index(report.best),
                               f"{metric} ({'lower' if minimize else 'higher'} is better)",
                               f"parallax sweep ({method}, {backend}): {metric} per trial")
    return report
