"""Training graphs written the way real TF1 programs write them, for the tests.

Programs written for the original Parallax (and most TF1 code) rarely fetch the
op ``apply_gradients`` returns: they wrap it. Each builder here is one such
idiom, as a small single-device graph in a fresh ``tf.Graph``:

* ``group``: ``train_op = tf.group(opt.minimize(loss, global_step))``
* ``update_ops``: batch-norm style moving averages in ``UPDATE_OPS``, run by
  ``tf.group(apply_op, *update_ops)``
* ``deps_update_ops``: the other spelling, ``with tf.control_dependencies(update_ops): minimize``
* ``ema``: an ``ExponentialMovingAverage`` of the weights applied under
  ``tf.control_dependencies([apply_op])``; ``slow_ema`` the same with a
  pause (a ``tf.numpy_function``) between the update and the EMA on the chief
  only (``PAUSE``; a program sets it per process), as a slow host callback or a
  busy machine would make it: another worker that reads the shadows right after
  its step must still see the chief's whole step
* ``scoped``: the optimizer built inside ``tf.variable_scope("model")`` on a
  partitioned embedding (slots named ``model/model/emb/part_0/Adagrad``), no
  global step
* ``two_optimizers``: one training op updating two variable sets with two
  optimizers (``tf.group`` of both)
* ``alternating``: a GAN-style pair of training ops run in turn (``schedule``)
* ``dataset``: ``tf.data`` input sharded over the replicas with
  ``parallax.shard``, read through an initializable iterator (no feeds);
  ``dataset_one_shot`` the same through a one-shot iterator
* ``lm1b``: the shape of the original Parallax's LM1B example, rewritten small:
  everything in ``variable_scope("model")`` under a partitioner, an unrolled
  LSTM fed its initial state, sampled softmax (seeded), gradients from
  ``tf.gradients`` with only the LSTM's clipped by global norm, Adagrad's
  ``apply_gradients`` with a global step, and an EMA of the LSTM weights under
  ``control_dependencies([train_op])``
* ``everything``: all of the above but the alternation in one program: a
  partitioned embedding and a dense net in ``variable_scope("model")`` with
  its optimizer, moving statistics, an EMA after the update, and a second
  optimizer on a second net, all under one ``tf.group``

The moving averages of ``update_ops``/``deps_update_ops`` are taken of a
statistic that is the same over any split of the batch (the mean of the
weights), so a replica's update equals the single-device one: the tests can
then demand equality with single-device training. The union batch's feeds
are split in equal parts, one per replica.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from tensorflow.python.training import moving_averages  # what tf.compat.v1.layers' batch norm uses

from tests.models import FEATURES, VOCAB, Model, _init, batches

__all__ = ["IDIOMS", "IDIOM_DATA", "PAUSE"]

PAUSE = {"seconds": 0.0}  # how long slow_ema's pause sleeps in this process


_FORWARD_READS = "idioms_forward_reads"


def _dense(x, name: str, shape, seed: int):
    w = tf.compat.v1.get_variable(f"{name}/kernel", shape, initializer=_init(shape, seed))
    b = tf.compat.v1.get_variable(f"{name}/bias", shape[-1:], initializer=_init(shape[-1:], seed + 100))
    w_value, b_value = tf.convert_to_tensor(w), tf.convert_to_tensor(b)  # the forward pass's reads
    tf.compat.v1.add_to_collection(_FORWARD_READS, w_value)
    tf.compat.v1.add_to_collection(_FORWARD_READS, b_value)
    return tf.matmul(x, w_value) + b_value


def _mlp_inputs():
    x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
    return x, y


def _mlp_loss(x, y, scope: str = "net"):
    with tf.compat.v1.variable_scope(scope):
        h = tf.nn.relu(_dense(x, "hidden", [FEATURES, 8], 11))
        pred = _dense(h, "out", [8, 1], 12)
    return tf.reduce_mean(tf.square(pred - y), name=f"{scope}_loss")


def _moving_average_updates(scope: str, x) -> None:
    """Batch-norm style moving statistics (``assign_moving_average``) in ``UPDATE_OPS``.
    Each statistic is computed in the replica (it reads the input ``x``, as batch
    statistics do) but does not depend on how the batch is split."""
    reads = [t for t in tf.compat.v1.get_collection(_FORWARD_READS) if t.op.name.startswith(scope)]
    for i, w in enumerate(reads):  # the values the forward pass read, as batch statistics are
        stat = tf.reduce_mean(w) + 0.0 * tf.reduce_mean(x)
        moving = tf.compat.v1.get_variable(f"moving/stat_{i}", [], trainable=False,
                                           initializer=tf.compat.v1.zeros_initializer())
        update = moving_averages.assign_moving_average(moving, stat, 0.9, zero_debias=False)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)


def build_group(optimizer: str = "adam") -> Model:
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        loss = _mlp_loss(x, y)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.group(_optimizer(optimizer).minimize(loss, global_step=step), name="train")
    return Model(graph, {"x": x, "y": y}, loss, train_op)


def build_update_ops(optimizer: str = "adam", deps: bool = False) -> Model:
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        loss = _mlp_loss(x, y)
        _moving_average_updates("net", x)
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        step = tf.compat.v1.train.get_or_create_global_step()
        if deps:
            with tf.control_dependencies(update_ops):
                train_op = _optimizer(optimizer).minimize(loss, global_step=step)
        else:
            apply_op = _optimizer(optimizer).minimize(loss, global_step=step)
            train_op = tf.group(apply_op, *update_ops)
    return Model(graph, {"x": x, "y": y}, loss, train_op)


def build_ema(optimizer: str = "momentum", pause: bool = False) -> Model:
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        loss = _mlp_loss(x, y)
        step = tf.compat.v1.train.get_or_create_global_step()
        apply_op = _optimizer(optimizer).minimize(loss, global_step=step)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.9, num_updates=step)
        after = [apply_op]
        if pause:
            with tf.control_dependencies([apply_op]):
                after = [tf.numpy_function(lambda: np.float32(time.sleep(PAUSE["seconds"]) or 0.0), [],
                                           tf.float32, name="pause")]
        with tf.control_dependencies(after):
            train_op = ema.apply(tf.compat.v1.trainable_variables())
    return Model(graph, {"x": x, "y": y}, loss, train_op)


def build_scoped(optimizer: str = "adagrad") -> Model:
    """An LM-like graph as the original Parallax's programs build it: everything,
    the optimizer included, inside ``variable_scope("model")``; a partitioned
    embedding; no global step."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        with tf.compat.v1.variable_scope("model"):
            emb = tf.compat.v1.get_variable(
                "lm/emb", [VOCAB, FEATURES], partitioner=tf.compat.v1.fixed_size_partitioner(2),
                initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=21))
            rows = tf.nn.embedding_lookup(emb, ids)
            w = tf.compat.v1.get_variable("lm/proj", [FEATURES, 1], initializer=_init([FEATURES, 1], 22))
            loss = tf.reduce_mean(tf.square(tf.matmul(rows, w) - y), name="loss")
            train_op = _optimizer(optimizer).minimize(loss)
    return Model(graph, {"ids": ids, "y": y}, loss, train_op)


def build_two_optimizers(optimizer: str = "adam") -> Model:
    """One training op, two variable sets, two optimizers."""
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        first = _mlp_loss(x, y, "first")
        second = _mlp_loss(x, 2.0 * y, "second")
        step = tf.compat.v1.train.get_or_create_global_step()
        a = _optimizer(optimizer).minimize(first, global_step=step,
                                           var_list=tf.compat.v1.trainable_variables("first"))
        b = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
            second, var_list=tf.compat.v1.trainable_variables("second"))
        train_op = tf.group(a, b)
        total = first + second
    return Model(graph, {"x": x, "y": y}, total, train_op)


def build_alternating(optimizer: str = "adam") -> Model:
    """A GAN-style pair: two losses, two optimizers, two training ops run in turn."""
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        with tf.compat.v1.variable_scope("gen"):
            fake = _dense(x, "g", [FEATURES, 1], 31)
        with tf.compat.v1.variable_scope("disc"):
            w = tf.compat.v1.get_variable("d/kernel", [1, 1], initializer=_init([1, 1], 32))
            real_score = tf.matmul(y, w)
            fake_score = tf.matmul(fake, w)
        d_loss = tf.reduce_mean(tf.square(real_score - 1.0)) + tf.reduce_mean(tf.square(fake_score))
        g_loss = tf.reduce_mean(tf.square(fake_score - 1.0))
        step = tf.compat.v1.train.get_or_create_global_step()
        d_op = _optimizer(optimizer).minimize(d_loss, var_list=tf.compat.v1.trainable_variables("disc"),
                                              global_step=step, name="d_train")
        g_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            g_loss, var_list=tf.compat.v1.trainable_variables("gen"), name="g_train")
        total = d_loss + g_loss
    return Model(graph, {"x": x, "y": y}, total, d_op, schedule=[d_op, g_op])


DATASET_ROWS = 4  # rows per replica and step of the ``dataset`` idiom


def dataset_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The ``dataset`` idiom's data: enough for 4 steps of 4 replicas."""
    rng = np.random.RandomState(5)
    return (rng.randn(64, FEATURES).astype(np.float32), rng.randn(64, 1).astype(np.float32))


def dataset_union_batches(steps: int, replicas: int) -> list[dict[str, np.ndarray]]:
    """What the replicas of the ``dataset`` idiom read together in each step: batch ``k`` of
    ``DATASET_ROWS`` rows goes to replica ``k % replicas`` (``Dataset.shard``)."""
    x, y = dataset_arrays()
    rows = DATASET_ROWS * replicas
    return [{"x": x[k * rows:(k + 1) * rows], "y": y[k * rows:(k + 1) * rows]} for k in range(steps)]


def build_dataset(optimizer: str = "adam", one_shot: bool = False) -> Model:
    import parallax

    graph = tf.Graph()
    with graph.as_default():
        x_all, y_all = dataset_arrays()
        ds = parallax.shard.shard(tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(DATASET_ROWS))
        if one_shot:  # as tf_cnn_benchmarks, which the original Parallax ran
            it, initializer = tf.compat.v1.data.make_one_shot_iterator(ds), tf.no_op(name="no_initializer")
        else:
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            initializer = it.initializer
        x, y = it.get_next()
        loss = _mlp_loss(x, y)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = _optimizer(optimizer).minimize(loss, global_step=step)
    return Model(graph, {"x": x, "y": y}, loss, train_op, initializer=initializer)


LM_STEPS, LM_STATE = 3, 5


def build_lm1b(optimizer: str = "adagrad") -> Model:
    del optimizer  # Adagrad, as the original
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(7)
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.int32, [None, LM_STEPS], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None, LM_STEPS], name="y")
        w = tf.compat.v1.placeholder(tf.float32, [None, LM_STEPS], name="w")
        state_c = tf.compat.v1.placeholder(tf.float32, [None, LM_STATE], name="state_c")
        state_h = tf.compat.v1.placeholder(tf.float32, [None, LM_STATE], name="state_h")
        uniform = tf.compat.v1.random_uniform_initializer(-0.3, 0.3, seed=8)
        with tf.compat.v1.variable_scope("model"), tf.compat.v1.variable_scope(
                tf.compat.v1.get_variable_scope(), partitioner=tf.compat.v1.fixed_size_partitioner(2)):
            emb = tf.compat.v1.get_variable("emb", [VOCAB, FEATURES], initializer=uniform)
            kernel = tf.compat.v1.get_variable("lstm/kernel", [FEATURES + LM_STATE, 4 * LM_STATE], initializer=uniform)
            bias = tf.compat.v1.get_variable("lstm/bias", [4 * LM_STATE], initializer=tf.compat.v1.zeros_initializer())
            softmax_w = tf.compat.v1.get_variable("softmax_w", [VOCAB, LM_STATE], initializer=uniform)
            softmax_b = tf.compat.v1.get_variable("softmax_b", [VOCAB], initializer=tf.compat.v1.zeros_initializer())
            inputs = tf.nn.embedding_lookup(emb, x)
            c, h, losses = state_c, state_h, []
            for t in range(LM_STEPS):
                gates = tf.matmul(tf.concat([inputs[:, t, :], h], 1), kernel) + bias
                i, j, f, o = tf.split(gates, 4, axis=1)
                c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
                h = tf.sigmoid(o) * tf.tanh(c)
                losses.append(tf.nn.sampled_softmax_loss(
                    softmax_w, softmax_b, tf.cast(y[:, t:t + 1], tf.int64), h, num_sampled=6, num_classes=VOCAB,
                    seed=9) * w[:, t])
            loss = tf.reduce_mean(tf.stack(losses), name="loss")
            final_c, final_h = tf.identity(c, name="final_state_c"), tf.identity(h, name="final_state_h")
            all_vars = tf.compat.v1.trainable_variables()
            lstm_vars = [v for v in all_vars if "/lstm/" in v.op.name]
            other_vars = [v for v in all_vars if "/lstm/" not in v.op.name]
            grads = tf.gradients(loss, lstm_vars + other_vars)
            lstm_grads, _ = tf.clip_by_global_norm(grads[:len(lstm_vars)], 1.0)
            opt = tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=1.0)
            train_op = opt.apply_gradients(list(zip(lstm_grads + grads[len(lstm_vars):], lstm_vars + other_vars)),
                                           global_step=step)
            ema = tf.compat.v1.train.ExponentialMovingAverage(0.999)
            with tf.control_dependencies([train_op]):
                train_op = ema.apply(lstm_vars)
    model = Model(graph, {"x": x, "y": y, "w": w, "state_c": state_c, "state_h": state_h}, loss, train_op)
    model.variables = [final_c, final_h]
    return model


def _lm1b_data(steps: int, batch: int):
    rng = np.random.RandomState(3)
    return [{"x": rng.randint(0, VOCAB, (batch, LM_STEPS)).astype(np.int32),
             "y": rng.randint(0, VOCAB, (batch, LM_STEPS)).astype(np.int32),
             "w": np.ones((batch, LM_STEPS), np.float32), "state_c": np.zeros((batch, LM_STATE), np.float32),
             "state_h": np.zeros((batch, LM_STATE), np.float32)} for _ in range(steps)]


def build_everything(optimizer: str = "adagrad") -> Model:
    graph = tf.Graph()
    with graph.as_default():
        x, y = _mlp_inputs()
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.variable_scope("model"):
            emb = tf.compat.v1.get_variable(
                "lm/emb", [VOCAB, 8], partitioner=tf.compat.v1.fixed_size_partitioner(2),
                initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=41))
            h = tf.nn.relu(_dense(x, "hidden", [FEATURES, 8], 42) + tf.nn.embedding_lookup(emb, ids))
            loss = tf.reduce_mean(tf.square(_dense(h, "out", [8, 1], 43) - y), name="loss")
            _moving_average_updates("model/hidden", x)
            model_vars = tf.compat.v1.trainable_variables("model")
            apply_model = _optimizer(optimizer).minimize(loss, global_step=step, var_list=model_vars)
        aux_loss = _mlp_loss(x, y, "aux")
        apply_aux = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
            aux_loss, var_list=tf.compat.v1.trainable_variables("aux"))
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.9, num_updates=step)
        with tf.control_dependencies([apply_model]):
            averaged = ema.apply([v for v in model_vars if "emb" not in v.op.name])
        train_op = tf.group(averaged, apply_aux, *tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
        total = loss + aux_loss
    return Model(graph, {"x": x, "ids": ids, "y": y}, total, train_op)


def build_tf_keras(optimizer: str = "adam") -> Model:
    """A tf_keras model in a ``tf.compat.v1`` graph (an embedding, then a dense layer), trained by a
    ``tf_keras.optimizers.legacy`` optimizer's ``apply_gradients`` of ``tf.gradients`` (its ``minimize``
    takes a callable there; its non-legacy optimizers are refused)."""
    import tf_keras

    optimizers = {"adam": tf_keras.optimizers.legacy.Adam(0.05), "adagrad": tf_keras.optimizers.legacy.Adagrad(0.1)}
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        model = tf_keras.Sequential([
            tf_keras.layers.Embedding(VOCAB, 4, embeddings_initializer=tf_keras.initializers.RandomNormal(seed=3)),
            tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=4))])
        loss = tf.reduce_mean(tf.square(model(ids) - y), name="keras_loss")
        weights = model.trainable_variables
        train_op = optimizers[optimizer].apply_gradients(zip(tf.gradients(loss, weights), weights))
    return Model(graph, {"ids": ids, "y": y}, loss, train_op)


def _optimizer(name: str):
    from tests.models import OPTIMIZERS

    cls, lr, kwargs = OPTIMIZERS[name]
    return cls(lr, **kwargs)


def _mlp_data(steps: int, batch: int):
    return batches("mlp", steps, batch)


def _ids_data(steps: int, batch: int):
    return batches("embedding", steps, batch)


def _both_data(steps: int, batch: int):
    return [{**a, **b} for a, b in zip(batches("mlp", steps, batch, seed=1), batches("embedding", steps, batch))]


IDIOMS = {
    "group": build_group,
    "update_ops": build_update_ops,
    "deps_update_ops": lambda optimizer="adam": build_update_ops(optimizer, deps=True),
    "ema": build_ema,
    "slow_ema": lambda optimizer="momentum": build_ema(optimizer, pause=True),
    "scoped": build_scoped,
    "two_optimizers": build_two_optimizers,
    "alternating": build_alternating,
    "dataset": build_dataset,
    "dataset_one_shot": lambda optimizer="adam": build_dataset(optimizer, one_shot=True),
    "lm1b": build_lm1b,
    "everything": build_everything,
    "tf_keras": build_tf_keras,
}
IDIOM_DATA = {name: {"scoped": _ids_data, "everything": _both_data, "lm1b": _lm1b_data,
                     "tf_keras": _ids_data}.get(name, _mlp_data)
              for name in IDIOMS}
