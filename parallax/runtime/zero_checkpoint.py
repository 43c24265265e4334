"""Checkpoints of the optimizer slots ``zero_stage`` keeps in parts: gathered on save, sharded on restore.

No worker holds a sharded slot whole (:mod:`parallax.rewrite.zero`); a checkpoint holds it whole,
under its single-device name, so that it restores into the plain single-device graph and into a job of
any worker count, with ZeRO or without. In a ZeRO job with ``CheckPointConfig.ckpt_dir`` every worker
takes part (over the workers' MPI communicator; the ``mpi`` backend is the one that shards):

* **save**: when a save is due (every ``save_ckpt_steps`` global steps, which every worker counts
  alike; the chief's ``save_ckpt_secs`` clock, which it tells the others after each training step; the
  session's end), every worker sends its parts to the chief (``Gather``, between the steps every worker
  runs), the chief joins them (the padding dropped, the slot's shape restored) and its saver writes
  them beside the variables: each slot is a saveable (:class:`_Joined`) whose value is the joined
  slot. Only after a training step: a run that trains nothing (a loss fetched on the chief alone)
  never waits for the others;
* **restore**: when the chief's session starts from a checkpoint, its saver reads each slot whole
  (the saveable keeps it), and right after, every worker takes its part of it (the chief broadcasts
  the slots it restored; each worker cuts its part, as the rewrite cuts: elements ``[k m, (k+1) m)`` of
  the slot flattened, padded with zeros). A checkpoint of a job without ZeRO restores the same way.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.training.saving import saveable_object

from parallax.job.paths import CHECKPOINT_BASENAME
from parallax.plan.model import part_sizes

__all__ = ["ShardedSlots", "ShardedSlotsSaverHook", "whole_slots"]


class _Joined(saveable_object.SaveableObject):
    """A sharded slot in a checkpoint: saved from the value the chief joined, restored into ``restored``."""

    def __init__(self, name: str, dtype: tf.DType, slots: ShardedSlots) -> None:
        value = tf.numpy_function(lambda: slots.joined[name], [], dtype, stateful=True, name="parallax_joined")
        super().__init__(value, [saveable_object.SaveSpec(value, "", name, dtype=dtype)], name)
        self._slots = slots

    def restore(self, restored_tensors, restored_shapes):
        name = self.name

        def keep(value: np.ndarray) -> np.int64:
            self._slots.restored[name] = np.array(value, copy=True)
            return np.int64(0)

        return tf.numpy_function(keep, [restored_tensors[0]], tf.int64, stateful=True, name="parallax_restored")


class ShardedSlots:
    """The sharded slots of one worker's graph, and its part of each (see the module docstring).

    Args:
        graph: the rewritten graph (not finalized yet: the assignments of restored parts are built now).
        slots: ``(slot, this worker's part variable)`` pairs (:func:`parallax.rewrite.zero.sharded_slots`).
        shapes: each slot's shape and dtype (the single-device variable's).
        comm: the workers' MPI communicator (``None``: ``MPI.COMM_WORLD``).
        num_workers, worker_index: the job's workers and this one.
    """

    def __init__(self, graph: tf.Graph, slots: list[tuple[str, str]], shapes: dict[str, tuple[tuple, str]],
                 comm: Any, num_workers: int, worker_index: int) -> None:
        self._comm = comm
        self.num_workers, self.worker_index = num_workers, worker_index
        self.joined: dict[str, np.ndarray] = {}  # the chief's joined slots, while it saves
        self.restored: dict[str, np.ndarray] = {}  # the chief's slots read from a checkpoint
        self._slots = sorted(slots)
        self._shapes = shapes
        with graph.as_default(), tf.name_scope("parallax_zero_checkpoint/"):
            self._parts = [graph.get_tensor_by_name(_read_name(graph, part)) for _, part in self._slots]
            self._assigns = []
            for (_, part), read in zip(self._slots, self._parts):
                value = tf.compat.v1.placeholder(read.dtype, read.shape)
                variable = graph.get_operation_by_name(part)
                target = variable.outputs[0]
                op = tf.raw_ops.AssignVariableOp(resource=target, value=value) if target.dtype == tf.resource \
                    else tf.compat.v1.assign(target, value).op
                self._assigns.append((value, op))

    @property
    def comm(self) -> Any:
        if self._comm is not None:
            return self._comm
        from mpi4py import MPI

        return MPI.COMM_WORLD

    def saveables(self) -> list[saveable_object.SaveableObject]:
        """What the chief's saver saves for the sharded slots (built in the graph being set up)."""
        return [_Joined(slot, tf.dtypes.as_dtype(self._shapes[slot][1]), self) for slot, _ in self._slots]

    def gather(self, session: Any, step: int) -> None:
        """Every worker, after global step ``step``: send this worker's parts to the chief, which joins them
        into :attr:`joined`.

        Raises:
            RuntimeError: the workers are not after the same step (their saves would pair parts of two steps).
        """
        comm, chief = self.comm, self.worker_index == 0
        steps = comm.allgather(step)
        if len(set(steps)) > 1:
            raise RuntimeError(f"zero_stage checkpoint: the workers save after different global steps ({steps}, in "
                               "worker order); every worker must run the same training steps")
        parts = session.run(self._parts)
        self.joined = {}
        for (slot, _), part in zip(self._slots, parts):
            part = np.ascontiguousarray(part)
            whole = np.empty(part.size * self.num_workers, part.dtype) if chief else None
            comm.Gather(part, whole, root=0)
            if chief:
                shape = self._shapes[slot][0]
                self.joined[slot] = _joined(whole, shape)

    def scatter(self, session: Any) -> None:
        """Every worker, right after the session starts: take its part of each slot the chief restored."""
        restored = self.comm.bcast(self.restored if self.worker_index == 0 else None, root=0)
        self.restored = {}
        feeds, ops = {}, []
        for (slot, _), (value, op) in zip(self._slots, self._assigns):
            if slot in restored:
                feeds[value] = part_of(restored[slot], self.num_workers, self.worker_index)
                ops.append(op)
        if ops:
            session.run(ops, feed_dict=feeds)


def part_of(value: np.ndarray, workers: int, index: int) -> np.ndarray:
    """Worker ``index``'s part of ``value`` flattened, padded to the first part's length.

    >>> part_of(np.arange(5.0), 2, 1)
    array([3., 4., 0.])
    """
    flat = np.asarray(value).reshape(-1)
    sizes = part_sizes(flat.size, workers)
    begin = sum(sizes[:index])
    part = np.zeros(sizes[0], flat.dtype)
    part[:sizes[index]] = flat[begin:begin + sizes[index]]
    return part


def whole_slots(session: Any, graph: tf.Graph, pairs: list[tuple[str, str]], shapes: dict[str, tuple],
                group: Any) -> dict[str, np.ndarray]:
    """Every worker together (an all-gather over ``group``, :class:`parallax.comm.group.WorkerGroup`): each
    sharded slot whole, by its single-device name, from ``pairs`` (``(slot, this worker's part variable)``)
    of ``graph``, the rewritten graph ``session`` runs; ``shapes`` each slot's shape."""
    from parallax.runtime.hooks import run_past_hooks

    reads = [graph.get_tensor_by_name(_read_name(graph, part)) for _, part in pairs]
    every = group.gather([np.asarray(p) for p in run_past_hooks(session, reads)])
    return {slot: _joined(np.concatenate([parts[k] for parts in every]), shapes[slot])
            for k, (slot, _) in enumerate(pairs)}


def _joined(flat: np.ndarray, shape) -> np.ndarray:
    """Every worker's part of a slot, in worker order (``flat``), as the slot: the padding dropped."""
    return flat[:int(np.prod(shape, dtype=np.int64))].reshape(tuple(shape))


def _read_name(graph: tf.Graph, variable: str) -> str:
    """The tensor that reads variable op ``variable``'s value (a ref variable's output, a resource's read)."""
    op = graph.get_operation_by_name(variable)
    if op.outputs[0].dtype != tf.resource:
        return op.outputs[0].name
    # a read that waits for nothing: an update's own reads wait for its writes (zero_stage's copies of a Keras 3
    # update read the parts), and running one would run the update
    reads = [c for c in op.outputs[0].consumers() if c.type == "ReadVariableOp" and not c.control_inputs]
    if reads:
        return reads[0].outputs[0].name
    with graph.as_default():
        return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype")).name


class ShardedSlotsSaverHook(tf.compat.v1.train.SessionRunHook):
    """Every worker's saving of a ZeRO job (in place of TensorFlow's ``CheckpointSaverHook``, which only the
    chief would run): after a training step that makes a save due, and at the end, every worker gathers
    its parts to the chief, which saves (see the module docstring).

    Args:
        slots: the worker's :class:`ShardedSlots`.
        step: the global step of the rewritten graph.
        ckpt_dir, save_steps, save_secs: ``CheckPointConfig``'s.
        saver: the chief's saver (``None`` on the others).
    """

    def __init__(self, slots: ShardedSlots, step: tf.Variable, ckpt_dir: str, save_steps: int | None,
                 save_secs: float | None, saver: tf.compat.v1.train.Saver | None) -> None:
        self._slots = slots
        self._step = step
        self._path = os.path.join(ckpt_dir, CHECKPOINT_BASENAME)
        self._by_clock = save_secs is not None
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=save_secs, every_steps=save_steps)
        self._saver = saver
        self._last = None  # the global step after the last run that trained
        self._saved = None  # the global step last saved

    def before_run(self, run_context) -> None:
        if self._last is None:  # the first run: every worker has taken the chief's (restored) step by now
            self._last = self._saved = int(run_context.session.run(self._step))
            self._timer.update_last_triggered_step(self._last)

    def after_run(self, run_context, run_values) -> None:
        step = int(run_context.session.run(self._step))
        if step == self._last:
            return  # it trained nothing: another worker need not have run it
        self._last = step
        due = self._timer.should_trigger_for_step(step)
        if self._by_clock:  # the chief's clock decides; every worker is after this training step
            due = bool(self._slots.comm.bcast(due if self._slots.worker_index == 0 else None, root=0))
        if due:
            self._timer.update_last_triggered_step(step)
            self._save(run_context.session, step)

    def end(self, session) -> None:
        step = int(session.run(self._step))
        if step != self._saved:
            self._save(session, step)

    def _save(self, session: Any, step: int) -> None:
        self._slots.gather(session, step)
        if self._saver is not None:
            self._saver.save(session, self._path, global_step=step, write_meta_graph=False)
            self._slots.joined = {}
        self._saved = step
