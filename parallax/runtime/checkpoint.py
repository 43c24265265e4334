"""Checkpoints under the single-device graph's names (``CheckPointConfig``).

The saver of a Parallax session covers exactly the variables of the
single-device graph, under their own names and shapes: each variable once
(replicas share it, or, all-reduced, hold equal copies of which this worker's
is saved), a partitioned variable as slices of the whole (TensorFlow's
``save_slice_info``), and none of Parallax's helper state (accumulators,
token queues, local copies). So a checkpoint restores into the plain
single-device graph with ``tf.compat.v1.train.Saver()``, and into
``parallel_run`` with any mode and any number of workers.

Only the chief saves (worker 0; in MPI mode rank 0) and only it restores the
latest checkpoint of ``ckpt_dir`` when the session starts; the other workers
then get its values (the variables on servers are shared, the others are
broadcast). Optimizer slots that ``zero_stage`` keeps in parts are saved whole
too: every worker sends the chief its parts for each save, and takes its part
of each restored slot (:mod:`parallax.runtime.zero_checkpoint`). A checkpoint that does
not fit the graph is refused before anything starts (:func:`check_checkpoint`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from parallax.errors import CheckpointError
from parallax.job.paths import CHECKPOINT_BASENAME

__all__ = ["single_device_saver", "saver_hook", "check_schedule", "check_checkpoint", "saved_keys", "checkpointing",
           "Checkpointing"]

#: How many mismatches a refusal lists (then "and N more").
_LISTED = 8


def check_schedule(ckpt_config, graph: tf.Graph) -> None:
    """Saving on a schedule counts global steps: refuse a graph without one, before anything starts.

    Raises:
        ValueError: ``save_ckpt_steps``/``save_ckpt_secs`` is set and the graph has no global step.
    """
    if ckpt_config.ckpt_dir and (ckpt_config.save_ckpt_steps or ckpt_config.save_ckpt_secs) and \
            tf.compat.v1.train.get_global_step(graph) is None:
        raise ValueError("CheckPointConfig: saving on a schedule needs a global step in the graph: create it with "
                         "tf.compat.v1.train.get_or_create_global_step() and pass it to minimize(..., "
                         "global_step=...)")


def saved_keys(graph: tf.Graph) -> dict[str, tuple[list[int | None], tf.DType]]:
    """What a checkpoint of ``graph`` holds: each variable's key (its name, or a partitioned variable's
    whole name) with the whole shape and the dtype."""
    keys = {}
    for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) + \
            graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES):
        info = getattr(v, "_save_slice_info", None)
        key, shape = (info.full_name, list(info.full_shape)) if info is not None else (v.op.name, v.shape.as_list())
        keys.setdefault(key, (shape, v.dtype.base_dtype))
    return keys


def check_checkpoint(ckpt_config, graph: tf.Graph) -> str | None:
    """Refuse the latest checkpoint of ``ckpt_dir`` before anything starts when it cannot be restored into
    ``graph``: a variable missing from it, or kept there with another shape or dtype. Another model's
    checkpoint would otherwise fail deep in TensorFlow at the first step, or be overwritten.

    Returns:
        The checkpoint that will be restored, or ``None`` (no ``ckpt_dir``, or none saved there yet).

    Raises:
        CheckpointError: naming the checkpoint file, each variable and both shapes (or dtypes).
    """
    directory = ckpt_config.ckpt_dir
    path = tf.train.latest_checkpoint(directory) if directory and os.path.isdir(directory) else None
    if path is None:
        return None
    try:
        reader = tf.train.load_checkpoint(path)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"CheckPointConfig.ckpt_dir={directory!r}: its latest checkpoint {path} cannot be "
                              f"read ({e}); remove it or point ckpt_dir elsewhere") from e
    differ, missing = [], []
    for key, (shape, dtype) in sorted(saved_keys(graph).items()):
        if key not in shapes:
            missing.append(f'"{key}" (shape {shape}) is not in it')
        elif list(shapes[key]) != shape and None not in shape:
            differ.append(f'"{key}" has shape {list(shapes[key])} there but {shape} in the graph')
        elif dtypes[key] != dtype:
            differ.append(f'"{key}" is {dtypes[key].name} there but {dtype.name} in the graph')
    problems = differ + missing
    if problems:
        listed = "; ".join(problems[:_LISTED]) + (f"; and {len(problems) - _LISTED} more" if len(problems) > _LISTED
                                                  else "")
        raise CheckpointError(
            f"CheckPointConfig.ckpt_dir={directory!r}: its latest checkpoint {path} does not fit this graph: {listed}. "
            "Nothing was restored or overwritten. Point ckpt_dir at this model's checkpoints, or at an empty "
            "directory to start afresh")
    return path


@dataclass
class Checkpointing:
    """How one worker's session saves and restores (:func:`checkpointing`).

    Attributes:
        saver: the chief's saver (``None`` elsewhere, or without ``ckpt_dir``).
        hooks: the hooks that save.
        restore_from: where the chief's session restores from, or ``None``.
        sharded: the ZeRO slots this worker holds parts of, which it gathers to save and takes
            its part of after a restore (:mod:`parallax.runtime.zero_checkpoint`), or ``None``.
    """

    saver: Any = None
    hooks: list = field(default_factory=list)
    restore_from: str | None = None
    sharded: Any = None


def checkpointing(graph: tf.Graph, ckpt_config, plan, worker_index: int, saves: bool, comm: Any) -> Checkpointing:
    """What ``CheckPointConfig`` makes of one worker's session over ``graph`` (the rewritten graph, not yet
    finalized): the chief restores the latest checkpoint and saves on the schedule; with optimizer slots kept
    in parts (``zero_stage``) every worker takes part in each save and restore (``comm``: the workers' MPI
    communicator)."""
    from parallax.rewrite.zero import sharded_slots

    if not ckpt_config.ckpt_dir:
        return Checkpointing()
    steps, secs = ckpt_config.save_ckpt_steps, ckpt_config.save_ckpt_secs
    pairs = sharded_slots(graph)
    sharded = None
    if pairs:
        from parallax.runtime.zero_checkpoint import ShardedSlots

        shapes = {v.name: (v.shape, v.dtype) for v in plan.variables}
        sharded = ShardedSlots(graph, pairs, shapes, comm, plan.num_workers, worker_index)
    saver = single_device_saver(graph, frozenset(v.name for v in plan.variables),
                                sharded.saveables() if sharded is not None else ()) if saves else None
    hooks = []
    if sharded is not None and (steps or secs):
        from parallax.runtime.zero_checkpoint import ShardedSlotsSaverHook

        hooks.append(ShardedSlotsSaverHook(sharded, tf.compat.v1.train.get_global_step(graph), ckpt_config.ckpt_dir,
                                           steps, secs, saver))
    elif saver is not None:
        hook = saver_hook(ckpt_config.ckpt_dir, steps, secs, saver)
        hooks += [hook] if hook is not None else []
    return Checkpointing(saver, hooks, ckpt_config.ckpt_dir if saves else None, sharded)


def single_device_saver(graph: tf.Graph, names: frozenset[str], extra: tuple | list = ()
                        ) -> tf.compat.v1.train.Saver | None:
    """A saver over the variables of ``graph`` (the rewritten graph) whose op names are
    ``names`` (the single-device graph's variables), and the ``extra`` saveables (sharded
    slots); ``None`` when there are none."""
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    seen, variables = set(), []
    for key in keys:
        for v in graph.get_collection(key):
            if v.op.name in names and v.op.name not in seen:
                seen.add(v.op.name)
                variables.append(v)
    if not variables and not extra:
        return None
    return tf.compat.v1.train.Saver(var_list=variables + list(extra), sharded=False, max_to_keep=5,
                                    save_relative_paths=True)


def saver_hook(ckpt_dir: str, save_steps: int | None, save_secs: float | None,
               saver: tf.compat.v1.train.Saver) -> tf.compat.v1.train.SessionRunHook | None:
    """The chief's hook that saves every ``save_steps`` global steps or ``save_secs`` seconds
    (and at the end); ``None`` when neither is set (restore only). The graph has a
    global step: :func:`check_schedule` made sure of it.
    """
    if save_steps is None and save_secs is None:
        return None
    return tf.compat.v1.train.CheckpointSaverHook(ckpt_dir, save_steps=save_steps, save_secs=save_secs,
                                                  saver=saver, checkpoint_basename=CHECKPOINT_BASENAME)
