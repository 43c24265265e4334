"""A program that prepares its data as Keras 3's ``get_file(extract=True)`` does, on every run: it writes the
file again (in pieces, as an archive is extracted), then reads it, then trains a ``tf.function`` step with
``parallel_run``. Every process appends what it does, and when, to ``OUT/events``; each rank writes the digest
of the data it read to ``OUT/rank_<worker>.json``. ``--together`` sets ``Config(staggered_start=False)``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def event(out: str, what: str) -> None:
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "launcher")
    with open(os.path.join(out, "events"), "a") as f:
        f.write(f"{time.time():.6f} {what} {rank}\n")


def prepare(out: str) -> int:
    """Write the data file again, in pieces, and read it back: the digest of what was read."""
    path = os.path.join(out, "data.bin")
    with open(path, "wb") as f:
        for piece in range(20):
            f.write(bytes([piece]) * 4096)
            f.flush()
            time.sleep(0.01)
    with open(path, "rb") as f:
        return zlib.crc32(f.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resource_info", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--together", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    event(args.out, "start")
    digest = prepare(args.out)
    import numpy as np
    import tensorflow as tf

    import parallax

    weight = tf.Variable(1.0)
    optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(weight * x)
        optimizer.apply_gradients([(tape.gradient(loss, weight), weight)])
        return loss

    event(args.out, "call")
    config = parallax.Config(run_option="MPI", staggered_start=not args.together)
    run, _, worker, _ = parallax.parallel_run(step, args.resource_info, parallax_config=config)
    run([np.array([1.0, 2.0], np.float32)])
    run.close()
    with open(os.path.join(args.out, f"rank_{worker}.json"), "w") as f:
        json.dump({"digest": digest}, f)


if __name__ == "__main__":
    main()
