"""PS mode vs TensorFlow's own parameter servers, on the same model, in one run.

    python benchmarks/ps.py          # writes benchmarks/results/ps.{json,png}

Both jobs: 2 workers and 1 parameter server on this machine, synchronous
training of the same MLP with momentum, the same batch per worker.

* Parallax: ``parallel_run(graph, resources, parallax_config=Config(run_option="PS"))``
  on the unchanged single-device graph.
* TensorFlow: the model built under ``tf.compat.v1.train.replica_device_setter``
  with ``SyncReplicasOptimizer(replicas_to_aggregate=2)`` and its session hook,
  by hand, as a TensorFlow user would.

Reported: steps/s and examples/s of worker 0 after a warm-up, and the start-up
time until the first step finished.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, batch, mlp, read_json, write_json  # noqa: E402

WARMUP = 5


def parallax_job(resource: str, out: str, steps: int, size: int, started: float) -> None:
    import tensorflow as tf

    import parallax

    graph = tf.Graph()
    with graph.as_default():
        x, y, loss = mlp()
        train = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
    sess, num_workers, worker_id, replicas = parallax.parallel_run(
        graph, resource, parallax_config=parallax.Config(run_option="PS"))
    xs, ys = batch(worker_id, size)
    feed = {x: [xs] * replicas, y: [ys] * replicas}
    _time_steps(lambda: sess.run(train, feed_dict=feed), worker_id, num_workers, out, steps, size, started)


def native_job(out: str, steps: int, size: int, started: float) -> None:
    import socket

    import tensorflow as tf
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    addresses = comm.allgather(f"localhost:{port}")
    cluster = tf.train.ClusterSpec({"ps": addresses[:1], "worker": addresses[1:]})
    if comm.rank == 0:
        tf.distribute.Server(cluster, job_name="ps", task_index=0, start=True)
        comm.Barrier()
        return
    task = comm.rank - 1
    # SyncReplicasOptimizer counts gradients, not workers: a worker can still be waiting
    # for a token when the chief has stopped. The timeout lets it give up then.
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task}"],
                                      operation_timeout_in_ms=20000)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=task, config=config, start=True)
    workers = comm.size - 1
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                worker_device=f"/job:worker/task:{task}", cluster=cluster)):
            x, y, loss = mlp()
            step = tf.compat.v1.train.get_or_create_global_step()
            opt = tf.compat.v1.train.SyncReplicasOptimizer(
                tf.compat.v1.train.MomentumOptimizer(0.01, 0.9), replicas_to_aggregate=workers,
                total_num_replicas=workers)
            train = opt.minimize(loss, global_step=step)
        hook = opt.make_session_run_hook(is_chief=task == 0)
        sess = tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=task == 0,
                                                           hooks=[hook], config=config)
    xs, ys = batch(task, size)
    # Run by the global step (the chief's updates), as SyncReplicasOptimizer users must.
    target, marks = WARMUP + steps + 1, {}
    value = 0
    while value < target:
        try:
            _, value = sess.run([train, step], feed_dict={x: xs, y: ys})
        except (tf.errors.DeadlineExceededError, tf.errors.OutOfRangeError):  # the chief has stopped
            break
        if value == 1 and "first" not in marks:
            marks["first"] = time.time() - started
        for mark in (WARMUP, WARMUP + steps):
            if value >= mark and mark not in marks:
                marks[mark] = time.perf_counter()
    if task == 0:
        seconds = marks[WARMUP + steps] - marks[WARMUP]
        write_json(out, {"steps_per_s": steps / seconds, "examples_per_s": steps * size * workers / seconds,
                         "startup_s": marks.get("first", 0.0), "workers": workers, "batch_per_worker": size})
    comm.Barrier()


def _time_steps(run_step, worker_id, num_workers, out, steps, size, started) -> None:
    run_step()
    first_step = time.time() - started
    for _ in range(WARMUP):
        run_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        run_step()
    seconds = time.perf_counter() - t0
    if worker_id == 0:
        write_json(out, {"steps_per_s": steps / seconds, "examples_per_s": steps * size * num_workers / seconds,
                         "startup_s": first_step, "workers": num_workers, "batch_per_worker": size})


def _plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, [results[n]["steps_per_s"] for n in names], color=["tab:blue", "tab:gray"])
    left.set_ylabel("steps / s (worker 0)")
    left.set_title("Synchronous PS, 2 workers + 1 server, localhost")
    right.bar(names, [results[n]["startup_s"] for n in names], color=["tab:blue", "tab:gray"])
    right.set_ylabel("seconds to the first step")
    right.set_title("Start-up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", choices=["parallax", "native"])
    parser.add_argument("--resource_info")
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--started", type=float, default=0.0)
    args = parser.parse_args()
    if args.job == "parallax":
        return parallax_job(args.resource_info, args.out, args.steps, args.batch, args.started)
    if args.job == "native":
        return native_job(args.out, args.steps, args.batch, args.started)

    from parallax.launch.launcher import launch
    from parallax.launch.layout import ranks_per_device
    from parallax.resources import parse_resource_text

    work = tempfile.mkdtemp(prefix="parallax_bench_ps_")
    me = os.path.abspath(__file__)
    results = {}
    print("Parallax PS mode: 2 workers + 1 server ...", flush=True)
    resource = os.path.join(work, "resources")
    with open(resource, "w") as f:
        f.write("localhost: cpu:0\nlocalhost: cpu:1\n")
    out = os.path.join(work, "parallax.json")
    subprocess.run([sys.executable, me, "parallax", "--resource_info", resource, "--out", out,
                    "--steps", str(args.steps), "--batch", str(args.batch), "--started", repr(time.time())],
                   check=True, cwd=work)
    results["Parallax PS"] = read_json(out)
    print("TensorFlow replica_device_setter + SyncReplicasOptimizer ...", flush=True)
    out = os.path.join(work, "native.json")
    ranks = ranks_per_device(parse_resource_text("localhost: cpu:0,cpu:1,cpu:2\n"))
    result = launch(ranks, "MPI", [me, "native", "--out", out, "--steps", str(args.steps), "--batch",
                                   str(args.batch), "--started", repr(time.time())])
    if result.returncode != 0:
        raise SystemExit(f"native job failed: {result.failure}")
    results["TF SyncReplicas"] = read_json(out)
    ratio = results["Parallax PS"]["steps_per_s"] / results["TF SyncReplicas"]["steps_per_s"]
    data = {"results": results, "parallax_over_tf_steps": ratio}
    write_json(os.path.join(RESULTS, "ps.json"), data)
    _plot(results, os.path.join(RESULTS, "ps.png"))
    for name, r in results.items():
        print(f"{name:>16}: {r['steps_per_s']:.1f} steps/s, {r['examples_per_s']:.0f} examples/s, "
              f"first step after {r['startup_s']:.1f} s")
    print(f"Parallax / TensorFlow steps/s: {ratio:.2f}")
    print(f"wrote {os.path.join(RESULTS, 'ps.json')} and {os.path.join(RESULTS, 'ps.png')}")


if __name__ == "__main__":
    main()
