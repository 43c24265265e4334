"""A Keras 3 model with a batch normalisation (Dense -> BatchNormalization -> Dense, SGD: a gradient of the wrong
scale shows) trained by a ``tf.function`` step, as a task of a job a cluster manager starts runs it
(tests/multiprocess/test_tf_config_sync_batch_norm.py):

    python sync_batch_norm_script.py --resource_info R --out D --steps S --batch B \\
        [--run_option default|MPI|PS] [--norm synchronized|plain] [--sync_batch_norm]

Each worker trains its part of every global batch (the global batch split into as many equal parts as the job
has replicas, its own replicas' parts) and writes the losses it saw (one per step and replica) and every weight of
its model after ``step.close()`` (the batch norm's moving mean and variance among them) to ``D/rank_<worker_id>.npz``,
and what ``parallel_run`` returned to ``D/started_<worker_id>``. :func:`train` with ``job=None`` is the same
program on one device, on the union batch."""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


def batches(steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` global batches of ``batch`` examples: ``x`` of shape ``(steps, batch, 4)``, ``y`` ``(steps,
    batch, 1)``. The second half of each batch is shifted, so that each worker's part has statistics of its own
    (a batch norm that normalised each part alone would train differently)."""
    rng = np.random.RandomState(0)
    x = (rng.normal(size=(steps, batch, 4)) * 3 + 1).astype("float32")
    x[:, batch // 2:] += 2.0
    y = rng.normal(size=(steps, batch, 1)).astype("float32")
    return x, y


def build(norm: str):
    """The model (``norm``: ``synchronized``, a ``BatchNormalization(synchronized=True)``; ``plain``, one built
    without) and its training step, which returns the loss."""
    import keras

    from tests.tf2.programs import squared_error_step

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization(synchronized=norm == "synchronized", momentum=0.5,
                                                              name="norm"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)
    return model, squared_error_step(model, optimizer)


def train(norm: str, steps: int, batch: int, job: dict | None = None):
    """Train on one device on the whole global batches (``job=None``), or through ``parallel_run`` (``job``:
    ``resource_info``, ``config``). Returns ``(losses, weights, ids)``: the losses of each step (one per replica
    of this process), every weight of the model after training (by name), and what ``parallel_run`` returned."""
    model, step = build(norm)
    x, y = batches(steps, batch)
    ids = {"num_workers": 1, "worker_id": 0, "num_replicas": 1}
    if job is not None:
        import parallax

        step, workers, worker, replicas = parallax.parallel_run(step, job["resource_info"],
                                                                parallax_config=job["config"])
        ids = {"num_workers": workers, "worker_id": worker, "num_replicas": replicas}
    losses = []
    for k in range(steps):
        if job is None:
            losses.append([float(step(x[k], y[k]))])
            continue
        pieces = ids["num_workers"] * ids["num_replicas"]
        mine = slice(ids["worker_id"] * ids["num_replicas"], (ids["worker_id"] + 1) * ids["num_replicas"])
        losses.append([float(v) for v in step(np.split(x[k], pieces)[mine], np.split(y[k], pieces)[mine])])
    if job is not None:
        step.close()
    return np.array(losses, np.float64), {v.path: v.numpy() for v in model.weights}, ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--resource_info", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--run_option", default="default", help="'default': Config's own default (None)")
    p.add_argument("--norm", choices=["synchronized", "plain"], default="synchronized")
    p.add_argument("--sync_batch_norm", action="store_true", help="parallax.Config(sync_batch_norm=True)")
    args = p.parse_args()

    import parallax

    config = parallax.Config(run_option=None if args.run_option == "default" else args.run_option,
                             sync_batch_norm=args.sync_batch_norm, stall_timeout=60)
    losses, weights, ids = train(args.norm, args.steps, args.batch,
                                 {"resource_info": args.resource_info, "config": config})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"started_{ids['worker_id']}"), "w") as f:
        json.dump({**ids, "mpi": "mpi4py.MPI" in sys.modules}, f)
    np.savez(os.path.join(args.out, f"rank_{ids['worker_id']}.npz"), losses=losses,
             names=np.array(list(weights)), **{f"v{i}": w for i, w in enumerate(weights.values())})
    print(f"rank {ids['worker_id']} of {ids['num_workers']} done", flush=True)


if __name__ == "__main__":
    main()
