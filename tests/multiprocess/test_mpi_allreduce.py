"""The ``mpi`` backend sums TensorFlow's buffers in place without touching what others hold."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from parallax.comm.native import OP_NAME
from parallax.invocation import HUGE_PAGES_ENV, NATIVE_OPS_ENV
from tests.multiprocess.harness import ROOT, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # extended: make test's MPI jobs sum with the same op

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "allreduce_script.py")


_ONE_BUCKET = 64 << 20  # the small buffers summed together (fused_layout)
_MIXED = "mixed"  # rank 0 with the compiled op, rank 1 through the PyFunc


@pytest.mark.parametrize("native, huge_pages, fusion_bytes, spin", [
    (True, True, 1, None),
    # rank 1's PyFunc sums the large buffers in place too; only rank 1 asks to wait asleep (the
    # compiled op's Arrive and the PyFunc's arrive, agreed on when they bind, or the calls hang)
    (_MIXED, True, _ONE_BUCKET, 2e-4),
    (_MIXED, True, _ONE_BUCKET, None),
    (False, True, 1, None),
    (True, True, _ONE_BUCKET, None),
    # out for CI's time (2026-12-02): the compiled op without the huge-page advice (the same sums; the advice is
    # benchmarks/allreduce.py's to measure) and both ranks' PyFuncs in one bucket (rank 1's PyFunc sums one bucket
    # in the mixed cases)
], ids=["compiled-op", "mixed-one-bucket-arriving", "mixed-one-bucket", "pyfunc", "compiled-op-one-bucket"])
def test_in_place_sums_are_right_and_leave_shared_buffers_alone(tmp_path, monkeypatch, fusion_bytes, native,
                                                               huge_pages, spin):
    mixed = native == _MIXED
    monkeypatch.setenv(NATIVE_OPS_ENV, "1" if native else "0")
    monkeypatch.setenv(HUGE_PAGES_ENV, "1" if huge_pages else "0")
    run = run_script(tmp_path, "localhost: cpu:0,cpu:1\n", "--fusion_bytes", str(fusion_bytes),
                     *(["--mixed"] if mixed else []), *(["--spin", str(spin)] if spin is not None else []),
                     script=SCRIPT, timeout=300)
    assert run.returncode == 0, run.output[-4000:]
    for rank in (0, 1):
        with open(os.path.join(run.out_dir, f"rank_{rank}.json")) as f:
            seen = json.load(f)
        assert (OP_NAME in seen["ops"]) == (rank == 0 if mixed else native), seen["ops"]
        own = rank + 1.0
        total = 3.0  # 1 + 2
        factors = [1.0, 1.0, 1.5, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 1.0, 1.0, 1.0, 2.0, 5.0, 1.0]
        for step in seen["steps"]:  # the second step is the same: nothing accumulated in a reused buffer
            # (each sum as its least and greatest element)
            for values, factor in zip(step["sums"], factors):
                np.testing.assert_allclose(values, total * factor)
            assert len(step["sums"]) == len(factors)
            assert step["dtypes"][-7:-5] == ["int64", "float16"]
            # the tensor the step also fetched is this rank's own value, not the sum
            np.testing.assert_allclose(step["shared_seen"], own * 1.5)
        # the constant and the variable still hold this rank's value
        np.testing.assert_allclose(seen["inputs_after"], [[own] * 3, [own] * 3])
        # two small gradients in one bucket: right sums, each of the 3 calls summed them in one MPI call,
        # where they lay or copied into one buffer (the pure PyFunc ranks always copy: the same MPI calls).
        # Whether TensorFlow's allocator puts them back to back is its choice: on the machine of 2026-11-28
        # it never did (0 of 3, on the landed 14dd351 too), where earlier machines did at least once;
        # benchmarks/allreduce.py reports both counts.
        adjacent = seen["adjacent"]
        np.testing.assert_allclose(adjacent["sums"], [[total * 3.0] * 2] * 6)
        uses_op = rank == 0 if mixed else native
        if uses_op and fusion_bytes == _ONE_BUCKET:
            assert adjacent["in_place"] + adjacent["copied"] == 3, adjacent
            print(f"rank {rank}: {adjacent['in_place']} of 3 calls summed the adjacent pair where it lay")
        print(f"rank {rank}: {seen['huge_page_kb_added']} kB more in huge pages")
        # the two 8 MiB buffers' whole 2 MiB pages (3 each) became huge pages when the op summed them
        # (measured: 30 MiB gained with the advice). Without it the figure depends on which memory the
        # heap reuses (6-20 MiB seen: numpy advises its own large arrays), so only the advice's side is
        # asserted; the unit tests check that the switch takes the advice off the op.
        if native is True and huge_pages and _huge_pages_mode() == "madvise":
            assert seen["huge_page_kb_added"] >= 2 * 3 * 2048, seen["huge_page_kb_added"]


def _huge_pages_mode() -> str:
    """This kernel's transparent huge page mode (``always``, ``madvise``, ``never``; ``""``: none)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return ""
