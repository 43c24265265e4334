"""``search_partitions``: find the partition count with the best measured step time.

The seed system relaunched the whole cluster for every trial; so does this,
through the trial runner (:mod:`parallax.trials`), from the process the user
started, before anything trains:

1. each trial runs the training script again as a job of its own (its
   launcher, ``mpirun`` and ranks, or one process), with another
   ``PARALLAX_NUM_PARTITIONS``; its ``parallel_run`` times a few steps, the
   workers agree on the slowest worker's median, and the job ends
   (:mod:`parallax.trials.mode`). Its output goes to the trial's log;
2. counts double from the smallest one ``get_partitioner`` allows while the
   step time improves (at most :data:`MAX_TRIALS` trials); a trial that fails
   is reported with its log and skipped;
3. the script runs once more with the best count, for real, in a process of its
   own (``PARALLAX_RERUN=1``; this process waits for it and exits with its code):
   its ``parallel_run`` launches the job or trains there.

The trials run on local processes, or on Dask with ``PARALLAX_TRIAL_BACKEND=dask``
(and ``PARALLAX_DASK_SCHEDULER=tcp://...`` for a running scheduler). The choice
is stored in a cache (``$PARALLAX_CACHE_DIR``, default
``~/.cache/parallax/partitions.json``) under a hash of the graph, the resource
file and the run option; the next run with the same ones skips the search.
What the environment says of the search comes in with the invocation
``parallel_run`` read (its :class:`~parallax.invocation.SearchRequest`, its cache
root); nothing here reads the environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

from parallax.invocation import PARTITIONS_ENV, SEARCH_STEPS_ENV, Invocation, SearchRequest, env_with
from parallax.logs import log as logger
from parallax.partitioner import PARTITIONER_COLLECTION

__all__ = ["in_final_run", "search", "run_final", "cache_key", "cached_count", "store_count", "candidates_from",
           "min_partitions", "MAX_TRIALS", "partition_search", "cache_path", "trial_runner", "partitioned_shapes",
           "store_entry", "partition_counts"]


MAX_TRIALS = 6

def in_final_run(invocation: Invocation) -> bool:
    """Whether this process (its ``invocation``) is the script run again, with the partition count its starter
    chose (a tuned one, or a search's winner)."""
    return invocation.search.rerun


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


def partition_counts(graph) -> list[int] | None:
    """The counts to try for the graph's ``get_partitioner`` variables (:func:`candidates_from` their
    smallest minimum, within their rows), or ``None`` when it has none."""
    start = min_partitions(graph)
    if start is None:
        return None
    return candidates_from(start, max([shape[0] or 1 for shape in partitioned_shapes(graph)], default=1))


def cache_key(graph, resource_text: str, run_option: str, sync: bool) -> str:
    """A hash of the graph (as built without a chosen count), the resources and the run option."""
    digest = hashlib.sha256()
    digest.update(graph.as_graph_def().SerializeToString(deterministic=True))
    digest.update(resource_text.encode())
    digest.update(f"{run_option}/{sync}".encode())
    return digest.hexdigest()


def cache_path(name: str, root: str) -> str:
    """A file of the cache directory ``root`` (``$PARALLAX_CACHE_DIR``, default ``~/.cache/parallax``:
    :meth:`~parallax.invocation.Invocation.cache_root`)."""
    return os.path.join(root, name)


def cached_count(key: str, root: str) -> int | None:
    """The partition count a search stored for ``key`` in the cache ``root``, or ``None``."""
    try:
        with open(cache_path("partitions.json", root), encoding="utf-8") as f:
            entry = json.load(f).get(key)
    except (OSError, ValueError):
        return None
    return int(entry["partitions"]) if entry else None


def store_entry(name: str, key: str, entry: dict, root: str) -> str:
    """Record ``entry`` under ``key`` in the cache file ``name`` of the cache ``root``; returns the file's path."""
    path = cache_path(name, root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[key] = {**entry, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def store_count(key: str, partitions: int, step_seconds: dict[int, float], search_seconds: float, root: str) -> str:
    """Record the choice in the cache ``root``; returns the cache file's path."""
    return store_entry("partitions.json", key, {
        "partitions": partitions, "step_seconds": {str(k): v for k, v in step_seconds.items()},
        "search_seconds": round(search_seconds, 3)}, root)


def trial_runner(request: SearchRequest, devices: int = 1):
    """The trial runner ``request`` names (``PARALLAX_TRIAL_BACKEND`` and ``PARALLAX_DASK_SCHEDULER``; local
    processes by default)."""
    from parallax.trials.runner import make_runner

    return make_runner(request.backend, request.scheduler, devices=devices, max_parallel=1)


def search(counts: list[int], trial, report: bool = True) -> tuple[int, dict[int, float], float]:
    """Run the trials (see the module docstring).

    Args:
        counts: the partition counts, smallest first (:func:`partition_counts`).
        trial: ``f(count) -> TrialResult``: one trial job with that count.
        report: log each trial's time.

    Returns:
        ``(best count, {count: median step seconds}, search seconds)``.

    Raises:
        RuntimeError: no trial measured a step (each failure's log is named).
    """
    began = time.monotonic()
    results: dict[int, float] = {}
    failures = []
    best = None
    for p in counts:
        outcome = trial(p)
        if not outcome.ok:
            failures.append(outcome)
            logger.warning("Parallax: partition search: the trial of %d partitions %s", p, outcome.describe())
            continue
        seconds = float(outcome.value["step_seconds"])
        results[p] = seconds
        if report:
            logger.warning("Parallax: partition search: %d partitions: %.2f ms per step", p, seconds * 1e3)
        if best is not None and seconds > results[best] * 1.05:
            break  # worse than the best so far: more partitions will not help
        if best is None or seconds < results[best]:
            best = p
    if best is None:
        tails = "\n".join(f"--- {f.name} ({f.log}):\n{f.tail}" for f in failures[-1:])
        raise RuntimeError(f"search_partitions: no trial measured a step ({len(failures)} failed; the script needs "
                           f"at least warm-up + timed steps, {SEARCH_STEPS_ENV}).\n{tails}")
    return best, results, time.monotonic() - began


def run_final(partitions: int, tuned: dict | None = None) -> int:
    """Train with ``partitions``: the script started again, in a process of its own (its graph is built
    with that count, which the process the user started cannot do to its own), as it was started, with
    this process's output and environment, and ``tuned``, the tuned choice it applies (``None``: none);
    its exit code."""
    import subprocess

    from parallax.launch.launcher import current_program

    env = env_with(partitions=partitions, rerun=True, tuned=tuned)
    try:
        return subprocess.run([sys.executable, *current_program()], env=env).returncode
    except KeyboardInterrupt:  # the script got the same Ctrl-C and ends itself
        return 130


def partition_search(graph, resource_text: str, settings, devices: tuple[str, ...], invocation: Invocation,
                     tuned: dict | None = None) -> int | None:
    """``search_partitions=True`` in the process the user started: ``None`` when the call should go on
    as usual; otherwise search (trials on the runner), train with the best count (the script again, nested),
    and return the exit code the process ends with.

    Args:
        graph: the user's single-device graph.
        resource_text: the resource file's text (part of the cache key).
        settings: the run's :class:`~parallax.job.settings.Settings`.
        devices: the job's devices (``host/device``), held by each trial.
        invocation: what this process was asked (its search request, its cache, whether it is a trial).
        tuned: the tuned choice this process took, for the script run again (:func:`run_final`).
    """
    from parallax.launch.launcher import current_program
    from parallax.trials.script import TrialLauncher

    if invocation.trial is not None or in_final_run(invocation):
        return None  # a trial's job, or the real run after the search
    counts = partition_counts(graph)
    if counts is None:
        logger.warning("Parallax: search_partitions=True, but no variable is built with "
                       "parallax.get_partitioner(): nothing to search")
        return None
    request, root = invocation.search, invocation.cache_root()
    if request.partitions is not None:
        logger.warning("Parallax: partition count %s given (%s): no search", request.partitions, PARTITIONS_ENV)
        return None
    key = cache_key(graph, resource_text, settings.run_option, settings.sync)
    cached = cached_count(key, root)
    if cached is not None:
        logger.warning("Parallax: partition search: using %d partitions found by an earlier search (cache %s)",
                       cached, key[:12])
        return run_final(cached, tuned)
    warmup, timed = request.steps
    tmp = tempfile.mkdtemp(prefix="parallax-search-")  # kept when a trial fails: its log is named
    with trial_runner(request, len(devices)) as runner:
        trials = TrialLauncher(runner, current_program(), tmp, devices, warmup, timed, request.trial_timeout)
        best, results, seconds = search(counts, lambda p: trials.run_one({"partitions": p}))
    if len(results) == trials.count:
        shutil.rmtree(tmp, ignore_errors=True)
    path = store_count(key, best, results, seconds, root)
    logger.warning("Parallax: partition search chose %d partitions (%s) in %.1f s; stored in %s", best,
                   ", ".join(f"{p}: {t * 1e3:.2f} ms/step" for p, t in results.items()), seconds, path)
    return run_final(best, tuned)


def partitioned_shapes(graph) -> list[tuple]:
    """Full shapes of the variables split by a partitioner (their ``save_slice_info``)."""
    import tensorflow as tf

    shapes = []
    for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        info = getattr(v, "_save_slice_info", None)
        if info is not None:
            shapes.append(tuple(info.full_shape))
    return shapes
