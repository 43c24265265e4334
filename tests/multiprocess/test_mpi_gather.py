"""The ``mpi`` backend gathers every sparse gradient of a call in one call, exactly, on 3 ranks."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.multiprocess.gather_script import WAYS, pairs
from tests.multiprocess.harness import ROOT, in_group, rank_results

# one xdist worker runs the module's one job for all its tests
pytestmark = [pytest.mark.multiprocess, pytest.mark.core, in_group("mpi-gather")]

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "gather_script.py")
RANKS = 3


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> list[dict]:
    return rank_results(tmp_path_factory.mktemp("gather"), SCRIPT, RANKS)


def test_every_pair_of_a_call_goes_in_one_op(seen):
    for rank in seen:
        assert rank["ops"] == {way: [way] for way in WAYS}


@pytest.mark.parametrize("way", WAYS)
def test_each_pair_is_every_rank_s_rows_in_rank_order(seen, way):
    inputs = [pairs(r) for r in range(RANKS)]
    for rank, got in enumerate(seen):
        for k, pair in enumerate(got["gathered"][way]):
            values, indices = inputs[0][k]
            assert pair["dtype"] == str(values.dtype) and pair["index_dtype"] == str(indices.dtype)
            assert pair["static_shape"] == [None, *values.shape[1:]]
            if way == "gatherv" and rank > 0:  # only the first member needs them
                assert pair["shape"] == [0, *values.shape[1:]] and pair["indices"] == []
                continue
            expected = np.concatenate([inputs[r][k][0] for r in range(RANKS)])
            assert pair["shape"] == list(expected.shape)
            np.testing.assert_array_equal(np.asarray(pair["values"]).reshape(expected.shape),
                                          expected.astype(np.float64))  # exact: moved as bytes
            assert pair["indices"] == np.concatenate([inputs[r][k][1] for r in range(RANKS)]).tolist()
