"""16-bit gradients on the wire (parallax/comm/compression.py), on real ranks of the ``mpi`` backend.

    python compression_script.py --resource_info FILE --out DIR    # starts the ranks (launcher)
    python compression_script.py --rank --out DIR                   # what each rank runs

Each rank all-reduces and all-gathers the same tensors as every other format does (float32 of
very different magnitudes, a float64 one, integers), once without compression and once in each
16-bit format; rank 0 through the compiled op and the others through the ``PyFunc`` (both must
make the same MPI calls and round alike). MPI goes over TCP (``--mca btl self,tcp``), so in the
test's network namespace the loopback counter is every byte the ranks sent: each rank writes its
inputs, what came back, and the bytes the all-reduce of one 4 MiB float32 tensor moved.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

FORMATS = ("none", "fp16", "bf16")
BIG = 1 << 20  # float32 elements of the tensor whose bytes are counted (4 MiB)


def _lo_bytes() -> int:
    """Bytes sent on loopback in this process's network namespace (``/proc/net/dev``: /sys shows the
    namespace that mounted it)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    raise RuntimeError("no loopback in /proc/net/dev")


def _inputs(rank: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(10 + rank)
    return {"tiny": rng.normal(size=1000).astype(np.float32) * 1e-7,  # float16 underflows without scaling
            "large": rng.normal(size=(300, 300)).astype(np.float32) * 1e4,  # float16 overflows without it
            "doubles": rng.normal(size=7),
            "ints": np.arange(5, dtype=np.int64) * (rank + 1),
            "rows": rng.normal(size=(4 + rank, 3)).astype(np.float32) * 1e-6,
            "indices": np.arange(4 + rank, dtype=np.int64) + 10 * rank}


def rank_main(out: str) -> None:
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    from parallax.comm.compression import compressed_allgather, compressed_allreduce
    from parallax.comm.mpi import MPIBackend, import_bound
    from parallax.comm.native import OP_NAME
    from parallax.invocation import current
    from parallax.plan.model import CommSpec

    comm = MPI.COMM_WORLD
    mine = _inputs(comm.rank)
    result: dict = {"inputs": {k: v.tolist() for k, v in mine.items()}, "sums": {}, "gathered": {}, "bytes": {},
                    "ops": []}
    for fmt in FORMATS:
        graph = tf.Graph()
        with graph.as_default():
            backend = MPIBackend(CommSpec(), comm.size)
            dense = [tf.constant(mine[k]) for k in ("tiny", "large", "doubles", "ints")]
            summed = compressed_allreduce(dense, fmt, backend.allreduce_sum)
            gathered = compressed_allgather([(tf.constant(mine["rows"]), tf.constant(mine["indices"]))], fmt,
                                            backend.allgather, backend.allreduce_sum)[0]
            big = compressed_allreduce([tf.fill([BIG], 1.0 + comm.rank) * 0.5], fmt, backend.allreduce_sum)[0]
        names = [t.name for t in summed] + [gathered[0].name, gathered[1].name]
        bound, release = import_bound(graph, backend, native_ops=comm.rank == 0, cache_root=current().cache_root())
        result["ops"].extend(sorted({op.type for op in bound.get_operations() if op.type in (OP_NAME, "PyFunc")}))
        with tf.compat.v1.Session(graph=bound) as sess:
            values = sess.run([bound.get_tensor_by_name(n) for n in names])
            big_out = bound.get_tensor_by_name(big.name)
            sess.run(big_out)  # once to warm up, then counted
            comm.Barrier()
            before = _lo_bytes()
            total = sess.run(big_out)
            comm.Barrier()
            result["bytes"][fmt] = _lo_bytes() - before
        release()
        result["sums"][fmt] = {k: np.asarray(v).tolist() for k, v in zip(("tiny", "large", "doubles", "ints"),
                                                                           values[:4])}
        result["sums"][fmt]["dtypes"] = [str(np.asarray(v).dtype) for v in values[:4]]
        result["gathered"][fmt] = {"rows": values[4].tolist(), "indices": values[5].tolist()}
        result["sums"][fmt]["big"] = [float(total.min()), float(total.max())]
    with open(os.path.join(out, f"rank_{comm.rank}.json"), "w") as f:
        json.dump(result, f)


def main() -> None:
    from tests.multiprocess.harness import rank_script

    rank_script(__file__, rank_main, "--mca btl self,tcp")


if __name__ == "__main__":
    main()
