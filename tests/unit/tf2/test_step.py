"""parallax.tf2.step: what a custom loop's step says of the parts it is given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def test_parts_of_other_sizes_than_the_first_steps_are_told_once(parallax_warnings):
    """A custom loop's global batch cut into parts of other sizes (the last of an epoch, ``np.array_split``): the
    replicas' gradients are averaged with equal weights, said at WARNING once; ``parallax.fit`` weighs its parts."""
    from parallax.tf2.step import DistributedStep

    class Placeholder:
        def __init__(self, rank):
            self.shape = SimpleNamespace(rank=rank)

    step = object.__new__(DistributedStep)
    step._part, step._parts_told = None, False
    batch = Placeholder(2)
    step._check_parts({Placeholder(None): [1.0], batch: [np.zeros((32, 2))]})
    assert not step._parts_told and step._part == 32
    step._check_parts({batch: [np.zeros((21, 2))]})
    assert step._parts_told
    assert "parts of a batch have 21 examples where the first step's had 32" in parallax_warnings[0]
