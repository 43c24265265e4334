"""The trial runner: hands trials to workers and gives their results back as they complete.

Two back ends with one interface (:class:`TrialRunner`), after the seed's
light master (docs/tuning.md):

* :class:`LocalRunner` (the default): local processes through
  :mod:`concurrent.futures`. Each trial is its own process group
  (:func:`~parallax.trials.execute.run_trial`), waited on by a thread of the
  master; trials whose devices do not overlap run at once, the others in turn.
* :class:`DaskRunner`: futures on a ``dask.distributed`` scheduler: an embedded
  ``LocalCluster`` (one worker process owning this host's devices) by default, or
  the scheduler at ``address`` for a real cluster, whose workers declare their
  host's devices as a Dask resource (``dask worker SCHEDULER --resources
  devices=8``). A trial asks for as many ``devices`` as it uses, and runs on the
  host its devices are on.

A trial that crashes or runs past its time limit comes back with status
``failed`` or ``timeout`` and the tail of its log; one whose Dask worker is lost
comes back ``lost``; the others go on. The master only submits and collects.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from parallax.trials.execute import TrialResult, TrialSpec, run_trial

__all__ = ["TrialRunner", "LocalRunner", "DaskRunner", "make_runner", "BACKENDS", "DeviceLocks"]

BACKENDS = ("local", "dask")
_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class DeviceLocks:
    """Claims on devices: :meth:`hold` waits until none of a trial's devices is held by another trial."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, devices: Iterable[str]) -> Iterator[None]:
        wanted = set(devices)
        with self._changed:
            self._changed.wait_for(lambda: not wanted & self._held)
            self._held |= wanted
        try:
            yield
        finally:
            with self._changed:
                self._held -= wanted
                self._changed.notify_all()


class TrialRunner:
    """What both back ends do: :meth:`submit` trials, take results :meth:`as_completed`."""

    name = "?"

    def submit(self, spec: TrialSpec) -> Any:
        """Start ``spec`` as soon as its devices are free; a future of its :class:`TrialResult`."""
        raise NotImplementedError

    def result_of(self, spec: TrialSpec, future: Any) -> TrialResult:
        """The result of a completed future (a lost worker is a ``lost`` trial, not an exception)."""
        try:
            return future.result()
        except Exception as e:  # noqa: BLE001 - whatever took the worker, the trial is reported, the rest go on
            return TrialResult(spec.name, "lost", spec.params, error=f"{type(e).__name__}: {e}",
                               log=spec.log_path, where=self.name)

    def wait_any(self, futures: set) -> set:
        """Block until at least one of ``futures`` is done; those done."""
        raise NotImplementedError

    def as_completed(self, submitted: dict[Any, TrialSpec]) -> Iterator[TrialResult]:
        """The results of ``{future: spec}`` in the order the trials complete."""
        pending = set(submitted)
        while pending:
            for future in self.wait_any(pending):
                pending.discard(future)
                yield self.result_of(submitted[future], future)

    def run(self, specs: Iterable[TrialSpec]) -> Iterator[TrialResult]:
        """Submit every trial, then yield results as they complete."""
        return self.as_completed({self.submit(spec): spec for spec in specs})

    def close(self) -> None:
        pass

    def __enter__(self) -> TrialRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalRunner(TrialRunner):
    """Trials as local processes (:mod:`concurrent.futures`); at most ``max_parallel`` at once
    (default: this machine's cores), fewer when their devices overlap."""

    name = "local processes"

    def __init__(self, max_parallel: int | None = None) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_parallel or os.cpu_count() or 1,
                                                           thread_name_prefix="parallax-trial")
        self._devices = DeviceLocks()

    def submit(self, spec: TrialSpec) -> concurrent.futures.Future:
        return self._pool.submit(self._run, spec)

    def _run(self, spec: TrialSpec) -> TrialResult:
        with self._devices.hold(spec.devices):
            return run_trial(spec)

    def wait_any(self, futures: set) -> set:
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        return done

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# --------------------------------------------------------------------------- #
# Dask
# --------------------------------------------------------------------------- #

_WORKER_DEVICES = DeviceLocks()  # in a Dask worker's process: the devices its running trials hold


def _on_dask_worker(spec: TrialSpec) -> TrialResult:
    """A trial as a Dask task: on the worker, like a local one."""
    with _WORKER_DEVICES.hold(spec.devices):
        return run_trial(spec)


def _hosts_of(spec: TrialSpec) -> list[str]:
    return sorted({d.split("/", 1)[0] for d in spec.devices})


class DaskRunner(TrialRunner):
    """Trials as Dask futures.

    Args:
        address: a scheduler's address (``tcp://host:8786``); ``None``: an embedded ``LocalCluster``
            of one worker process, with ``devices`` devices and ``max_parallel`` threads (trials at once).
        devices: the embedded worker's ``devices`` resource (the most a trial may ask for).
        max_parallel: the embedded worker's threads.
    """

    name = "dask"
    worker_wait = 60.0  # seconds a trial waits for a worker when the cluster has none

    def __init__(self, address: str | None = None, devices: int = 1, max_parallel: int | None = None) -> None:
        import dask
        from distributed import Client, LocalCluster

        self._cluster = None
        # a worker lost during a trial ends that trial (it could kill the next worker too), not the run
        with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
            if address is None:
                self._cluster = LocalCluster(n_workers=1, threads_per_worker=max_parallel or os.cpu_count() or 1,
                                             processes=True, host="127.0.0.1", dashboard_address=None,
                                             resources={"devices": max(1, devices)}, silence_logs=40)
                self._client = Client(self._cluster)
            else:
                self._client = Client(address, timeout="20s")
        self.address = self._client.scheduler.address
        self.name = f"dask ({self.address})"

    def _workers(self) -> dict[str, dict]:
        return self._client.scheduler_info().get("workers", {})

    def submit(self, spec: TrialSpec) -> Any:
        need = len(spec.devices)
        kwargs: dict[str, Any] = {"pure": False, "key": f"parallax-trial-{spec.name}-{uuid.uuid4().hex[:8]}"}
        if need:
            kwargs["resources"] = {"devices": need}
        hosts = [h for h in _hosts_of(spec) if h not in _LOCAL_NAMES]
        if hosts:
            kwargs["workers"] = hosts
            kwargs["allow_other_workers"] = False
        workers = self._workers()
        if not workers:  # none yet, or a lost one restarting
            with contextlib.suppress(Exception):
                self._client.wait_for_workers(1, timeout=self.worker_wait)
            workers = self._workers()
        fits = [w for w in workers.values() if w.get("resources", {}).get("devices", 0) >= need
                and (not hosts or w.get("host") in hosts or _host_name(w) in hosts)]
        if need and not fits:
            future: concurrent.futures.Future = concurrent.futures.Future()
            have = {a: w.get("resources", {}) for a, w in workers.items()}
            future.set_result(TrialResult(
                spec.name, "failed", spec.params, log=spec.log_path, where=self.name,
                error=f"no Dask worker{' on ' + ', '.join(hosts) if hosts else ''} has {need} 'devices' "
                      f"(the workers' resources: {have or 'no workers'}); start them with "
                      f"--resources devices=N"))
            return future
        return self._client.submit(_on_dask_worker, spec, **kwargs)

    def wait_any(self, futures: set) -> set:
        local = {f for f in futures if isinstance(f, concurrent.futures.Future)}
        if local:
            return local
        from distributed import wait

        done, _ = wait(list(futures), return_when="FIRST_COMPLETED")
        return set(done)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close(timeout=10)
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close(timeout=20)


def _host_name(worker: dict) -> str:
    name = worker.get("host", "")
    with contextlib.suppress(OSError):
        return socket.gethostbyaddr(name)[0]
    return name


def make_runner(backend: str = "local", address: str | None = None, devices: int = 1,
                max_parallel: int | None = None) -> TrialRunner:
    """A runner: ``"local"`` (processes) or ``"dask"`` (the scheduler at ``address``, or an embedded one).

    Raises:
        ValueError: an unknown back end, or an address without the Dask back end.
    """
    if backend not in BACKENDS:
        raise ValueError(f"trial back end {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "local":
        if address:
            raise ValueError(f"a scheduler address ({address}) needs backend='dask'")
        return LocalRunner(max_parallel)
    return DaskRunner(address, devices, max_parallel)
