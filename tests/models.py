"""Small single-device graphs shared by the tests, each built in a fresh tf.Graph, and a Keras model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

OPTIMIZERS = {  # name -> (class, learning rate, extra arguments)
    "gd": (tf.compat.v1.train.GradientDescentOptimizer, 0.1, {}),
    "momentum": (tf.compat.v1.train.MomentumOptimizer, 0.05, {"momentum": 0.9}),
    "adam": (tf.compat.v1.train.AdamOptimizer, 0.01, {}),
    "adagrad": (tf.compat.v1.train.AdagradOptimizer, 0.1, {}),
    "rmsprop": (tf.compat.v1.train.RMSPropOptimizer, 0.01, {}),
    "adadelta": (tf.compat.v1.train.AdadeltaOptimizer, 1.0, {}),
    "ftrl": (tf.compat.v1.train.FtrlOptimizer, 0.1, {}),
}

VOCAB = 20
FEATURES = 4


@dataclass
class Model:
    graph: tf.Graph
    inputs: dict[str, tf.Tensor]
    loss: tf.Tensor
    train_op: tf.Operation
    variables: list = field(default_factory=list)
    schedule: list = field(default_factory=list)  # training ops run in turn, one a step (default: train_op)
    initializer: tf.Operation | None = None  # a tf.data iterator's: the model reads no feeds

    def step_op(self, step: int) -> tf.Operation:
        """The training op of step ``step``."""
        return self.schedule[step % len(self.schedule)] if self.schedule else self.train_op


def _init(shape, seed):
    return tf.compat.v1.constant_initializer(np.random.RandomState(seed).uniform(-0.5, 0.5, shape))


def build_mlp(optimizer: str = "gd", resource: bool = True, clip: float | None = None,
              global_step: bool = True, lr_scale: float = 1.0) -> Model:
    """Dense model: x[?, 4] -> relu(8) -> 1, mean squared error."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        w1 = tf.compat.v1.get_variable("dense/kernel", [FEATURES, 8], initializer=_init([FEATURES, 8], 1),
                                       use_resource=resource)
        b1 = tf.compat.v1.get_variable("dense/bias", [8], initializer=_init([8], 2), use_resource=resource)
        w2 = tf.compat.v1.get_variable("out/kernel", [8, 1], initializer=_init([8, 1], 3),
                                       use_resource=resource)
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        pred = tf.matmul(h, w2)
        loss = tf.reduce_mean(tf.square(pred - y), name="loss")
        train_op = _train(loss, optimizer, clip, global_step, lr_scale)
    return Model(graph, {"x": x, "y": y}, loss, train_op)


def build_embedding(optimizer: str = "gd", resource: bool = True, clip: float | None = None,
                    global_step: bool = True, dense_part: bool = True, lr_scale: float = 1.0,
                    sparse_lr_scale: float = 1.0) -> Model:
    """Sparse model: ids[?] -> embedding(20, 4) -> (dense 4 -> 1) -> squared error."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        emb = tf.compat.v1.get_variable("embedding", [VOCAB, FEATURES],
                                        initializer=_init([VOCAB, FEATURES], 4), use_resource=resource)
        rows = tf.nn.embedding_lookup(emb, ids)
        if dense_part:
            w = tf.compat.v1.get_variable("proj/kernel", [FEATURES, 1], initializer=_init([FEATURES, 1], 5),
                                          use_resource=resource)
            pred = tf.matmul(rows, w)
        else:
            pred = tf.reduce_sum(rows, axis=1, keepdims=True)
        loss = tf.reduce_mean(tf.square(pred - y), name="loss")
        train_op = _train(loss, optimizer, clip, global_step, lr_scale, sparse_lr_scale)
    return Model(graph, {"ids": ids, "y": y}, loss, train_op)


def _train(loss, optimizer, clip, global_step, lr_scale, sparse_lr_scale=1.0):
    step = tf.compat.v1.train.get_or_create_global_step() if global_step else None
    cls, lr, kwargs = OPTIMIZERS[optimizer]
    opt = cls(lr * lr_scale, **kwargs)
    grads_and_vars = opt.compute_gradients(loss)
    if sparse_lr_scale != 1.0:  # sparse gradients scaled (plain GD: the same as a larger learning rate for them)
        grads_and_vars = [(tf.IndexedSlices(g.values * sparse_lr_scale, g.indices, g.dense_shape), v)
                          if isinstance(g, tf.IndexedSlices) else (g, v) for g, v in grads_and_vars]
    if clip is not None:
        grads, variables = zip(*grads_and_vars)
        grads, _ = tf.clip_by_global_norm(grads, clip)
        grads_and_vars = list(zip(grads, variables))
    return opt.apply_gradients(grads_and_vars, global_step=step)


def batches(model_name: str, steps: int, batch: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Deterministic union batches for ``steps`` steps."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(steps):
        if model_name == "mlp":
            out.append({"x": rng.randn(batch, FEATURES).astype(np.float32),
                        "y": rng.randn(batch, 1).astype(np.float32)})
        else:
            out.append({"ids": rng.randint(0, VOCAB, batch).astype(np.int64),
                        "y": rng.randn(batch, 1).astype(np.float32)})
    return out


def variable_values(sess, graph: tf.Graph) -> dict[str, np.ndarray]:
    """Every global variable's value by op name, through a plain tf session."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    return dict(zip([v.op.name for v in variables], sess.run(variables)))


def train_single_device(model: Model, data: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step, feed in enumerate(data):
            sess.run(model.step_op(step), {model.inputs[k]: v for k, v in feed.items()})
        return variable_values(sess, model.graph)


def loss_on(model: Model, values: dict[str, np.ndarray], data: list[dict[str, np.ndarray]]) -> float:
    """``model.loss`` on every batch of ``data`` at once, with its variables set to ``values`` (by op name)."""
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as sess:
        for variable in model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            variable.load(values[variable.op.name], sess)
        feed = {model.inputs[k]: np.concatenate([batch[k] for batch in data]) for k in data[0]}
        return float(sess.run(model.loss, feed))


APPLIED = "applied_gradients"


def count_applied_gradients(model: Model) -> Model:
    """``model`` with a count of the training steps whose updates were applied.

    After each training op (each op of a schedule: the ``k``-th), a gradient descent optimizer with learning
    rate 1 and ``use_locking`` minimises ``-applied_gradients/<k>``, a scalar variable: each step adds exactly
    1 to it (its gradient is -1), wherever it lives (on a server in PS, where every worker's updates land),
    and concurrent workers' additions are never lost (an exclusive lock). :func:`applied_gradients` sums them.
    """
    with model.graph.as_default():
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(1.0, use_locking=True)

        def counted(k: int, op: tf.Operation) -> tf.Operation:
            counter = tf.compat.v1.get_variable(f"{APPLIED}/{k}", [], initializer=tf.compat.v1.zeros_initializer(),
                                                use_resource=True)
            with tf.control_dependencies([op]):
                return optimizer.minimize(tf.negative(counter), var_list=[counter], name=f"{APPLIED}/count_{k}")

        schedule = [counted(k, op) for k, op in enumerate(model.schedule)]
        train_op = schedule[0] if schedule else counted(0, model.train_op)
    return Model(model.graph, model.inputs, model.loss, train_op, model.variables, schedule, model.initializer)


def applied_gradients(values: dict[str, np.ndarray]) -> int:
    """The number of training steps whose updates were applied, from the variables of a model made by
    :func:`count_applied_gradients`."""
    counts = [value for name, value in values.items() if name.startswith(APPLIED + "/")]
    assert counts, f"no {APPLIED}/<k> variable: was the model made by count_applied_gradients?"
    return int(round(float(sum(counts))))


def build_sequence(optimizer: str = "adam", partitions: int | None = None, loop: bool = True) -> Model:
    """Sequence model: ids[?, 5] -> embedding (optionally partitioned with
    parallax.get_partitioner) -> a tanh RNN written with tf.while_loop -> 1.
    The learning rate decays with the global step (a shared hyper-parameter)."""
    import parallax

    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 5], name="ids")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        partitioner = parallax.get_partitioner(partitions) if partitions else None
        emb = tf.compat.v1.get_variable("embedding", [VOCAB, FEATURES], partitioner=partitioner,
                                        initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=6))
        rows = tf.nn.embedding_lookup(emb, ids)
        if loop:
            u = tf.compat.v1.get_variable("rnn/u", [FEATURES, 6], initializer=_init([FEATURES, 6], 7))
            v = tf.compat.v1.get_variable("rnn/v", [6, 6], initializer=_init([6, 6], 8))

            def body(t, h):
                return t + 1, tf.tanh(tf.matmul(rows[:, t, :], u) + tf.matmul(h, v))

            _, h = tf.while_loop(lambda t, h: t < 5, body, [tf.constant(0), tf.zeros([tf.shape(rows)[0], 6])])
        else:
            h = tf.reduce_sum(rows, 1)
        w = tf.compat.v1.get_variable("out/kernel", [h.shape[-1], 1], initializer=_init([h.shape[-1], 1], 9))
        loss = tf.reduce_mean(tf.square(tf.matmul(h, w) - y), name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        lr = tf.compat.v1.train.exponential_decay(0.05, step, 2, 0.5)
        cls, _, kwargs = OPTIMIZERS[optimizer]
        train_op = cls(lr, **kwargs).minimize(loss, global_step=step)
    return Model(graph, {"ids": ids, "y": y}, loss, train_op)


def sequence_batches(steps: int, batch: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.RandomState(seed)
    return [{"ids": rng.randint(0, VOCAB, (batch, 5)).astype(np.int64),
             "y": rng.randn(batch, 1).astype(np.float32)} for _ in range(steps)]


def build_deep_mlp(optimizer: str = "adam", layers: int = 6, clip: float | None = None) -> Model:
    """A deep MLP, each layer in a scope of its own (``layer_<i>``): x[?, 4] -> 6 x tanh(16) -> 1."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        h = x
        for i in range(layers):
            with tf.compat.v1.variable_scope(f"layer_{i}"):
                width = int(h.shape[-1])
                w = tf.compat.v1.get_variable("kernel", [width, 16], initializer=_init([width, 16], 20 + i))
                b = tf.compat.v1.get_variable("bias", [16], initializer=_init([16], 40 + i))
                h = tf.tanh(tf.matmul(h, w) + b)
        with tf.compat.v1.variable_scope("head"):
            w = tf.compat.v1.get_variable("kernel", [16, 1], initializer=_init([16, 1], 60))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w) - y), name="loss")
        train_op = _train(loss, optimizer, clip, True, 1.0)
    return Model(graph, {"x": x, "y": y}, loss, train_op)


def _batch_norm(h, channels: int):
    """Batch norm as ``tf.compat.v1.layers.batch_normalization(training=True)`` builds it (that API is
    gone with Keras 3): batch statistics, a learned scale and offset, moving statistics in ``UPDATE_OPS``."""
    gamma = tf.compat.v1.get_variable("gamma", [channels], initializer=tf.compat.v1.ones_initializer())
    beta = tf.compat.v1.get_variable("beta", [channels], initializer=tf.compat.v1.zeros_initializer())
    moving_mean = tf.compat.v1.get_variable("moving_mean", [channels], trainable=False,
                                            initializer=tf.compat.v1.zeros_initializer())
    moving_var = tf.compat.v1.get_variable("moving_variance", [channels], trainable=False,
                                           initializer=tf.compat.v1.ones_initializer())
    mean, variance = tf.nn.moments(h, axes=[0, 1, 2])
    for variable, value in ((moving_mean, mean), (moving_var, variance)):
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       tf.compat.v1.assign(variable, 0.9 * variable + 0.1 * value))
    return tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3)


def build_cnn_bn(optimizer: str = "momentum") -> Model:
    """A CNN with batch norm (moving statistics in ``UPDATE_OPS``, run before the update):
    images[?, 6, 6, 1] -> conv 3x3x4 -> batch norm -> relu -> conv 3x3x4 -> mean pool -> 1."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 1], name="images")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        with tf.compat.v1.variable_scope("block_0"):
            k = tf.compat.v1.get_variable("kernel", [3, 3, 1, 4], initializer=_init([3, 3, 1, 4], 70))
            h = tf.nn.relu(_batch_norm(tf.nn.conv2d(images, k, 1, "SAME"), 4))
        with tf.compat.v1.variable_scope("block_1"):
            k = tf.compat.v1.get_variable("kernel", [3, 3, 4, 4], initializer=_init([3, 3, 4, 4], 71))
            h = tf.reduce_mean(tf.nn.conv2d(h, k, 1, "SAME"), axis=[1, 2])
        with tf.compat.v1.variable_scope("head"):
            w = tf.compat.v1.get_variable("kernel", [4, 1], initializer=_init([4, 1], 72))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, w) - y), name="loss")
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = _train(loss, optimizer, None, True, 1.0)
    return Model(graph, {"images": images, "y": y}, loss, train_op)


def image_batches(steps: int, batch: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.RandomState(seed)
    return [{"images": rng.randn(batch, 6, 6, 1).astype(np.float32),
             "y": rng.randn(batch, 1).astype(np.float32)} for _ in range(steps)]


BUILDERS = {"mlp": build_mlp, "embedding": build_embedding,
            "embedding_only": lambda optimizer="gd", lr_scale=1.0: build_embedding(
                optimizer, dense_part=False, lr_scale=lr_scale),
            "sequence": lambda optimizer="adam": build_sequence(optimizer, partitions=2),
            "mlp_ref": lambda optimizer="gd", clip=None: build_mlp(optimizer, resource=False, clip=clip),
            "deep_mlp": build_deep_mlp, "cnn_bn": build_cnn_bn}
DATA = {"mlp": lambda steps, batch: batches("mlp", steps, batch),
        "embedding": lambda steps, batch: batches("embedding", steps, batch),
        "embedding_only": lambda steps, batch: batches("embedding", steps, batch),
        "sequence": lambda steps, batch: sequence_batches(steps, batch),
        "mlp_ref": lambda steps, batch: batches("mlp", steps, batch),
        "deep_mlp": lambda steps, batch: batches("mlp", steps, batch),
        "cnn_bn": image_batches}


def averaged_embedding_model(module, metrics=None):
    """A compiled Keras model of ``module`` (``keras`` or ``tf_keras``), seeded: 5 ids into an Embedding(300, 8)
    averaged by ``GlobalAveragePooling1D`` (whose gradient divides by the sequence's length), two Dense, Adam;
    ``metrics`` as ``compile`` takes them."""
    module.utils.set_random_seed(11)
    model = module.Sequential([module.Input((5,), dtype="int32"), module.layers.Embedding(300, 8),
                               module.layers.GlobalAveragePooling1D(), module.layers.Dense(16, activation="relu"),
                               module.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=module.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=metrics)
    return model


def keras_embedding_step():
    """A Keras 3 custom step, as its users write one: 4 ids into an Embedding(50, 8) averaged by
    ``GlobalAveragePooling1D``, a Dense, mean squared error, Adam (seeded); a ``tf.function`` with a signature."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(50, 8),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(0.05)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step
