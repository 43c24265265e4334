"""A TensorFlow 2 custom training loop (Keras 3 model, ``tf.GradientTape`` in a ``tf.function``), trained
data-parallel by Parallax.

The program is what one writes for one device: a model with an embedding, an optimizer, a training step
with an input signature. Only the ``parallel_run`` call and the per-worker slice of each batch are
Parallax. Run it with::

    python examples/tf_function/custom_loop.py --resource_info resource_info.example
    python examples/tf_function/custom_loop.py --run_option HYBRID   # the embedding on a parameter server

It learns which of 50 words make a sentence positive, and checks that every worker's trained weights
equal those of the same loop run eagerly on one device (``--check``, on by default).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

VOCAB, LENGTH = 50, 8


def data(steps: int, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sentences of word ids; a sentence is positive when most of its words are below VOCAB / 2."""
    rng = np.random.RandomState(0)
    out = []
    for _ in range(steps):
        ids = rng.randint(0, VOCAB, (batch, LENGTH)).astype(np.int32)
        out.append((ids, (np.mean(ids < VOCAB // 2, axis=1, keepdims=True) > 0.5).astype(np.float32)))
    return out


def build(learning_rate: float):
    """The single-device program: model, optimizer and training step."""
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.layers.Input((LENGTH,), dtype="int32"), keras.layers.Embedding(VOCAB, 8),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(learning_rate)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, LENGTH], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def train_step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return model, train_step


def accuracy(model, batches) -> float:
    ids = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    return float(np.mean((model(ids).numpy() > 0) == (labels > 0.5)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--run_option", default="MPI", help="PS, MPI, HYBRID or AUTO")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch_size", type=int, default=32, help="the global batch, split over the replicas")
    parser.add_argument("--learning_rate", type=float, default=0.02)
    parser.add_argument("--no_check", dest="check", action="store_false",
                        help="skip the comparison with eager training on one device")
    args = parser.parse_args()

    batches = data(args.steps, args.batch_size)
    model, train_step = build(args.learning_rate)
    config = parallax.Config(run_option=args.run_option)
    step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                       parallax_config=config)
    parts = num_workers * num_replicas
    mine = slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)  # this worker's replicas' slices
    for i, (ids, labels) in enumerate(batches):
        losses = step(np.split(ids, parts)[mine], np.split(labels, parts)[mine])
        if worker_id == 0 and (i + 1) % 50 == 0:
            print(f"step {i + 1}: loss {float(np.mean(losses)):.4f}", flush=True)
    step.close()  # the trained values are now in the model's own variables
    held_out = data(5, 64)
    print(f"worker {worker_id} of {num_workers}: held-out accuracy {100 * accuracy(model, held_out):.1f}%",
          flush=True)
    if args.check:
        reference, reference_step = build(args.learning_rate)
        for ids, labels in batches:
            reference_step(ids, labels)
        worst = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                    for a, b in zip(model.trainable_variables, reference.trainable_variables))
        print(f"worker {worker_id}: largest difference from eager training on one device {worst:.2e}", flush=True)


if __name__ == "__main__":
    main()
