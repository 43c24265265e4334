"""The idioms of TensorFlow 2 training programs as axes, covered pairwise: each combination a small program
written as people write it, which trains on one device as written and, moved onto Parallax with the one-line
change, must train the same (tests/multiprocess/test_tf2_idioms.py).

Axes (:data:`AXES`); every value of every axis meets every value of every other axis in some combination
(:func:`combinations`, allpairspy), plain SGD among them (a gradient of the wrong scale, a sum for a mean, shows
under SGD where Adam hides it):

* ``layout``: where Parallax runs it (tests/multiprocess/harness.py's ``LAYOUTS``);
* ``optimizer``: Keras 3's SGD, SGD with Nesterov momentum, Adam, RMSprop, Adagrad;
* ``scaling``: none, or the optimizer inside a ``LossScaleOptimizer`` (dynamic; float32, so that the scaled
  gradients are exact);
* ``embedding``: none; a table looked up by the batch's ids; a table of positions looked up by
  ``ops.arange`` (every replica reads every row); both, as a Transformer's ``TokenAndPositionEmbedding``; a
  table with an ``embeddings_regularizer`` (a sparse gradient and a dense one);
* ``inputs``: arrays shuffled (``fit``'s default; the loop's own seeded permutation), arrays in order, a
  ``tf.data.Dataset`` reshuffled each epoch, a dict of named inputs;
* ``norm``: none, or a ``BatchNormalization(synchronized=True)`` (after a ``Dense`` without a bias: a bias the
  batch norm subtracts again has a gradient of rounding noise only, which Adam makes into full steps);
* ``front``: ``model.fit``; a ``tf.function`` step with an ``input_signature`` returning the loss, one without
  a signature (traced at its first call), one returning a dict, one returning nothing; a loop halves its
  optimizer's learning rate between epochs (``optimizer.learning_rate = ...``), which the job must train with.

A combination is named ``<optimizer>.<scaling>.<embedding>.<inputs>.<norm>.<front>`` (:func:`name_of`); its layout
is where it runs. :func:`run` trains it, on one device (``job=None``) or through Parallax, and returns every
weight of the model and the History's losses (``fit``).
"""

from __future__ import annotations

import numpy as np

AXES = {
    "layout": ["MPI-2", "PS-2", "HYBRID-2", "local-2-replicas", "MPI-3", "alone"],
    "optimizer": ["sgd", "nesterov", "adam", "rmsprop", "adagrad"],
    "scaling": ["none", "lso"],
    "embedding": ["none", "ids", "positions", "ids+positions", "regularised"],
    "inputs": ["shuffled", "ordered", "dataset", "dict"],
    "norm": ["none", "synchronized"],
    "front": ["fit", "step", "traced", "step-dict", "step-none"],
}
EXAMPLES, BATCH, EPOCHS, LENGTH, VOCAB = 48, 12, 2, 4, 12
#: The embeddings whose table HYBRID keeps on a server (the batch's ids look it up, a sparse gradient): the programs
#: with one are one job of workers and servers, the others one of workers alone (HYBRID runs them as MPI)
TABLES = ("ids", "ids+positions")


def combinations() -> list[dict]:
    """The pairwise cover of :data:`AXES`, each combination a dict of axis -> value (allpairspy's, in its
    order: the same list on every run)."""
    from allpairspy import AllPairs

    names = list(AXES)
    return [dict(zip(names, values)) for values in AllPairs([AXES[n] for n in names])]


def name_of(combination: dict) -> str:
    return ".".join(combination[axis] for axis in list(AXES)[1:])


def parse(name: str) -> dict:
    return dict(zip(list(AXES)[1:], name.split(".")))


def _data(idiom: dict):
    rng = np.random.RandomState(11)
    x = rng.randn(EXAMPLES, 3).astype(np.float32)
    ids = rng.randint(0, VOCAB, (EXAMPLES, LENGTH)).astype(np.int32)
    y = (x @ np.array([[0.5], [-1.0], [0.25]], np.float32) + 0.1 * ids[:, :1]).astype(np.float32)
    if idiom["embedding"] == "none":
        inputs = {"x": x}
    else:
        inputs = {"ids": ids, "x": x}
    return inputs, y


def _model(idiom: dict):
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(5)
    x = keras.Input((3,), name="x")
    named = {"x": x}
    if idiom["norm"] == "synchronized":
        h = layers.Activation("tanh")(layers.BatchNormalization(synchronized=True)(layers.Dense(4, use_bias=False)(x)))
    else:
        h = layers.Dense(4, activation="tanh")(x)
    kind = idiom["embedding"]
    if kind != "none":
        ids = keras.Input((LENGTH,), dtype="int32", name="ids")
        named["ids"] = ids
        regulariser = keras.regularizers.l2(1e-3) if kind == "regularised" else None
        tokens = layers.Embedding(VOCAB, 4, embeddings_regularizer=regulariser)(ids)
        if "positions" in kind:
            positions = layers.Embedding(LENGTH, 4)(ops.arange(0, LENGTH))
            sequence = tokens + positions if kind == "ids+positions" else ops.expand_dims(h, 1) + positions
        else:
            sequence = tokens
        h = h + ops.mean(sequence, axis=1)
    output = layers.Dense(1)(h)
    inputs = named if idiom["inputs"] == "dict" else [named[k] for k in sorted(named)]
    return keras.Model(inputs, output)


def _optimizer(idiom: dict):
    import keras

    made = {"sgd": lambda: keras.optimizers.SGD(0.05), "nesterov": lambda: keras.optimizers.SGD(0.05, 0.9, True),
            "adam": lambda: keras.optimizers.Adam(0.01), "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
            "adagrad": lambda: keras.optimizers.Adagrad(0.1)}[idiom["optimizer"]]()
    return keras.optimizers.LossScaleOptimizer(made) if idiom["scaling"] == "lso" else made


def _arranged(idiom: dict, inputs: dict):
    return inputs if idiom["inputs"] == "dict" else tuple(inputs[k] for k in sorted(inputs))


def _epochs(idiom: dict, inputs: dict, y: np.ndarray):
    """The loop's global batches ``(inputs, targets)``, epoch by epoch, as the program draws them."""
    import tensorflow as tf

    if idiom["inputs"] == "dataset":
        dataset = tf.data.Dataset.from_tensor_slices((_arranged(idiom, inputs), y)).shuffle(
            EXAMPLES, seed=3, reshuffle_each_iteration=True).batch(BATCH)
        for _ in range(EPOCHS):
            yield [(tf.nest.map_structure(np.asarray, xb), yb.numpy()) for xb, yb in dataset]
        return
    for epoch in range(EPOCHS):
        order = np.random.RandomState(epoch).permutation(EXAMPLES) if idiom["inputs"] == "shuffled" \
            else np.arange(EXAMPLES)
        yield [(_arranged(idiom, {k: v[order[s:s + BATCH]] for k, v in inputs.items()}), y[order[s:s + BATCH]])
               for s in range(0, EXAMPLES, BATCH)]


def _step(idiom: dict, model, optimizer, inputs: dict):
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.MeanSquaredError()

    def body(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) + sum(model.losses)
            scaled = optimizer.scale_loss(loss) if idiom["scaling"] == "lso" else loss
        optimizer.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
        return loss

    front = idiom["front"]
    if front == "traced":
        return tf.function(body)
    specs = {k: tf.TensorSpec([None, *v.shape[1:]], tf.as_dtype(v.dtype)) for k, v in inputs.items()}
    signature = [_arranged(idiom, specs), tf.TensorSpec([None, 1], tf.float32)]
    if front == "step-dict":
        return tf.function(lambda x, y: {"loss": body(x, y), "examples": tf.shape(y)[0]}, input_signature=signature)
    if front == "step-none":
        def silent(x, y):
            body(x, y)
        return tf.function(silent, input_signature=signature)
    return tf.function(body, input_signature=signature)


def _parts(value, own: range, pieces: int):
    """This process's replicas' parts of a global batch, as a step takes them: of ``pieces`` equal parts, those
    in ``own``, a list of them at each tensor of the batch's structure."""
    import tensorflow as tf

    return tf.nest.map_structure(lambda a: [a[k * len(a) // pieces:(k + 1) * len(a) // pieces] for k in own], value)


def run(name: str, job: dict | None = None) -> tuple[list, list]:
    """Train combination ``name`` on one device as written (``job=None``), or through Parallax: ``job`` has
    ``resource_info`` and ``config`` (a ``parallax.Config``). Returns every weight of the model (the process's
    own, after training) and the History's losses (``fit``; ``[]`` for a loop)."""
    idiom = parse(name)
    inputs, y = _data(idiom)
    model = _model(idiom)
    optimizer = _optimizer(idiom)
    if idiom["front"] == "fit":
        model.compile(optimizer=optimizer, loss="mse")
        if idiom["inputs"] == "dataset":
            import tensorflow as tf

            source = dict(x=tf.data.Dataset.from_tensor_slices((_arranged(idiom, inputs), y)).shuffle(
                EXAMPLES, seed=3, reshuffle_each_iteration=True).batch(BATCH))
        else:
            source = dict(x=_arranged(idiom, inputs), y=y, batch_size=BATCH, shuffle=idiom["inputs"] == "shuffled")
        if job is None:
            history = model.fit(**source, epochs=EPOCHS, verbose=0)
        else:
            import parallax

            history = parallax.fit(model, **source, epochs=EPOCHS, verbose=0, resource_info=job["resource_info"],
                                   parallax_config=job["config"])
        return [v.numpy() for v in model.weights], history.history["loss"]
    step = _step(idiom, model, optimizer, inputs)
    if job is not None:
        import parallax

        step, workers, worker, replicas = parallax.parallel_run(step, job["resource_info"],
                                                                parallax_config=job["config"])
        pieces = workers * replicas
    for epoch, batches in enumerate(_epochs(idiom, inputs, y)):
        if epoch:  # the loop's own decay of the rate between epochs, set on the program's optimizer
            optimizer.learning_rate = float(optimizer.learning_rate) * 0.5
        for xb, yb in batches:
            if job is None:
                step(xb, yb)
            else:
                own = range(worker * replicas, (worker + 1) * replicas)
                step(_parts(xb, own, pieces), _parts(yb, own, pieces))
    if job is not None:
        step.close()
    return [v.numpy() for v in model.weights], []
