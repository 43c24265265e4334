"""TensorFlow's PTB word language model (ptb_word_lm.py, reader.py), rewritten small.

``ptb_producer``'s input: the word ids as one tensor, cut into ``batch`` rows, a
``range_input_producer`` queue giving the step within the epoch, and
``strided_slice`` for the inputs and targets (every worker reads the same
batches). An embedding, an LSTM written out (the tutorial's BasicLSTMCell:
one matmul, four gates, forget bias 1) unrolled over ``num_steps`` from a state
the loop feeds back every step, a softmax, the sequence loss summed over steps
and averaged over the batch; ``tf.gradients`` of every trainable variable
clipped by global norm; ``GradientDescentOptimizer(self._lr)`` whose learning
rate is a variable the program assigns from a placeholder at each epoch
(``tf.assign(lr, new_lr)``), that op kept in graph collections as
``export_ops`` does; ``apply_gradients(..., global_step=get_or_create_global_step())``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

VOCAB = 12
HIDDEN = 6
BATCH = 2
NUM_STEPS = 3
WORDS = 80


def words() -> np.ndarray:
    return np.random.RandomState(11).randint(0, VOCAB, WORDS).astype(np.int32)


@dataclass
class Program:
    graph: tf.Graph
    cost: tf.Tensor
    train_op: tf.Operation
    initial_state: tuple
    final_state: tuple
    lr: tf.Variable
    new_lr: tf.Tensor
    lr_update: tf.Tensor
    epoch_size: int
    global_step: tf.Variable
    saver: tf.compat.v1.train.Saver


def ptb_producer(raw_data, batch_size, num_steps):
    data_len = len(raw_data)
    batch_len = data_len // batch_size
    data = tf.reshape(tf.constant(raw_data[:batch_size * batch_len]), [batch_size, batch_len])
    epoch_size = (batch_len - 1) // num_steps
    i = tf.compat.v1.train.range_input_producer(epoch_size, shuffle=False).dequeue()
    x = tf.strided_slice(data, [0, i * num_steps], [batch_size, (i + 1) * num_steps])
    x.set_shape([batch_size, num_steps])
    y = tf.strided_slice(data, [0, i * num_steps + 1], [batch_size, (i + 1) * num_steps + 1])
    y.set_shape([batch_size, num_steps])
    return x, y, epoch_size


def _lstm(inputs, state, kernel, bias):
    c, h = state
    gates = tf.matmul(tf.concat([inputs, h], 1), kernel) + bias
    i, j, f, o = tf.split(gates, 4, axis=1)
    new_c = c * tf.sigmoid(f + 1.0) + tf.sigmoid(i) * tf.tanh(j)
    return tf.tanh(new_c) * tf.sigmoid(o), (new_c, tf.tanh(new_c) * tf.sigmoid(o))


def build(resource: bool = True) -> Program:
    graph = tf.Graph()
    with graph.as_default():
        initializer = tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=5)
        with tf.compat.v1.name_scope("Train"), tf.compat.v1.variable_scope("Model", initializer=initializer,
                                                                            use_resource=resource):
            input_data, targets, epoch_size = ptb_producer(words(), BATCH, NUM_STEPS)
            embedding = tf.compat.v1.get_variable("embedding", [VOCAB, HIDDEN])
            inputs = tf.nn.embedding_lookup(embedding, input_data)
            c0 = tf.compat.v1.placeholder_with_default(tf.zeros([BATCH, HIDDEN]), [BATCH, HIDDEN], name="c0")
            h0 = tf.compat.v1.placeholder_with_default(tf.zeros([BATCH, HIDDEN]), [BATCH, HIDDEN], name="h0")
            kernel = tf.compat.v1.get_variable("lstm/kernel", [2 * HIDDEN, 4 * HIDDEN])
            bias = tf.compat.v1.get_variable("lstm/bias", [4 * HIDDEN], initializer=tf.compat.v1.zeros_initializer())
            state, outputs = (c0, h0), []
            for t in range(NUM_STEPS):
                out, state = _lstm(inputs[:, t, :], state, kernel, bias)
                outputs.append(out)
            output = tf.reshape(tf.concat(outputs, 1), [-1, HIDDEN])
            softmax_w = tf.compat.v1.get_variable("softmax_w", [HIDDEN, VOCAB])
            softmax_b = tf.compat.v1.get_variable("softmax_b", [VOCAB])
            logits = tf.reshape(tf.compat.v1.nn.xw_plus_b(output, softmax_w, softmax_b), [BATCH, NUM_STEPS, VOCAB])
            loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            cost = tf.reduce_sum(tf.reduce_mean(loss, axis=0), name="cost")
            lr = tf.compat.v1.Variable(0.0, trainable=False, name="learning_rate")
            tvars = tf.compat.v1.trainable_variables()
            grads, _ = tf.clip_by_global_norm(tf.gradients(cost, tvars), 5.0)
            optimizer = tf.compat.v1.train.GradientDescentOptimizer(lr)
            train_op = optimizer.apply_gradients(zip(grads, tvars),
                                                 global_step=tf.compat.v1.train.get_or_create_global_step())
            new_lr = tf.compat.v1.placeholder(tf.float32, shape=[], name="new_learning_rate")
            lr_update = tf.compat.v1.assign(lr, new_lr)
        for name, op in {"lr": lr, "new_lr": new_lr, "lr_update": lr_update, "cost": cost}.items():
            tf.compat.v1.add_to_collection(f"Train/{name}", op)  # export_ops
        saver = tf.compat.v1.train.Saver()
    return Program(graph, cost, train_op, (c0, h0), state, lr, new_lr, lr_update, epoch_size,
                   tf.compat.v1.train.get_global_step(graph), saver)


def assign_lr(session, program: Program, lr_value: float):
    """PTBModel.assign_lr: returns what the session gives for the assignment."""
    return session.run(program.lr_update, feed_dict={program.new_lr: lr_value})


def run_epoch(session, program: Program) -> tuple[float, list]:
    """ptb_word_lm.run_epoch: the state fed back each step; the costs and every step's fetches."""
    costs, iters, fetched = 0.0, 0, []
    state = session.run(program.initial_state)
    fetches = {"cost": program.cost, "final_state": program.final_state, "eval_op": program.train_op}
    for _ in range(program.epoch_size):
        feed_dict = {program.initial_state[0]: state[0], program.initial_state[1]: state[1]}
        vals = session.run(fetches, feed_dict)
        state = vals["final_state"]
        costs += float(np.mean(vals["cost"]))
        iters += NUM_STEPS
        fetched.append(vals["cost"])
    return float(np.exp(costs / iters)), fetched


def train(session, program: Program, epochs: int = 2, first: int = 0) -> list:
    """ptb_word_lm.main's loop: each epoch assigns the decayed learning rate, then runs an epoch. Returns
    per epoch what the assignment gave and the epoch's costs."""
    out = []
    for i in range(first, first + epochs):
        lr_decay = 0.5 ** max(i + 1 - 1, 0.0)
        assigned = assign_lr(session, program, 1.0 * lr_decay)
        _, costs = run_epoch(session, program)
        out.append((assigned, costs))
    return out


def save(session, program: Program, directory: str) -> str:
    """As the tutorial's Supervisor saves at the end: the program's own Saver, the global step in the name."""
    os.makedirs(directory, exist_ok=True)
    return program.saver.save(session, os.path.join(directory, "model.ckpt"), global_step=program.global_step)


def resume(session, program: Program, directory: str) -> None:
    """A later run restores the latest checkpoint with the program's own Saver."""
    program.saver.restore(session, tf.compat.v1.train.latest_checkpoint(directory))


def single_device(resource: bool, epochs: int, directory: str | None = None, first: int = 0
                  ) -> tuple[list, dict[str, np.ndarray]]:
    """Trains ``epochs`` epochs from epoch ``first`` (restoring from ``directory`` when ``first`` > 0,
    saving there otherwise)."""
    program = build(resource)
    with program.graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        coord = tf.compat.v1.train.Coordinator()
        threads = tf.compat.v1.train.start_queue_runners(sess, coord)
        if first:
            resume(sess, program, directory)
        fetched = train(sess, program, epochs, first)
        if directory and not first:
            save(sess, program, directory)
        variables = tf.compat.v1.global_variables()
        values = dict(zip([v.op.name for v in variables], sess.run(variables)))
        coord.request_stop()
        coord.join(threads)
    return fetched, values
