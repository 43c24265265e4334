"""Recognise a program's own ``tf.compat.v1.train.Saver`` calling the session.

``Saver.save(sess, path)`` runs ``sess.run(save_tensor_name, {filename_tensor_name:
path})`` and ``Saver.restore(sess, path)`` runs ``sess.run(restore_op_name,
{filename_tensor_name: path})``. Both feed the saver's file name: a string constant
or placeholder that reaches the ``prefix`` of the saver's ``SaveV2``/``RestoreV2``
ops (through ``StringJoin``/``ShardedFilename`` when it saves in shards). A run that
feeds one is a checkpoint call, and the session answers it as the saver expects
(one value, not one per replica): a save on the chief only, a restore on every worker
(see :class:`parallax.runtime.session.ParallaxSession`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["SaverCalls", "SAVE", "RESTORE"]

SAVE, RESTORE = "save", "restore"

_SAVE_OPS = frozenset({"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints"})
_RESTORE_OPS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
_PATH_OPS = frozenset({"StringJoin", "ShardedFilename", "Identity"})  # between the file name and the ops


class SaverCalls:
    """The savers' file-name tensors of ``graph`` (found once, on the first question)."""

    def __init__(self, graph: tf.Graph | None) -> None:
        self._graph = graph
        self._filenames: frozenset[str] | None = None

    @property
    def filenames(self) -> frozenset[str]:
        """Names of the tensors that feed a saver's file name."""
        if self._filenames is None:
            found: set[str] = set()
            ops = self._graph.get_operations() if self._graph is not None else []
            for op in ops:
                if op.type in _SAVE_OPS or op.type in _RESTORE_OPS:
                    found.update(_roots(op.inputs[0]) if op.inputs else ())
                    if op.type == "MergeV2Checkpoints" and len(op.inputs) > 1:
                        found.update(_roots(op.inputs[1]))
            self._filenames = frozenset(found)
        return self._filenames

    def kind(self, fetch_names: list[str], feed_names: list[str]) -> str | None:
        """``SAVE`` or ``RESTORE`` when a run of ``fetch_names`` feeding ``feed_names`` is a saver's call,
        else ``None``."""
        if not feed_names or not self.filenames or not any(_tensor(n) in self.filenames for n in feed_names):
            return None
        starts = [self._graph.as_graph_element(n) for n in fetch_names]
        seen: set[str] = set()
        stack = [s if isinstance(s, tf.Operation) else s.op for s in starts]
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type in _SAVE_OPS:
                return SAVE
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        return RESTORE


def _roots(tensor: Any) -> set[str]:
    """The tensors a saver's file name is made of (walking back through string joins)."""
    found, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if t.op.type in _PATH_OPS and t.op.inputs:
            stack.extend(t.op.inputs)
        else:
            found.add(t.name)
    return found


def _tensor(name: str) -> str:
    return name if ":" in name else name + ":0"
