"""One process of one benchmark job, for each system ``benchmarks/compare.py`` compares.

Every system trains the same :mod:`benchmarks.workloads` model, one replica per worker
process, each worker reading its own shard; worker 0 times the global steps and counts the
bytes sent over loopback (:func:`benchmarks.common.timed_steps`) and writes them as JSON.

* ``tf``: single-device TensorFlow, a plain ``tf.compat.v1.Session``.
* ``parallax``: the unchanged single-device graph and ``parallax.parallel_run`` with a run
  option (PS, MPI, HYBRID); ``parallel_run`` launches its own processes.
* ``tf-ps``: TensorFlow's own parameter servers, written by hand as a TensorFlow user
  would: the model under ``replica_device_setter``, ``SyncReplicasOptimizer`` and its hook,
  ``MonitoredTrainingSession``; started by ``mpirun`` (rank 0 is the server, which only
  uses MPI to share the ports).
* ``horovod``: Horovod by hand: ``hvd.init()``, ``hvd.DistributedOptimizer`` (dense
  gradients all-reduced, sparse ones all-gathered), ``broadcast_global_variables``;
  started by the compat venv's ``mpirun``.

Workers of the peers get ``cores / workers`` TensorFlow threads, as Parallax gives its own.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.common import timed_steps, write_json
from benchmarks.workloads import Workload, workload

#: tf-ps: a worker still waiting for a token after the chief stopped gives up. More than 30 s: the chief's sync
#: queue runner starts with its session and waits in its first take_grad for the other workers, whose sessions
#: look again for the chief's variables only after SessionManager's 30 s recovery wait; a 30 s timeout ended that
#: wait, closed the token queue and failed every worker's first step (make bench-shaped, 2026-11-29).
OPERATION_TIMEOUT_MS = 120_000


@dataclass
class Runner:
    step: Callable[[dict], tuple[float, int] | None]  # a feed -> (loss, global step) or None: the job ended
    worker_id: int
    num_workers: int
    close: Callable[[], None]
    info: dict


def _threads(workers_here: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers_here) if workers_here > 1 else 0


def _session_config(workers_here: int, **kwargs):
    import tensorflow as tf

    threads = _threads(workers_here)
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads,
                                    **kwargs)


def _feeds(graph, feed: dict) -> dict:
    return {graph.get_tensor_by_name(f"{name}:0"): value for name, value in feed.items()}


def _counted(run_one: Callable[[dict], float]) -> Callable[[dict], tuple[float, int]]:
    """A step function for systems where one call is one global step."""
    done = [0]

    def step(feed: dict) -> tuple[float, int]:
        loss = run_one(feed)
        done[0] += 1
        return loss, done[0]

    return step


def tf_single(wl: Workload, args) -> Runner:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        t = wl.build(lambda opt: opt)
        init = tf.compat.v1.global_variables_initializer()
    sess = tf.compat.v1.Session(graph=graph)
    sess.run(init)
    step = _counted(lambda feed: float(sess.run([t.loss, t.train_op], _feeds(graph, feed))[0]))
    return Runner(step, 0, 1, sess.close, {"ran_as": "single device", "processes": 1})


def parallax_job(wl: Workload, args) -> Runner:
    import numpy as np
    import tensorflow as tf

    import parallax
    from parallax.invocation import LAUNCH_ENV
    from parallax.launch.layout import layout_from_json

    graph = tf.Graph()
    with graph.as_default():
        t = wl.build(lambda opt: opt)
    config = parallax.Config(run_option=args.run_option)
    config.communication_config.mpi_config.mpirun_options = args.mpirun_options
    config.communication_config.compression = getattr(args, "compression", "none")
    config.communication_config.mpi_config.overlap = not getattr(args, "no_overlap", False)
    if getattr(args, "every_server", False):  # more than the job has: every one of its servers
        config.communication_config.ps_config.num_servers = 1 << 16
    sess, num_workers, worker_id, replicas = parallax.parallel_run(graph, args.resource_info, parallax_config=config)
    if replicas != 1:
        raise SystemExit(f"expected one replica per worker process, got {replicas}")
    launch = json.loads(os.environ.get(LAUNCH_ENV, "null"))
    info = {"ran_as": launch["job"]["layout"] if launch else "in-process",
            "processes": len(layout_from_json(launch["ranks"])) if launch else 1}
    if worker_id == 0:
        plan = parallax.preview_plan(graph, args.resource_info, True, config)
        info["estimated_bytes_per_worker"] = plan.bytes_per_worker
        info["plan"] = plan.to_dict()  # benchmarks/scale.py: the traffic model's input

    def run_one(feed: dict) -> float:
        losses, _ = sess.run([t.loss, t.train_op], {graph.get_tensor_by_name(f"{n}:0"): [v] for n, v in feed.items()})
        return float(np.mean(losses))

    return Runner(_counted(run_one), worker_id, num_workers, sess.close, info)


def tf_ps(wl: Workload, args) -> Runner:
    import tensorflow as tf
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    names = comm.allgather(socket.gethostname())
    local = len(set(names)) == 1  # all on this host: localhost (a private namespace may not resolve the name)
    # each rank picks a free port on its own host, held until every rank has one (no two get one port)
    held = socket.socket()
    held.bind(("" if not local else "localhost", 0))
    ports = comm.allgather(held.getsockname()[1])
    comm.Barrier()
    held.close()
    addresses = [f"{'localhost' if local else name}:{port}" for name, port in zip(names, ports)]
    cluster = tf.train.ClusterSpec({"ps": addresses[:1], "worker": addresses[1:]})
    workers = comm.size - 1
    if comm.rank == 0:
        tf.distribute.Server(cluster, job_name="ps", task_index=0, start=True)
        comm.Barrier()  # the workers' sessions are up (below)
        return Runner(lambda feed: None, -1, workers, comm.Barrier, {})
    task = comm.rank - 1
    config = _session_config(workers, device_filters=["/job:ps", f"/job:worker/task:{task}"],
                             operation_timeout_in_ms=OPERATION_TIMEOUT_MS)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=task, config=config, start=True)
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                worker_device=f"/job:worker/task:{task}", cluster=cluster)):
            t = wl.build(lambda opt: tf.compat.v1.train.SyncReplicasOptimizer(
                opt, replicas_to_aggregate=workers, total_num_replicas=workers))
        hook = t.optimizer.make_session_run_hook(is_chief=task == 0)
        # At the end the chief's session joins its queue runner, which waits for gradients no worker sends any
        # more: without a short grace period that wait is the coordinator's 120 s, every job.
        sess = tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=task == 0, hooks=[hook],
                                                           config=config, stop_grace_period_secs=2)
    # Every worker in before anyone trains: a non-chief session that finds the chief's variables not yet
    # initialised checks again only after 30 s (SessionManager's recovery_wait_secs), and meanwhile the chief,
    # taking every token itself (SyncReplicasOptimizer counts gradients, not workers), would train alone.
    comm.Barrier()

    def step(feed: dict) -> tuple[float, int] | None:
        # SyncReplicasOptimizer counts gradients, not workers: its users loop on the global step.
        try:
            loss, _, global_step = sess.run([t.loss, t.train_op, t.global_step], _feeds(graph, feed))
        except (tf.errors.DeadlineExceededError, tf.errors.OutOfRangeError, RuntimeError) as e:
            # the chief has stopped and no token comes (on the chief itself: say why, in the job's log)
            print(f"tf-ps worker {task}: the step ended the job: {type(e).__name__}: {str(e)[:500]}", flush=True)
            return None
        return float(loss), int(global_step)

    def close() -> None:
        try:
            sess.close()
        except Exception:  # noqa: BLE001 - a session whose chief is gone may fail to close cleanly
            pass
        comm.Barrier()

    return Runner(step, task, workers, close, {"ran_as": "TF PS", "processes": comm.size})


def horovod_job(wl: Workload, args) -> Runner:
    import horovod
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    graph = tf.Graph()
    with graph.as_default():
        t = wl.build(lambda opt: hvd.DistributedOptimizer(opt))
        init = tf.compat.v1.global_variables_initializer()
        broadcast = hvd.broadcast_global_variables(0)
    sess = tf.compat.v1.Session(graph=graph, config=_session_config(hvd.local_size()))
    sess.run(init)
    sess.run(broadcast)
    step = _counted(lambda feed: float(sess.run([t.loss, t.train_op], _feeds(graph, feed))[0]))
    return Runner(step, hvd.rank(), hvd.size(), sess.close,
                  {"ran_as": f"Horovod {horovod.__version__}", "processes": hvd.size()})


SYSTEMS = {"tf": tf_single, "parallax": parallax_job, "tf-ps": tf_ps, "horovod": horovod_job}


def run(args) -> None:
    """The body of ``compare.py job ...`` in every process of a job."""
    import logging

    import tensorflow as tf

    tf.get_logger().setLevel(logging.ERROR)
    wl = workload(args.workload, args.vocab)
    runner = SYSTEMS[args.system](wl, args)
    if runner.worker_id >= 0:
        feeds = wl.batches(runner.worker_id, runner.num_workers)
        result = timed_steps(lambda: runner.step(next(feeds)), args.warmup, args.steps)
        if runner.worker_id == 0:
            if result is None:
                raise SystemExit("the job ended before the timed steps were done")
            write_json(args.out, {**result, **runner.info, "workers": runner.num_workers,
                                  "tensorflow": tf.__version__})
    runner.close()
