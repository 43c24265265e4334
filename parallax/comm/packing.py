"""Several small tensors sent as one flat buffer, and taken apart again.

Every transfer between processes costs a fixed amount beside its bytes (an MPI
call's latency, a gRPC ``RecvTensor``), so tensors below ``PACK_BELOW_BYTES``
travel packed: the MPI backend's fused all-reduce and the parameter servers'
pushes of gradients and workers' reads of variables use these helpers. A
tensor of at least that size travels alone: copying it into a buffer would
cost more than one more transfer.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

__all__ = ["PACK_BELOW_BYTES", "pack", "unpack", "packed_groups", "elements", "static_nbytes"]

#: Tensors smaller than this travel packed with others (measured: an MPI call, or a gRPC transfer
#: of a tensor between processes on one host, costs about as much as copying 256 KiB).
PACK_BELOW_BYTES = 256 * 1024


def pack(tensors: Sequence[tf.Tensor], dtype: tf.DType | None = None, name: str = "pack") -> tf.Tensor:
    """One flat tensor of ``tensors`` (each flattened, cast to ``dtype`` when given), in order."""
    with tf.name_scope(name) as scope:
        flat_shape = tf.constant([-1], name="flat")  # one constant for every reshape: fewer ops to build
        flat = [tf.reshape(t if dtype is None else tf.cast(t, dtype), flat_shape) for t in tensors]
        return tf.concat(flat, 0, name=scope)  # the op takes the scope's name


def unpack(buffer: tf.Tensor, shapes: Sequence, name: str = "unpack") -> list[tf.Tensor]:
    """The tensors a :func:`pack` made ``buffer`` of, given their shapes (static lists or shape
    tensors), as slices of it."""
    with tf.name_scope(name) as scope:
        pieces = tf.split(buffer, [_size(s) for s in shapes], name=scope)
        constants: dict[tuple, tf.Tensor] = {}  # one constant per distinct static shape
        out = []
        for piece, shape in zip(pieces, shapes):
            if not isinstance(shape, tf.Tensor):
                key = tuple(int(d) for d in shape)
                if key not in constants:
                    constants[key] = tf.constant(key, tf.int32, shape=[len(key)], name="shape")
                shape = constants[key]
            out.append(tf.reshape(piece, shape))
        return out


def packed_groups(items: Sequence, key, nbytes) -> tuple[list[list], list]:
    """``items`` split into groups to pack and items that travel alone.

    ``key(item)`` says which items may share a buffer (the same dtype and destination);
    ``nbytes(item)`` is its size (``None``: unknown). Items below :data:`PACK_BELOW_BYTES`
    with the same key form a group, in order; a group of one, and every bigger or unknown
    item, travel alone.
    """
    groups: dict = {}
    alone = []
    for item in items:
        size = nbytes(item)
        if size is not None and size < PACK_BELOW_BYTES:
            groups.setdefault(key(item), []).append(item)
        else:
            alone.append(item)
    packed = [g for g in groups.values() if len(g) > 1]
    alone.extend(g[0] for g in groups.values() if len(g) == 1)
    return packed, alone


def static_nbytes(shape: Sequence[int | None] | None, dtype) -> int | None:
    """Bytes of a tensor of ``shape`` and ``dtype``, or ``None`` when a dimension is unknown."""
    if shape is None or any(d is None or d < 0 for d in shape):
        return None
    return elements(shape) * tf.dtypes.as_dtype(dtype).base_dtype.size


def elements(shape: Sequence[int]) -> int:
    """The number of elements of a static shape."""
    total = 1
    for d in shape:
        total *= int(d)
    return total


def _size(shape) -> tf.Tensor | int:
    return tf.reduce_prod(shape) if isinstance(shape, tf.Tensor) else elements(shape)
