"""Lookup tables a ``tf.function`` step reads: Keras's ``StringLookup``, ``IntegerLookup``, ``Hashing``-free
``TextVectorization`` inside the model, a ``tf.lookup.StaticHashTable`` of the program's own.

A traced step holds such a table as a captured resource handle, as it holds a variable. A table is state the
step only reads, so Parallax carries its contents into the step's graph: the eager table's keys and values are
exported now (:func:`captured_table`) and the graph gets a table of its own, filled from them when the session
initialises its tables (:func:`build_table`), identical on every worker and replica. A table the step writes
(a ``MutableHashTable`` it inserts into) is refused by the trace, as other resources are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["Table", "captured_table", "build_table"]

_READS = frozenset({"LookupTableFindV2", "LookupTableSizeV2"})


@dataclass(frozen=True)
class Table:
    """A captured table's contents: its keys and values, exported from the eager table."""

    keys: np.ndarray
    values: np.ndarray


def captured_table(handle: Any, placeholder: tf.Tensor) -> Table | None:
    """The contents of the eager table behind ``handle`` (captured as ``placeholder``), when the step only reads
    it (looks keys up, asks its size); ``None`` otherwise (not a table, or one the step writes)."""
    consumers = placeholder.consumers()
    finds = [op for op in consumers if op.type == "LookupTableFindV2"]
    if not consumers or any(op.type not in _READS for op in consumers) or not finds:
        return None
    from tensorflow.python.ops import gen_lookup_ops

    try:
        keys, values = gen_lookup_ops.lookup_table_export_v2(handle, Tkeys=finds[0].get_attr("Tin"),
                                                             Tvalues=finds[0].get_attr("Tout"))
    except (tf.errors.OpError, TypeError):
        return None
    return Table(keys.numpy(), values.numpy())


def build_table(table: Table, name: str) -> str:
    """A table holding ``table``'s contents in the default graph, filled by the tables' initializer
    (``tf.compat.v1.tables_initializer``); returns its handle's op name."""
    keys = tf.constant(table.keys, name=f"{name}/keys")
    values = tf.constant(table.values, name=f"{name}/values")
    default = tf.constant("" if values.dtype == tf.string else 0, values.dtype, name=f"{name}/default")
    made = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default, name=name)
    return made.resource_handle.op.name
