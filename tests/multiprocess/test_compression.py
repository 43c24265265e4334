"""16-bit gradients on the wire: the sums' and gathers' rounding within the format's bound, half the bytes.

The training cases (each mode, against single-device training within the derived tolerance) are
in the modes' own jobs: test_mpi_mode.py, test_ps_mode.py, test_hybrid_mode.py
(:func:`tests.multiprocess.test_mpi_mode.check_compressed`).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from parallax.comm.compression import UNIT_ROUNDOFF
from parallax.comm.native import OP_NAME
from tests.multiprocess.harness import ROOT, in_group, rank_results

# one xdist worker runs the module's one job for all its tests
pytestmark = [pytest.mark.multiprocess, pytest.mark.core, in_group("compression")]

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "compression_script.py")
RANKS = 3  # sums of 3 are rounded twice: the bound must hold beyond one rounding


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> list[dict]:
    return rank_results(tmp_path_factory.mktemp("compression"), SCRIPT, RANKS)


def test_both_all_reduce_paths_took_part(seen):
    assert OP_NAME in seen[0]["ops"] and all(OP_NAME not in s["ops"] and "PyFunc" in s["ops"] for s in seen[1:])


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_sums_are_within_the_formats_rounding_and_alike_on_every_rank(seen, fmt):
    """Each worker's value is rounded once and each of the ``ceil(log2 3) = 2`` partial sums once: the
    error of an element is at most ``(1 + 2) u`` times the sum of its magnitudes over the workers
    (``u``: the format's unit roundoff, UNIT_ROUNDOFF), whatever its scale: float16 alone would lose
    ``tiny`` (1e-7) and overflow on ``large`` (1e4 x 3 workers)."""
    u = UNIT_ROUNDOFF[fmt]
    inputs = [{k: np.asarray(v) for k, v in s["inputs"].items()} for s in seen]
    for name in ("tiny", "large", "doubles"):
        exact = sum(i[name].astype(np.float64) for i in inputs)
        magnitude = sum(np.abs(i[name].astype(np.float64)) for i in inputs)
        got = np.asarray(seen[0]["sums"][fmt][name])
        assert np.all(np.isfinite(got)), name
        assert np.all(np.abs(got - exact) <= 3 * u * magnitude + 1e-30), (name, np.max(np.abs(got - exact) / magnitude))
        assert np.max(np.abs(got - exact)) > 0, f"{name}: nothing rounded; was it compressed?"
        uncompressed = np.asarray(seen[0]["sums"]["none"][name])  # float32's (float64's) own rounding only
        assert np.all(np.abs(uncompressed - exact) <= 1e-6 * magnitude), name
    assert seen[0]["sums"][fmt]["ints"] == sum(i["ints"] for i in inputs).tolist()  # integers travel as they are
    assert seen[0]["sums"][fmt]["dtypes"] == ["float32", "float32", "float64", "int64"]
    for other in seen[1:]:  # the compiled op and the PyFunc round alike
        assert other["sums"][fmt] == seen[0]["sums"][fmt]


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_gathered_rows_are_each_rounded_once(seen, fmt):
    u = UNIT_ROUNDOFF[fmt]
    rows = np.concatenate([np.asarray(s["inputs"]["rows"]) for s in seen])
    indices = np.concatenate([np.asarray(s["inputs"]["indices"]) for s in seen])
    for s in seen:
        got = s["gathered"][fmt]
        assert got["indices"] == indices.tolist()
        assert np.all(np.abs(np.asarray(got["rows"]) - rows) <= u * np.abs(rows) + 1e-30)
        assert not np.array_equal(np.asarray(got["rows"]), rows)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_a_large_all_reduce_moves_half_the_bytes(seen, fmt):
    for s in seen:
        assert s["sums"][fmt]["big"] == [3.0, 3.0]  # 0.5 + 1 + 1.5, exact in both formats
        ratio = s["bytes"][fmt] / s["bytes"]["none"]
        print(f"{fmt}: {s['bytes'][fmt]:,} bytes on loopback against {s['bytes']['none']:,}: {ratio:.3f}")
        assert 0.45 <= ratio <= 0.55, ratio
