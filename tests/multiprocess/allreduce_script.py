"""The ``mpi`` backend's all-reduce summing TensorFlow's buffers in place, on real ranks.

    python allreduce_script.py --resource_info FILE --out DIR    # starts the ranks (launcher)
    python allreduce_script.py --rank --out DIR                   # what each rank runs

Each rank sums, twice, tensors that must not be changed by the call (constants Grappler may
merge or fold, a variable's value, a tensor the step also fetches) beside tensors whose buffer
it may take over (a fresh product, large and small; two above the compiled op's huge-page
size, of odd length), in one fusion bucket and in several, and writes what it saw, with the
huge pages its anonymous memory gained in the steps. With ``--mixed``, rank 0 sums with the
compiled op and the others through the ``PyFunc``: both must issue the same MPI calls (the
small buffers fused into one, ``fused_layout``). With ``--spin S``, rank 1 asks for each call to
wait for every rank asleep after S seconds (``parallax.comm.arrival``) and rank 0 does not: they
must agree when they bind, or the calls would not match.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def rank_main(out: str, fusion_bytes: int, mixed: bool, spin: float | None) -> None:
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    from parallax.comm.mpi import FUSE_BELOW_BYTES, HUGE_PAGE_BYTES, MPIBackend, import_bound
    from parallax.invocation import current
    from parallax.plan.model import CommSpec

    comm = MPI.COMM_WORLD
    rank = comm.rank + 1.0  # rank r contributes r + 1, so every sum is 1 + 2 + ... = n(n+1)/2
    big = FUSE_BELOW_BYTES // 4 + 3  # float32 elements: summed alone (not fused), odd length
    huge = HUGE_PAGE_BYTES // 4 * 2 + 5  # above the size the compiled op asks huge pages for
    graph = tf.Graph()
    with graph.as_default():
        const = tf.constant(np.full(big, rank, np.float32), name="const")
        var = tf.compat.v1.Variable(np.full(big, rank, np.float32), name="var", use_resource=True)
        shared = tf.fill([7], rank, name="shared") * 1.5  # also fetched by the step
        fresh_big = tf.fill([big], rank) * 2.0
        fresh_small = [tf.fill([k + 1, 3], rank) * 3.0 for k in range(4)]
        ints = tf.fill([5], tf.cast(rank, tf.int64)) * 4
        halves = tf.fill([16], tf.cast(rank, tf.float16))  # travels as float16 (summed by our MPI operation)
        # equal to const: Grappler merges equal constants and folds a constant fill, and
        # a merged buffer summed twice in place would come out 4x
        twins = [tf.constant(np.full(big, rank, np.float32)), tf.fill([big], rank)]
        scalar = tf.constant(2.0) * rank  # a 0-d tensor reaches the call as a numpy scalar (a copy)
        fresh_huge = tf.fill([huge], rank) * 5.0
        const_huge = tf.constant(np.full(huge, rank, np.float32))  # not the call's: summed in a copy
        var_value = var.read_value()
        inputs = [const, var_value, shared, fresh_big, *fresh_small, ints, halves, *twins, scalar, fresh_huge,
                  const_huge]
        backend = MPIBackend(CommSpec(fusion_bytes=fusion_bytes), comm.size)
        summed = backend.allreduce_sum(inputs)
    # mixed: rank 0 sums with the compiled op, the others through the PyFunc (the same MPI calls)
    asked = current()  # this process's door: the compiled op and its huge pages as the test's environment says
    native = (comm.rank == 0 or not mixed) and asked.comm.native_ops
    run_graph, release = import_bound(graph, backend, native_ops=native, spin=spin if comm.rank == 1 else None,
                                      cache_root=asked.cache_root(), huge_pages=asked.comm.huge_pages)
    with run_graph.as_default():
        fetch = [run_graph.get_tensor_by_name(t.name) for t in summed]
        inputs_after = [run_graph.get_tensor_by_name(t.name) for t in (const, var_value)]
        shared_t = run_graph.get_tensor_by_name(shared.name)
        with tf.compat.v1.Session(graph=run_graph) as sess:
            sess.run(run_graph.get_operation_by_name("var/Assign"))
            huge_before = _anon_huge_page_kb()
            steps = []
            for _ in range(2):
                values, shared_seen = sess.run([fetch, shared_t])
                # each sum is one value throughout: its least and greatest element say it (the whole of the
                # 8 MiB buffers as JSON took most of the test's 112 s)
                steps.append({"sums": [[float(np.min(v)), float(np.max(v))] for v in values],
                              "dtypes": [str(v.dtype) for v in values],
                              "shared_seen": np.asarray(shared_seen).tolist()})
            huge_after = _anon_huge_page_kb()
            unchanged = [np.asarray(v).ravel().tolist()[:3] for v in sess.run(inputs_after)]
    release()
    adjacent = _adjacent_pair(comm, rank, fusion_bytes, native=native,
                              spin=spin if comm.rank == 1 else None)
    with open(os.path.join(out, f"rank_{comm.rank}.json"), "w") as f:
        json.dump({"size": comm.size, "rank": comm.rank, "steps": steps, "inputs_after": unchanged,
                   "ops": sorted({op.type for op in run_graph.get_operations()}),
                   "huge_page_kb_added": huge_after - huge_before, "adjacent": adjacent}, f)


def _adjacent_pair(comm, rank: float, fusion_bytes: int, native: bool, spin: float | None) -> dict:
    """Two small fresh gradients made one after the other (one inter-op thread), which TensorFlow's
    allocator puts back to back: in one bucket, the compiled op sums them where they lie."""
    import numpy as np
    import tensorflow as tf

    from parallax.comm.mpi import MPIBackend, import_bound
    from parallax.comm.native import native_ops
    from parallax.invocation import current
    from parallax.plan.model import CommSpec

    graph = tf.Graph()
    with graph.as_default():
        source = tf.compat.v1.Variable(np.full(2 * 131072, rank, np.float32), name="source", use_resource=True)
        parts = [p * 1.5 for p in tf.split(source.read_value() * 2.0, 2)]  # views of one buffer, then their own
        backend = MPIBackend(CommSpec(fusion_bytes=fusion_bytes), comm.size)
        summed = backend.allreduce_sum(parts)
    root = current().cache_root()  # this process's door: where the test keeps the compiled op
    run_graph, release = import_bound(graph, backend, native_ops=native, spin=spin, cache_root=root)
    ops = native_ops(root) if native else None
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=run_graph, config=config) as sess:
        sess.run(run_graph.get_operation_by_name("source/Assign"))
        before = ops.fused_counts() if ops else (0, 0)
        sums = [[float(np.asarray(v).min()), float(np.asarray(v).max())]
                for _ in range(3) for v in sess.run([run_graph.get_tensor_by_name(t.name) for t in summed])]
        after = ops.fused_counts() if ops else (0, 0)
    release()
    return {"sums": sums, "in_place": after[0] - before[0], "copied": after[1] - before[1]}


def _anon_huge_page_kb() -> int:
    """This process's anonymous memory in transparent huge pages (kB), from ``/proc/self/smaps``."""
    with open("/proc/self/smaps") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resource_info")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", action="store_true")
    parser.add_argument("--fusion_bytes", type=int, default=64 << 20)
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument("--spin", type=float, default=None)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.rank:
        return rank_main(args.out, args.fusion_bytes, args.mixed, args.spin)
    from tests.multiprocess.harness import launch_ranks

    sys.exit(launch_ranks(__file__, args.resource_info, ["--rank", "--out", args.out, "--fusion_bytes",
                                                          str(args.fusion_bytes)] + (["--mixed"] if args.mixed else [])
                          + (["--spin", str(args.spin)] if args.spin is not None else [])))


if __name__ == "__main__":
    main()
