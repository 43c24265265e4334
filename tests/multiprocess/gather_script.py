"""The ``mpi`` backend's sparse calls (``allgather``, ``allgatherv``, ``gatherv``) on real ranks.

    python gather_script.py --resource_info FILE --out DIR    # starts the ranks (launcher)
    python gather_script.py --rank --out DIR                   # what each rank runs

Each rank gathers the same pairs of values and indices in each of the three ways, all pairs of a
way in one call (:meth:`parallax.comm.mpi.MPIBackend.allgather`): values of several dtypes (a 16-bit
one among them) and ranks, int32 and int64 indices, a rank with no rows of a pair, every rank without
rows of another. Each rank writes what came back (``rank_<r>.json``) and the names of the graph's
``PyFunc`` ops; :func:`pairs` gives any rank's inputs, to check against.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

WAYS = ("allgather", "allgatherv", "gatherv")


def pairs(rank: int) -> list[tuple]:
    """This rank's ``(values, indices)`` pairs: row counts differ by rank (rank 0 has no rows of the
    second pair, no rank has rows of the last)."""
    import numpy as np
    from tensorflow import bfloat16

    rng = np.random.default_rng(20 + rank)
    return [(rng.normal(size=(2 + rank, 3, 2)).astype(np.float32), np.arange(2 + rank, dtype=np.int64) + 10 * rank),
            (rng.normal(size=rank), np.arange(rank, dtype=np.int32) * 7 + rank),
            (rng.normal(size=(3 - rank % 3, 5)).astype(bfloat16.as_numpy_dtype), np.full(3 - rank % 3, rank, np.int64)),
            (rng.normal(size=(1, 1)).astype(np.float16), np.array([rank], np.int64)),
            (np.zeros((0, 4), np.float32), np.zeros(0, np.int64))]


def rank_main(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    from parallax.comm.mpi import MPIBackend, import_bound
    from parallax.invocation import current
    from parallax.plan.model import CommSpec

    comm = MPI.COMM_WORLD
    mine = pairs(comm.rank)
    result: dict = {"ops": {}, "gathered": {}}
    for way in WAYS:
        graph = tf.Graph()
        with graph.as_default():
            backend = MPIBackend(CommSpec(use_allgatherv=way == "allgatherv"), comm.size)
            inputs = [(tf.constant(v), tf.constant(i)) for v, i in mine]
            gathered = (backend.gather if way == "gatherv" else backend.allgather)(inputs)
            shapes = [[None if d is None else int(d) for d in v.shape.as_list()] for v, _ in gathered]
        bound, release = import_bound(graph, backend, cache_root=current().cache_root())
        result["ops"][way] = sorted(op.name for op in bound.get_operations() if op.type == "PyFunc")
        with tf.compat.v1.Session(graph=bound) as sess:
            values = sess.run([bound.get_tensor_by_name(t.name) for pair in gathered for t in pair])
        release()
        result["gathered"][way] = [{"values": np.asarray(v, np.float64).tolist(), "shape": list(v.shape),
                                    "dtype": str(v.dtype), "indices": i.tolist(), "index_dtype": str(i.dtype),
                                    "static_shape": s}
                                   for v, i, s in zip(values[0::2], values[1::2], shapes)]
    with open(os.path.join(out, f"rank_{comm.rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    from tests.multiprocess.harness import rank_script

    rank_script(__file__, rank_main)


if __name__ == "__main__":
    main()
