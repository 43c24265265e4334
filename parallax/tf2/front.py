"""The TensorFlow 2 front end of ``parallel_run``: a ``tf.function`` step in, the single-device graph out, and
how to wrap the session ``parallel_run`` makes over it. The door knows TensorFlow 2 only through this module.

:func:`program` is what ``parallel_run`` runs: a ``tf.compat.v1`` graph as it is, or a step traced by
:func:`prepare`; :func:`deferred` stands for a step without an input signature until its first call
(:mod:`parallax.tf2.deferred`). :func:`prepare` restores the program's own checkpoint
(``CheckPointConfig.checkpoint``) before the trace reads the variables' values, traces the step
(:mod:`parallax.tf2.trace`); :meth:`PreparedStep.wrap` turns
``parallel_run``'s session into the step the program calls (:class:`parallax.tf2.step.DistributedStep`).
Nothing downstream learns where the graph came from; TensorFlow 2's conventions for the config are applied with
everything else in force (:func:`parallax.job.in_force.in_force`, ``step=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from parallax.analysis import analyse_graph
from parallax.analysis.batch_statistics import replica_sums_of
from parallax.config import CheckPointConfig, Config
from parallax.logs import log as logger
from parallax.tf2.checkpoints import StepCheckpoints, step_checkpoints
from parallax.tf2.deferred import DeferredStep
from parallax.tf2.evaluate import use_job
from parallax.tf2.first_step import kernel_draws
from parallax.tf2.masked_means import is_masked_count, own_counts
from parallax.tf2.step import DistributedStep
from parallax.tf2.trace import TracedStep, is_step_function, trace_step

__all__ = ["Program", "program", "deferred", "PreparedStep", "prepare", "graph_of", "is_step_function",
           "needs_first_call"]


@dataclass(frozen=True)
class PreparedStep:
    """A traced step and its checkpoints, ready for ``parallel_run``'s session."""

    traced: TracedStep
    checkpoints: StepCheckpoints | None
    check_first_step: bool = True

    @property
    def ckpt_dir(self) -> str | None:
        """Where the step's own checkpoints go (elastic mode adds none)."""
        return self.checkpoints.directory if self.checkpoints is not None else None

    def wrap(self, outcome: tuple) -> tuple:
        """``parallel_run``'s ``(session, num_workers, worker_id, num_replicas)`` with the step in place of the
        session."""
        session, *rest = outcome
        if session.group is not None:
            use_job(session.group)  # parallax.evaluate and parallax.predict shard over this job's workers
        several = rest[0] * rest[2] > 1  # one replica in all trains as one device, whatever the step
        # a step that sums its statistics over the replicas is not one device's on each half of a batch: not checked
        sums = replica_sums_of(self.traced.graph)
        synced = any(not is_masked_count(name) for name in sums)
        checked = analyse_graph(self.traced.graph).gradients \
            if self.check_first_step and several and rest[1] == 0 and not synced else None
        counts = own_counts(self.traced.graph, session.raw_session.graph, [n for n in sums if is_masked_count(n)]) \
            if checked else []
        return (DistributedStep(session, self.traced, self.checkpoints, worker_id=rest[1], check=checked,
                                preemption=session.preemption, counts=counts), *rest)


@dataclass(frozen=True)
class Program:
    """What ``parallel_run`` runs: the single-device graph, the config it runs with, and the traced step that
    wraps the session (``None`` for a ``tf.compat.v1`` graph)."""

    graph: Any
    config: Config
    step: PreparedStep | None = None

    @property
    def ckpt_dir(self) -> str | None:
        """Where a step's own checkpoints go (elastic mode adds none there)."""
        return self.step.ckpt_dir if self.step is not None else None

    def wrap(self, outcome: tuple) -> tuple:
        """``parallel_run``'s result: the session, or the step the program calls in its place."""
        return self.step.wrap(outcome) if self.step is not None else outcome


def program(graph_or_step: Any, config: Config, signature: Any = None) -> Program:
    """``graph_or_step`` as ``parallel_run`` runs it with ``config`` (the config in force): a ``tf.function`` step
    traced with TensorFlow 2's conventions (:func:`prepare`), any other graph as it is.

    Raises:
        ValueError: ``CheckPointConfig.checkpoint`` for a ``tf.compat.v1`` graph; an elastic step without its own
            checkpoint.
    """
    if is_step_function(graph_or_step):
        step, config = prepare(graph_or_step, config, signature)
        return Program(step.traced.graph, config, step)
    if config.ckpt_config.checkpoint is not None:
        raise ValueError("CheckPointConfig.checkpoint (a tf.train.Checkpoint) is for a tf.function step; a "
                         "tf.compat.v1 graph's checkpoints are saved under its variables' names: leave it None")
    return Program(graph_or_step, config)


def deferred(fn: Any, start: Callable[[list], tuple], numbers: tuple[int, int, int]) -> tuple:
    """``parallel_run``'s result for a step traced at its first call: a :class:`~parallax.tf2.deferred.DeferredStep`
    that calls ``start`` with the first call's signature, and ``numbers`` (``num_workers, worker_id,
    num_replicas``)."""
    return (DeferredStep(fn, start, numbers), *numbers)


def needs_first_call(fn: Any) -> bool:
    """A ``tf.function`` without an input signature: traced at its first call (:mod:`parallax.tf2.deferred`)."""
    return is_step_function(fn) and getattr(fn, "input_signature", None) is None


def prepare(fn: Any, config: Config, signature: Any = None) -> tuple[PreparedStep, Config]:
    """Trace ``fn`` (with ``signature`` when it has none of its own) after restoring its checkpoint; the config
    without the checkpoint the step keeps itself.

    Raises:
        ValueError: elastic mode without the step's own checkpoint saved on a schedule.
    """
    checkpoints = step_checkpoints(config)
    _check_elastic_step(config, checkpoints is not None)
    if checkpoints is not None:  # the program's own objects restored, before the trace reads their values
        checkpoints.restore()
        config = replace(config, ckpt_config=CheckPointConfig())
    traced = trace_step(fn, signature)
    if checkpoints is not None:
        checkpoints.check_restored()
    check = config.check_first_step
    kernels = kernel_draws(traced.graph) if check and config.micro_batches > 1 else []
    if kernels:  # each micro-batch's copy of a kernel would draw in the check, and run out of step with one device
        logger.info("Parallax: the first step's check does not run with micro_batches=%d: it would draw from the "
                    "kernels of %s", config.micro_batches, ", ".join(op.name for op in kernels[:3]))
        check = False
    return PreparedStep(traced, checkpoints, check), config


def graph_of(fn: Any) -> Any:
    """The single-device graph of ``fn`` (a ``tf.function`` with an input signature), for a plan's preview."""
    return trace_step(fn).graph


def _check_elastic_step(config: Config, has_checkpoint: bool) -> None:
    """An elastic ``tf.function`` step resumes from its own ``tf.train.Checkpoint``, saved on a schedule.

    Raises:
        ValueError: elastic mode is on and the step has no such checkpoint.
    """
    ckpt = config.ckpt_config
    if config.elastic_config.enabled and not (has_checkpoint and (ckpt.save_ckpt_steps or ckpt.save_ckpt_secs)):
        raise ValueError("ElasticConfig: a restarted tf.function step resumes from the program's own "
                         "tf.train.Checkpoint: give CheckPointConfig(ckpt_dir=..., checkpoint=tf.train.Checkpoint("
                         "model=..., optimizer=...), save_ckpt_steps=...) (or save_ckpt_secs)")

