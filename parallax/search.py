"""``search_partitions``: find the partition count with the best measured step time.

The seed system relaunched the whole cluster for every trial. Here the job's
processes (or the one process, for a single worker) are started once; each
trial re-runs the training script *inside* them with another
``PARALLAX_NUM_PARTITIONS``:

1. every training process runs the script again (``runpy``) up to its
   ``parallel_run`` call, which builds the graph with the trial's count and
   returns a session that times a few steps and then ends the trial
   (:class:`TrialOver` unwinds the script);
2. the workers agree on the trial's time (the slowest worker's median step
   time); each trial is a later ``parallel_run`` call of the process, so with
   servers the chief clears their state (``Session.reset``) before the next
   one starts (:mod:`parallax.roles`); servers, ports and MPI communicators stay up;
3. counts double from the smallest one ``get_partitioner`` allows while the
   step time improves (at most :data:`MAX_TRIALS` trials);
4. the script runs once more with the best count, for real, and the first
   ``parallel_run`` call ends the process when it is done.

The choice is stored in a cache (``$PARALLAX_CACHE_DIR``, default
``~/.cache/parallax/partitions.json``, on worker 0's host) under a hash of the
graph, the resource file and the run option; the next run with the same ones
skips the search.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from parallax.logs import log as logger
from parallax.partitioner import PARTITIONER_COLLECTION, PARTITIONS_ENV

__all__ = ["TrialOver", "Trial", "TrialSession", "active_trial", "in_final_run", "search", "run_final",
           "cache_key", "cached_count", "store_count", "candidates_from", "min_partitions", "run_script_again",
           "CACHE_ENV", "TRIAL_STEPS_ENV", "MAX_TRIALS", "partition_search", "in_trial"]


CACHE_ENV = "PARALLAX_CACHE_DIR"
TRIAL_STEPS_ENV = "PARALLAX_SEARCH_STEPS"  # "warmup,timed", default "2,5"
MAX_TRIALS = 6


class TrialOver(BaseException):  # noqa: N818 - not an error: it unwinds the user's script after a trial
    """Raised by a trial's session after its timed steps (a BaseException, so the
    script's own ``except Exception`` does not swallow it)."""


@dataclass
class Trial:
    """One trial: its partition count and the step times measured so far."""

    partitions: int
    warmup: int
    steps: int
    times: list[float] = field(default_factory=list)
    session: object = None

    def median(self) -> float | None:
        if not self.times:
            return None
        ordered = sorted(self.times)
        return ordered[len(ordered) // 2]


# Set only while a search runs the script again (reset when that run returns), so a
# parallel_run called outside a search never sees them.
_TRIAL: ContextVar[Trial | None] = ContextVar("parallax_search_trial", default=None)
_FINAL: ContextVar[bool] = ContextVar("parallax_search_final", default=False)


def active_trial() -> Trial | None:
    """The trial this process is running, or ``None``."""
    return _TRIAL.get()


def in_final_run() -> bool:
    """Whether the search is over and the script runs for real, nested."""
    return _FINAL.get()


def trial_steps() -> tuple[int, int]:
    text = os.environ.get(TRIAL_STEPS_ENV, "2,5")
    try:
        warmup, timed = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{TRIAL_STEPS_ENV}={text!r}: expected 'warmup,timed', e.g. '2,5'") from None
    return max(0, warmup), max(1, timed)


def min_partitions(graph) -> int | None:
    """The smallest ``min_num_partitions`` of the graph's ``get_partitioner`` variables,
    or ``None`` when no variable uses it."""
    values = []
    for t in graph.get_collection(PARTITIONER_COLLECTION):
        value = t.op.get_attr("value")
        values.append(int(value.int_val[0]) if value.int_val else 1)
    return min(values) if values else None


def candidates_from(start: int, max_rows: int) -> list[int]:
    """``start``, doubled while it stays within the rows, at most :data:`MAX_TRIALS` counts."""
    out, p = [], max(1, start)
    while len(out) < MAX_TRIALS and p <= max(1, max_rows):
        out.append(p)
        p *= 2
    return out or [max(1, start)]


def cache_key(graph, resource_text: str, run_option: str, sync: bool) -> str:
    """A hash of the graph (as built without a chosen count), the resources and the run option."""
    digest = hashlib.sha256()
    digest.update(graph.as_graph_def().SerializeToString(deterministic=True))
    digest.update(resource_text.encode())
    digest.update(f"{run_option}/{sync}".encode())
    return digest.hexdigest()


def _cache_path() -> str:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "parallax")
    return os.path.join(root, "partitions.json")


def cached_count(key: str) -> int | None:
    try:
        with open(_cache_path(), encoding="utf-8") as f:
            entry = json.load(f).get(key)
    except (OSError, ValueError):
        return None
    return int(entry["partitions"]) if entry else None


def store_count(key: str, partitions: int, step_seconds: dict[int, float], search_seconds: float) -> str:
    """Record the choice; returns the cache file's path."""
    path = _cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[key] = {"partitions": partitions, "step_seconds": {str(k): v for k, v in step_seconds.items()},
                 "search_seconds": round(search_seconds, 3), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def run_script_again() -> None:
    """Run this process's training script again, from the top, as ``__main__``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "mpi4py.__main__"):
        runpy.run_module(spec.name, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")


def search(start: int, max_rows: int, agree, report: bool = True) -> tuple[int, dict[int, float], float]:
    """Run the trials (see the module docstring).

    Args:
        start: the smallest partition count.
        max_rows: the most rows of a partitioned variable (no count above it).
        agree: ``f(seconds or None) -> seconds``: the trial's time agreed by every worker.
        report: log each trial's time (one process of the job does).

    Returns:
        ``(best count, {count: median step seconds}, search seconds)``.
    """
    began = time.monotonic()
    warmup, timed = trial_steps()
    results: dict[int, float] = {}
    best = None
    for p in candidates_from(start, max_rows):
        trial = Trial(p, warmup, timed)
        os.environ[PARTITIONS_ENV] = str(p)
        token = _TRIAL.set(trial)
        try:
            run_script_again()
        except TrialOver:
            pass
        finally:
            _TRIAL.reset(token)
            if trial.session is not None:
                trial.session.close()
        seconds = agree(trial.median())
        if seconds is None:
            raise RuntimeError("search_partitions: the training script ran no timed step in a trial "
                               f"(it needs at least {warmup + timed} steps; set {TRIAL_STEPS_ENV})")
        results[p] = seconds
        if report:
            logger.warning("Parallax: partition search: %d partitions: %.2f ms per step", p, seconds * 1e3)
        if best is not None and seconds > results[best] * 1.05:
            break  # worse than the best so far: more partitions will not help
        if best is None or seconds < results[best]:
            best = p
    return best, results, time.monotonic() - began


def run_final(partitions: int) -> None:
    """Run the script for real with ``partitions`` (nested); the caller then exits."""
    os.environ[PARTITIONS_ENV] = str(partitions)
    token = _FINAL.set(True)
    try:
        run_script_again()
    finally:
        _FINAL.reset(token)


class TrialSession:
    """The session a trial's ``parallel_run`` returns: times each ``run`` call after the
    warm-up and ends the trial (:class:`TrialOver`) after the timed ones."""

    def __init__(self, session, trial: Trial) -> None:
        self._session = session
        self._trial = trial
        self._calls = 0
        trial.session = session

    def run(self, *args, **kwargs):
        start = time.perf_counter()
        result = self._session.run(*args, **kwargs)
        self._calls += 1
        if self._calls > self._trial.warmup:
            self._trial.times.append(time.perf_counter() - start)
        if len(self._trial.times) >= self._trial.steps:
            raise TrialOver()
        return result

    def close(self) -> None:  # the search closes the real session after the trial
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __getattr__(self, name: str):
        return getattr(self._session, name)


def in_trial(result: tuple) -> tuple:
    """``parallel_run``'s result, with the session timing its steps during a trial."""
    trial = active_trial()
    if trial is None:
        return result
    session, *rest = result
    return (TrialSession(session, trial), *rest)


def partition_search(graph, resource_text: str, settings, launched, launching: bool) -> int | None:
    """``search_partitions=True`` in ``parallel_run``: ``None`` when the call should go on as
    usual; otherwise search, train with the best count, and return the exit code the process ends with.

    Args:
        graph: the user's single-device graph.
        resource_text: the resource file's text (part of the cache key).
        settings: the run's :class:`~parallax.settings.Settings`.
        launched: this process's :class:`~parallax.launch.rank.LaunchedProcess`, or ``None``.
        launching: this process is about to launch the job (whose processes search).
    """
    if active_trial() is not None or in_final_run():
        return None  # a nested run of the script, inside the search
    if launched is not None and launched.spec.role == "ps":
        return None  # servers serve every trial
    start = min_partitions(graph)
    if start is None:
        logger.warning("Parallax: search_partitions=True, but no variable is built with "
                       "parallax.get_partitioner(): nothing to search")
        return None
    if os.environ.get(PARTITIONS_ENV):
        logger.warning("Parallax: partition count %s given (%s): no search", os.environ[PARTITIONS_ENV],
                       PARTITIONS_ENV)
        return None
    key = cache_key(graph, resource_text, settings.run_option, settings.sync)
    cached = cached_count(key) if launched is None else None
    if cached is not None:
        logger.warning("Parallax: partition search: using %d partitions found by an earlier search (cache %s)",
                       cached, key[:12])
        os.environ[PARTITIONS_ENV] = str(cached)
        if launching:
            return None  # the launched processes build the graph with it
        run_final(cached)
        return 0
    if launching:
        return None  # the launched processes search
    comm = launched.workers_comm() if launched is not None else None  # servers serve every trial
    rows = max([shape[0] or 1 for shape in _partitioned_shapes(graph)], default=1)

    def agree(seconds: float | None) -> float | None:
        if comm is None:
            return seconds
        values = [v for v in comm.allgather(seconds) if v is not None]
        return max(values) if len(values) == comm.size else None

    # each trial, and the final run, is a later parallel_run call of this process: the chief clears the
    # servers before it starts (parallax.roles)
    best, results, seconds = search(start, rows, agree, report=comm is None or comm.rank == 0)
    if comm is None or comm.rank == 0:
        path = store_count(key, best, results, seconds)
        logger.warning("Parallax: partition search chose %d partitions (%s) in %.1f s; stored in %s", best,
                       ", ".join(f"{p}: {t * 1e3:.2f} ms/step" for p, t in results.items()), seconds, path)
    run_final(best)
    return 0


def _partitioned_shapes(graph) -> list[tuple]:
    """Full shapes of the variables split by a partitioner (their ``save_slice_info``)."""
    import tensorflow as tf

    shapes = []
    for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        info = getattr(v, "_save_slice_info", None)
        if info is not None:
            shapes.append(tuple(info.full_shape))
    return shapes
