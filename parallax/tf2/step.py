"""The step ``parallel_run`` returns for a ``tf.function``: called like the program's step, on every worker.

``step(x, y)`` runs one synchronised training step of the traced step
(:mod:`parallax.tf2.trace`) through the session: each argument takes one batch per
local replica, as ``sess.run``'s feeds do (a list, or an ndarray whose first axis is
the replicas; with one replica per process a plain batch is that replica's), and the
step's return value comes back in its structure (nothing, a tensor, a tuple, a dict; values
that are no tensors as they are), each tensor a list of one value per replica
(:class:`parallax.runtime.translate.ReplicaValues`: ``float()`` takes it when the replicas
agree, or there is one).

``step.sync_variables()`` writes the trained values (this worker's) into the program's
eager variables, so that ``model.save_weights``, ``tf.train.Checkpoint`` or ``model.predict``
see them; ``close()`` does it, then ends the session. The metrics the step updates are in the
program's variables after every step, summed over the workers (:mod:`parallax.tf2.summed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from parallax.analysis.batch_statistics import replica_sums_of
from parallax.errors import Preempted
from parallax.logs import log as logger
from parallax.tf2.checkpoints import StepCheckpoints
from parallax.tf2.deferred import positional, static
from parallax.tf2.first_step import check_first_step
from parallax.tf2.host_edits import HostWatch, shown
from parallax.tf2.masked_means import is_masked_count
from parallax.tf2.summed import SummedState
from parallax.tf2.trace import TracedStep, first_batched

__all__ = ["DistributedStep"]


class DistributedStep:
    """A traced ``tf.function`` step, trained data-parallel (see the module docstring).

    Args:
        session: the session ``parallel_run`` made over the traced step's graph.
        traced: the traced step.
        checkpoints: the job's checkpoints in the program's form (``CheckPointConfig.checkpoint``), if any.
        worker_id: this worker's index (worker 0 saves the checkpoints).
        check: the graph's gradients, for the first step's check (:mod:`parallax.tf2.first_step`); ``None``:
            no check.
        preemption: the job's preemption state (the session's, :class:`parallax.member.preemption.Preemption`),
            or ``None`` (a process that does not take SIGTERM). Worker 0 of a job with ``checkpoints`` saves them
            when the job is asked to end, and its call ends the process.
        counts: for the first step's check, the counts a masked loss divides by
            (:func:`parallax.tf2.masked_means.own_counts`).
    """

    def __init__(self, session: Any, traced: TracedStep, checkpoints: StepCheckpoints | None = None,
                 worker_id: int = 0, check: list | None = None, preemption: Any = None,
                 counts: list[tuple[str, str]] = ()) -> None:
        self._check = check
        self._counts = list(counts)
        self._chief = worker_id == 0
        self._part: int | None = None  # the examples of a replica's part at the first step
        self._parts_told = False
        self._session = session
        self._traced = traced
        self._checkpoints = checkpoints
        self._preemption = preemption if checkpoints is not None and worker_id == 0 else None  # saves when asked
        if checkpoints is not None:
            checkpoints.start(chief=worker_id == 0)
        if self._preemption is not None:
            self._preemption.leave_to_the_step()
        self._leaves = tf.nest.flatten(traced.outputs)  # a step that returns nothing: [None]
        self._fetches = ([t for t in self._leaves if isinstance(t, tf.Tensor)], traced.train_op)
        self._ranks = [t.shape.rank for t in traced.inputs]
        self._summed = SummedState(session, traced.variables, traced.graph, self._fetches[0])
        # the program's variables it may set (a slot made in the step comes as a bare handle); its metrics: summed
        kept = {n: e for n, e in traced.variables.items() if e.variable is not None and not e.summed}
        self._host = HostWatch({n: e.read for n, e in kept.items()}, {n: e.value for n, e in kept.items()})
        # what a loop sets between steps and the next step takes (a learning rate, a loss's weight): looked at
        # before each step (one element each: a cheap look); the others, when the program and the job agree
        self._each_step = [n for n in traced.host_writes if n in kept and not kept[n].trainable
                           and kept[n].value.size == 1]

    @property
    def session(self) -> Any:
        """The session (:class:`parallax.runtime.session.ParallaxSession`) that runs the step's graph."""
        return self._session

    @property
    def graph(self) -> tf.Graph:
        """The step's single-device graph."""
        return self._traced.graph

    @property
    def sums_masked_counts(self) -> bool:
        """Whether the step sums the counts a masked loss divides by over the replicas
        (:mod:`parallax.tf2.masked_means`)."""
        return any(is_masked_count(name) for name in replica_sums_of(self._traced.graph))

    @property
    def num_replicas(self) -> int:
        return self._session.num_replicas

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """One training step: ``args`` (and ``kwargs``) as the ``tf.function`` takes them, each tensor one batch per
        replica.

        On worker 0 of a job asked to end with a checkpoint (SIGTERM), the step saves the step's checkpoint
        and does not return: the process ends here with the preempted exit code
        (:mod:`parallax.member.preemption`).

        Raises:
            ValueError: the arguments do not match the step's input signature, or a batch is not one
                per replica.
        """
        try:
            return self._step(positional(self._traced.function, args, kwargs))
        except Preempted as preempted:  # the step saved: the process ends here, where the program's call returns
            if self._preemption is None:
                raise
            self._preemption.end(preempted)

    def _step(self, args: tuple) -> Any:
        """:meth:`__call__`'s step.

        Raises:
            Preempted: the job was asked to end, and the step's checkpoint is saved.
        """
        flat = _flatten_up_to(list(self._traced.signature), list(args))
        if flat is None or len(flat) != len(self._traced.inputs):
            raise ValueError(f"the step takes arguments shaped as its input_signature ({self._traced.signature}), "
                             f"each tensor one batch per replica, and each argument that is no tensor (a model, a "
                             f"flag) the value it was traced with; got {len(args)} argument(s) shaped otherwise")
        feeds = {placeholder: self._per_replica(value, rank)
                 for placeholder, value, rank in zip(self._traced.inputs, flat, self._ranks)}
        if self._traced.part_rows is not None:  # the rows of each replica's part, where its draws are one device's
            feeds[self._traced.part_rows] = [np.int32(np.shape(part)[0]) for part in first_batched(feeds.items()) or []]
        for position, (placeholder, value) in enumerate(feeds.items()):
            _check_fits(placeholder, value, position)
        if not self._parts_told:
            self._check_parts(feeds)
        if self._each_step:
            changed = self._host.changed(self._each_step)
            if changed:
                self.write_host({name: self._host.read(name) for name in changed})
        if self._check is not None:
            gradients, self._check = self._check, None
            try:
                check_first_step(self._session, gradients, feeds, self.num_replicas, self._traced.graph,
                                 self._counts)
            except Exception as e:  # noqa: BLE001 - a check that cannot run says so and trains on
                logger.info("Parallax: the first step's check did not run (%s: %s)", type(e).__name__, e)
        fetched, _ = self._session.run(self._fetches, feed_dict=feeds)
        self._summed.after_step(fetched)
        values = iter(fetched)
        outputs = tf.nest.pack_sequence_as(
            self._traced.outputs, [next(values) if isinstance(t, tf.Tensor) else t for t in self._leaves])
        if self._checkpoints is not None:
            self._checkpoints.after_step(self)
            if self._preemption is not None and self._preemption.requested:  # SIGTERM: save at this step, end
                self._checkpoints.save(self)
                raise Preempted(f"saved the step's checkpoint at step {self._checkpoints.step} in "
                                f"{self._checkpoints.directory}")
        return outputs

    def weighs_parts(self) -> None:
        """The caller weighs each part by its examples (``parallax.fit``): parts of other sizes are not told of."""
        self._parts_told = True

    def _check_parts(self, feeds: dict) -> None:
        """Say once at WARNING where this worker's parts of a batch differ in size from each other or from the first
        step's: the replicas' gradients are averaged with equal weights (a worker sees its own parts only)."""
        batched = first_batched(feeds.items())
        if batched is None:
            return
        sizes = sorted({int(np.shape(part)[0]) for part in batched})
        self._part = self._part or sizes[-1]
        if sizes != [self._part]:
            self._parts_told = True
            logger.warning("Parallax: this worker's parts of a batch have %s examples where the first step's had %d "
                           "(a worker sees its own parts only). The replicas' gradients are averaged with equal "
                           "weights: where the parts of one global batch differ in size (a last batch that does not "
                           "divide, cut with np.array_split), the step trains otherwise than one device; cut global "
                           "batches that divide evenly (drop_remainder=True), or weigh each part's loss by its "
                           "examples. Where they are equal (a last batch that divides), it trains as one device",
                           " and ".join(map(str, sizes)), self._part)

    def defer_sums(self) -> None:
        """Sum the program's metrics over the workers only when :meth:`flush_sums` is called, not after every
        step (``parallax.fit``: :class:`parallax.tf2.summed.SummedState`)."""
        self._summed.defer()

    def restart_sums(self) -> None:
        """This worker's copies of the program's metrics in the job set to zero, as the program's were
        (:meth:`parallax.tf2.summed.SummedState.restart`)."""
        self._summed.restart(self._traced.summed_writes)

    def flush_sums(self, flags: tuple = ()) -> np.ndarray:
        """What the steps since the last flush added to the program's metrics, summed over the workers, added to
        them; ``flags`` summed along and returned (every worker calls it at the same points)."""
        return self._summed.flush(flags)

    def _per_replica(self, value: Any, rank: int | None) -> Any:
        """A plain batch stands for the one replica of a process that has one."""
        if self.num_replicas == 1 and not isinstance(value, (list, tuple)) and rank is not None \
                and np.ndim(value) == rank:
            return [value]
        return value

    @property
    def set_between_steps(self) -> list[str]:
        """The variables a step looks at before it runs, and writes into the job where the program set them (the
        step's scalars that are not trained, which a loop sets between steps: a learning rate, a loss's weight)."""
        return list(self._each_step)

    def leave_edits(self) -> None:
        """Leave the program's writes between steps to the caller (``parallax.fit``'s
        :class:`parallax.tf2.host_edits.HostEdits`, which agrees over the workers on what its callbacks set)."""
        self._each_step = []

    def can_write(self, name: str) -> bool:
        """Whether the program's value of variable ``name`` can be written into the job (not a slot, nor kept in
        parts by ``zero_stage``)."""
        return name in self._traced.host_writes and name not in self._session.held_in_parts

    def write_host(self, values: dict[str, Any]) -> None:
        """Write ``values`` (by variable name) into the program's variables and the job's, before the next step
        (every worker of the job writes the same: in PS only the chief's write runs, the others wait for it)."""
        feeds, writes = {}, []
        for name, value in sorted(values.items()):
            self._traced.variables[name].write(value)
            placeholder, write = self._traced.host_writes[name]
            feeds[placeholder] = [value] * self.num_replicas
            writes.append(write)
        self._session.run(writes, feed_dict=feeds)
        self._host.agree(values)

    @property
    def host(self) -> HostWatch:
        """The program's variables as the job holds them (:mod:`parallax.tf2.host_edits`)."""
        return self._host

    def unwatch(self, variable: Any) -> None:
        """``variable``'s changes in the program lose nothing: it is the host's own (the metrics' state
        ``parallax.fit`` keeps)."""
        backing = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", variable)
        self._host.ignore({n for n, e in self._traced.variables.items() if e.variable is backing})

    def sync_variables(self, whole_slots: bool = False, look: bool = True) -> None:
        """Write this worker's values of the step's variables into the program's eager variables, saying at WARNING
        which of them the program changed since they last agreed (the job did not see it; ``look=False``: the caller
        knows nothing did, and the look is spared). Optimizer slots that ``zero_stage`` keeps in parts stay as they
        were, or with ``whole_slots`` (every worker must call it then: the parts are gathered from every worker) are
        written whole."""
        changed = self._host.changed() if look else []
        if changed and self._chief:
            logger.warning("Parallax: the program changed %s while the job trained (between steps, or in a callback "
                           "within an epoch); the job trains its own copies of the step's variables, made from the "
                           "program's when the step was traced, and did not see the change (one device would have "
                           "trained with it); the program's variables now get the job's values. Set such a value "
                           "before parallel_run, or pass it to the step as an argument (a scalar that is not "
                           "trained, such as a learning rate, reaches the job before the next step)",
                           shown([self._traced.variables[n].name for n in changed]))
        held = self._session.held_in_parts
        graph = self._traced.graph
        kept = set(self._summed.names)  # the program's metrics: already summed after each step
        names = [n for n in sorted(self._traced.variables) if n not in held and n not in kept]
        variables = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        written = dict(zip(names, self._session.read([variables[n] for n in names])))
        if whole_slots and held and self._session.group is not None:
            from parallax.rewrite.zero import sharded_slots
            from parallax.runtime.zero_checkpoint import whole_slots as gather

            raw = self._session.raw_session
            pairs = sorted(sharded_slots(raw.graph))
            shapes = {n: variables[n].shape.as_list() for n, _ in pairs}
            written.update(gather(raw, raw.graph, pairs, shapes, self._session.group))
        for name, value in written.items():
            self._traced.variables[name].write(value)
        self._host.agree(values=written)  # the values read from the job: of the program's variables' dtypes

    def should_stop(self) -> bool:
        return self._session.should_stop()

    def close(self, write_back: bool = True) -> None:
        """Write the trained values into the program's variables (and, on worker 0, save the job's checkpoint
        when ``CheckPointConfig.checkpoint`` is set), then close the session; ``write_back=False``: the program's
        variables already hold them (``parallax.fit``, after an epoch's end), and what it set since stays."""
        try:
            if (self._checkpoints is None or self._checkpoints.save(self) is None) and write_back:
                self.sync_variables()
        finally:
            self._session.close()

    def __enter__(self) -> DistributedStep:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return exc_type is tf.errors.OutOfRangeError


def _check_fits(placeholder: tf.Tensor, per_replica: Any, position: int) -> None:
    """Refuse a replica's batch whose shape the step's signature does not take (a later call of a step traced
    at its first call, with other shapes), naming the argument, before TensorFlow's feed error.

    Raises:
        ValueError: naming the argument tensor, its shape and the signature's.
    """
    for value in per_replica if isinstance(per_replica, (list, tuple)) else [per_replica]:
        shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
        if not placeholder.shape.is_compatible_with(shape):
            raise ValueError(f"the step's argument tensor {position} has shape {list(shape)} on a replica, and its "
                             f"signature takes {placeholder.shape} (traced from its first call, or its "
                             "input_signature): a tf.function Parallax trains keeps one signature; pad or cut the "
                             "batches to it")


def _flatten_up_to(structure: Any, value: Any) -> list | None:
    """``value``'s parts at the leaves (``tf.TensorSpec``) of ``structure``, each kept whole (a per-replica
    list stays a list); ``None`` when ``value`` is not shaped as ``structure``."""
    if isinstance(structure, tf.TensorSpec):
        return [value]
    if static(structure):  # a Python value the step was traced with (a model, a flag): that one at every call
        same = value is structure or (type(value) is type(structure) and isinstance(value, (bool, str, bytes))
                                      and value == structure)
        return [] if same else None
    if isinstance(structure, dict):
        if not isinstance(value, dict) or set(value) != set(structure):
            return None
        parts = [_flatten_up_to(structure[k], value[k]) for k in sorted(structure)]
    elif isinstance(structure, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(structure):
            return None
        parts = [_flatten_up_to(s, v) for s, v in zip(structure, value)]
    else:
        return None
    return None if any(p is None for p in parts) else [leaf for p in parts for leaf in p]
