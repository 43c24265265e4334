"""A compiled Keras 3 model with an embedding, trained by ``parallax.fit`` as ``model.fit`` trains it, then
evaluated by ``parallax.evaluate`` and asked for predictions by ``parallax.predict``, each worker taking its
share of the test reviews.

HYBRID by default: the embedding's sparse gradients go to a parameter server, the dense layers are
all-reduced. Run it with::

    python examples/keras/fit_embedding.py --resource_info resource_info.example
    python examples/keras/fit_embedding.py --run_option MPI

It learns which of 1,000 words make a review positive, prints Keras's progress bar on worker 0, and
checks that every worker's History and weights equal ``model.fit`` of the same model on one device, and
that the sharded evaluation and predictions equal ``model.evaluate`` / ``model.predict`` (``--no_check``
skips that).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import parallax  # noqa: E402

VOCAB, LENGTH = 1000, 12


def reviews(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Word ids; a review is positive when most of its words are in the first half of the vocabulary."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, (n, LENGTH)).astype(np.int32)
    return ids, (np.mean(ids < VOCAB // 2, axis=1, keepdims=True) > 0.5).astype(np.float32)


def build(learning_rate: float) -> keras.Model:
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.layers.Input((LENGTH,), dtype="int32"), keras.layers.Embedding(VOCAB, 16),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--run_option", default="HYBRID", help="PS, MPI, HYBRID or AUTO")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=64, help="the global batch, split over the replicas")
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--no_check", dest="check", action="store_false")
    args = parser.parse_args()

    x, y = reviews(2048, 0)
    validation = reviews(256, 1)
    model = build(args.learning_rate)
    config = parallax.Config(run_option=args.run_option)
    history = parallax.fit(model, x, y, batch_size=args.batch_size, epochs=args.epochs, validation_data=validation,
                           resource_info=args.resource_info, parallax_config=config)
    worker = history.worker_id
    print(f"worker {worker} of {history.num_workers}: val_accuracy "
          f"{100 * history.history['val_accuracy'][-1]:.1f}%", flush=True)
    test_x, test_y = reviews(1000, 2)  # 1,000 reviews in batches of 64: the last batch is short
    loss, accuracy = parallax.evaluate(model, test_x, test_y, batch_size=args.batch_size, verbose=0)
    probabilities = parallax.predict(model, test_x, batch_size=args.batch_size, verbose=0)
    print(f"worker {worker}: test accuracy {100 * accuracy:.1f}%, {len(probabilities)} predictions", flush=True)
    if args.check:  # this worker's model alone on all the test reviews
        alone = model.evaluate(test_x, test_y, batch_size=args.batch_size, verbose=0)
        gap = max(abs(loss - alone[0]) / abs(alone[0]), abs(accuracy - alone[1]),
                  float(np.max(np.abs(probabilities - model.predict(test_x, batch_size=args.batch_size, verbose=0)))))
        print(f"worker {worker}: largest difference of the sharded evaluation and predictions from model.evaluate "
              f"and model.predict {gap:.2e}", flush=True)
        reference = build(args.learning_rate)  # model.fit on one device, as written: Keras's own shuffle
        reference.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, validation_data=validation, verbose=0)
        worst = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                    for a, b in zip(model.trainable_variables, reference.trainable_variables))
        print(f"worker {worker}: largest difference from model.fit on one device {worst:.2e}", flush=True)


if __name__ == "__main__":
    main()
