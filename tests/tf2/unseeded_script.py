"""A program that seeds nothing, in the shapes of TensorFlow's tutorials (Apache-2.0; rewritten small, random data
of the real layout): "Load NumPy data" (synthetic arrays from ``np.random``, ``Dataset.from_tensor_slices``, an
unseeded ``shuffle`` before ``batch``, ``fit`` on the dataset) with a per-example map after the shuffle (the
tutorials' ``map(preprocess)``), words turned into ids through a vocabulary read from a ``set`` (its order is
Python's string hashing's), an ``Embedding`` and a ``Dense`` initialised without seeds, plain SGD (a gradient of
the wrong scale shows), 3 epochs.

``python unseeded_script.py --resource_info R --run_option M --out D``: ``parallax.fit``; each rank writes
``D/rank_<id>.json`` (History, weights, the seed its TensorFlow ran with, its ``PYTHONHASHSEED``).
``--reference SEED``: ``model.fit`` on one device, the same program with its generators seeded as a job's ranks
seed them (``parallax.member.seeds.seed_alike(SEED)`` before its imports; run it with ``PYTHONHASHSEED=SEED``):
what the job must equal."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if "--reference" in sys.argv:  # before the program imports anything, as a job's rank starts
    from parallax.member.seeds import seed_alike

    seed_alike(int(sys.argv[sys.argv.index("--reference") + 1]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tf2.scripts import parser  # noqa: E402

WORDS = "the a of to in on at by for with from up about into over after river stone light cold".split()
EXAMPLES, LENGTH, BATCH, EPOCHS = 96, 5, 16, 3


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--reference", type=int, default=None)
    args = p.parse_args()
    vocabulary = list(set(WORDS))  # the order of a set of strings: Python's string hashing
    index = {word: i for i, word in enumerate(vocabulary)}
    texts = np.random.choice(WORDS, size=(EXAMPLES, LENGTH))
    ids = np.vectorize(index.get)(texts).astype("int32")
    labels = (np.random.rand(EXAMPLES) < 0.5).astype("float32")
    weights = np.random.rand(len(vocabulary)).astype("float32")  # each word's weight, the tutorial's features

    def preprocess(example, label):
        return {"ids": example, "weights": tf.gather(weights, example)}, label

    dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).shuffle(EXAMPLES).map(preprocess).batch(BATCH)
    inputs = {"ids": keras.Input((LENGTH,), dtype="int32", name="ids"),
              "weights": keras.Input((LENGTH,), name="weights")}
    embedded = keras.layers.Embedding(len(vocabulary), 4)(inputs["ids"])
    pooled = keras.layers.GlobalAveragePooling1D()(embedded * keras.ops.expand_dims(inputs["weights"], -1))
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(pooled))
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy"])
    if args.reference is None:
        import parallax

        history = parallax.fit(model, dataset, epochs=EPOCHS, verbose=0, resource_info=args.resource_info,
                               parallax_config=parallax.Config(run_option=args.run_option, stall_timeout=30))
        rank = history.worker_id
    else:
        history, rank = model.fit(dataset, epochs=EPOCHS, verbose=0), "reference"
    from tensorflow.python.framework import random_seed

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank_{rank}.json"), "w") as f:
        json.dump({"history": history.history, "weights": [w.tolist() for w in model.get_weights()],
                   "seed": random_seed.get_seed(None)[0], "hash_seed": os.environ.get("PYTHONHASHSEED")}, f,
                  default=float)


if __name__ == "__main__":
    main()
