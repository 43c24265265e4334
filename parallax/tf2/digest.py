"""A digest of values (CRC-32), to tell whether two workers, or two moments, hold the same: the batches every worker
drew (:func:`parallax.tf2.batches.check_same`), the backup each restored (:mod:`parallax.tf2.backup`), a variable the
program changed between steps (:mod:`parallax.tf2.host_edits`). One pass over the bytes; equal values give equal
digests on every worker."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["digest"]


def digest(values: Iterable[Any]) -> int:
    """The CRC-32 of ``values`` (arrays, tensors, variables) one after another; ``None`` left out. Strings count by
    their text (an object array's bytes would be its pointers).

    >>> digest([np.arange(3)]) == digest([np.arange(3), None]) != digest([np.arange(4)])
    True
    >>> digest([np.array([b"a", b"b"], dtype=object)]) == digest([np.array(["a", "b"])])
    True
    """
    crc = 0
    for value in values:
        if value is None:
            continue
        array = np.asarray(value)
        if array.dtype.kind in "OSU":
            data = "\x00".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                               for v in array.reshape(-1)).encode()
        else:
            data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        crc = zlib.crc32(data, crc)
    return crc
