"""A training job started as a trial: it times a few steps, writes what it measured, and ends.

A trial runner (:mod:`parallax.trials.runner`) starts the user's script with
:data:`TRIAL_ENV` set to a JSON request::

    {"choice": {"run_option": "MPI", "fusion_bytes": 4194304}, "warmup": 2, "steps": 5}

Its ``parallel_run`` applies the choice to the script's Config
(:func:`parallax.job.choice.with_choice`) and returns a session that times
each ``run`` call after ``warmup`` of them. After ``steps`` timed calls the
workers agree on the step time (the slowest worker's median), worker 0 writes
the result to :data:`~parallax.invocation.RESULT_ENV`'s file, and every
process ends with exit code 0 (:class:`TrialOver`, a ``SystemExit``: the
script's own ``except Exception`` does not stop it, and nothing is printed).
"""

from __future__ import annotations

import time
from typing import Any

from parallax.invocation import Invocation, TrialRequest
from parallax.trials.execute import write_result

__all__ = ["TrialRequest", "TrialOver", "TrialSession", "trial_request", "in_trial", "trial_env"]


class TrialOver(SystemExit):
    """Ends a trial's process after its timed steps, with exit code 0."""

    def __init__(self) -> None:
        super().__init__(0)


def trial_env(choice: dict[str, Any], warmup: int, steps: int) -> dict[str, str]:
    """The environment that makes a script's ``parallel_run`` a trial of ``choice``."""
    return Invocation(trial=TrialRequest(choice, warmup, steps)).to_env()


def trial_request(invocation: Invocation) -> TrialRequest | None:
    """The trial ``invocation`` asks for (:data:`TRIAL_ENV`), or ``None``."""
    return invocation.trial


class TrialSession:
    """The session a trial's ``parallel_run`` returns (see the module docstring).

    Args:
        session: the real session.
        request: the trial.
        comm: the workers' MPI communicator (``None``: one worker).
        facts: what the result says of the job besides the times (layout, processes, planned bytes).
        result_path: the file the result goes to (:data:`~parallax.invocation.RESULT_ENV`; ``None``: none).
    """

    def __init__(self, session: Any, request: TrialRequest, comm: Any = None,
                 facts: dict[str, Any] | None = None, result_path: str | None = None) -> None:
        self._result_path = result_path
        self._session = session
        self._request = request
        self._comm = comm
        self._facts = facts or {}
        self._calls = 0
        self.times: list[float] = []

    def run(self, fetches: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._session.run(fetches, *args, **kwargs)
        if not self._trains(fetches):
            return result  # the chief's extra fetches (a loss, a summary) are not steps: every worker counts alike
        self._calls += 1
        if self._calls > self._request.warmup:
            self.times.append(time.perf_counter() - start)
        if len(self.times) >= self._request.steps:
            self._finish()
        return result

    def _trains(self, fetches: Any) -> bool:
        """Whether ``fetches`` run a training op (every call does in a graph without one)."""
        train_ops = self._facts.get("train_ops")
        if not train_ops:
            return True
        return any(_op_name(leaf) in train_ops for leaf in _leaves(fetches))

    def _finish(self) -> None:
        ordered = sorted(self.times)
        median = ordered[len(ordered) // 2]
        medians = self._comm.allgather(median) if self._comm is not None else [median]
        if self._comm is None or self._comm.Get_rank() == 0:
            step = max(medians)
            result = {"step_seconds": step, "steps_per_second": 1.0 / step, "worker_medians": medians,
                      "times": self.times, "warmup": self._request.warmup, "choice": self._request.choice,
                      **{k: v for k, v in self._facts.items() if k != "train_ops"}}
            write_result(result, self._result_path)
        self._session.close()
        raise TrialOver()

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> TrialSession:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _leaves(fetches: Any) -> list[Any]:
    if isinstance(fetches, dict):
        return [leaf for v in fetches.values() for leaf in _leaves(v)]
    if isinstance(fetches, (list, tuple)):
        return [leaf for v in fetches for leaf in _leaves(v)]
    return [fetches]


def _op_name(fetch: Any) -> str:
    name = fetch if isinstance(fetch, str) else getattr(fetch, "name", "")
    return name.split(":")[0].lstrip("^")


def in_trial(result: tuple | int, job: Any, invocation: Invocation, launched: Any = None) -> tuple | int:
    """``parallel_run``'s result, its session timing its steps when this process runs a trial
    (``invocation.trial``; its result goes to ``invocation.trial_result``)."""
    request = trial_request(invocation)
    if request is None or isinstance(result, int):
        return result
    from parallax.plan.traffic import step_traffic

    traffic = step_traffic(job.plan).total
    facts = {"layout": job.layout, "processes": len(job.processes), "workers": len(job.workers),
             "bytes_per_step": traffic.total, "bytes_between_hosts": traffic.crossing,
             "train_ops": set(job.plan.train_ops)}
    comm = launched.workers_comm() if launched is not None else None
    session, *rest = result
    return (TrialSession(session, request, comm, facts, invocation.trial_result), *rest)
