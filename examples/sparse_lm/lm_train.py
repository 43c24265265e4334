"""A sparse language model (embedding + LSTM + sampled softmax), trained data-parallel by Parallax.

The model is an ordinary single-device TensorFlow graph: a 100k-word embedding
looked up with ``tf.nn.embedding_lookup``, a one-layer LSTM unrolled by hand
over ``seq_len`` steps, and ``tf.nn.sampled_softmax_loss``. The embedding and
the softmax weights and biases get sparse gradients (``IndexedSlices``): only
the rows a batch touches. Only the ``parallel_run`` call is Parallax.

The corpus is synthetic (numpy, seeded; nothing is downloaded): Zipf-distributed
words where, half of the time, the next word is a fixed successor of the current
one, so the loss has something to learn.

Run it with::

    python examples/sparse_lm/lm_train.py --resource_info resource_info.example --run_option HYBRID
    python examples/sparse_lm/lm_train.py --resource_info resource_info.example --run_option MPI --steps 100
    parallax-run --resource_info resource_info.example examples/sparse_lm/lm_train.py --run_option MPI

With ``resource_info.example`` (``localhost: cpu:0,cpu:1``), ``MPI`` starts one
process per device; for ``PS`` write one worker per line (``localhost: cpu:0``
then ``localhost: cpu:1``) and a parameter server is added. Shrink the model
for a quick try with ``--vocab 5000 --steps 50``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from types import SimpleNamespace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

# --------------------------------------------------------------------------- #
# Synthetic corpus
# --------------------------------------------------------------------------- #


def make_corpus(vocab: int, num_sequences: int, seq_len: int, seed: int = 0, zipf_exponent: float = 1.0,
                follow_prob: float = 0.5) -> np.ndarray:
    """``num_sequences`` sentences of ``seq_len + 1`` word ids, shape ``[num_sequences, seq_len + 1]``, int64.

    Word ``k`` has unigram frequency proportional to ``1 / (k + 1) ** zipf_exponent``
    (id 0 is the most frequent, as ``sampled_softmax_loss``'s log-uniform sampler
    assumes). Each word is, with probability ``follow_prob``, the fixed successor of
    the previous word (a random Zipf-drawn table, the same for every seed of the
    corpus), otherwise a fresh Zipf draw. Every process that calls this with the
    same arguments gets the same corpus.
    """
    rng = np.random.default_rng(seed)
    unigram = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** zipf_exponent
    unigram /= unigram.sum()
    successor = rng.choice(vocab, size=vocab, p=unigram)
    words = np.empty((num_sequences, seq_len + 1), np.int64)
    words[:, 0] = rng.choice(vocab, size=num_sequences, p=unigram)
    for t in range(1, seq_len + 1):
        fresh = rng.choice(vocab, size=num_sequences, p=unigram)
        follow = rng.random(num_sequences) < follow_prob
        words[:, t] = np.where(follow, successor[words[:, t - 1]], fresh)
    return words


def shard_batches(corpus: np.ndarray, batch: int, shard: int, num_shards: int):
    """Endless ``(inputs, targets)`` batches of this shard: batch ``b`` of the corpus
    belongs to shard ``b % num_shards``; targets are the inputs shifted by one word."""
    num_batches = len(corpus) // batch
    mine = list(range(shard, num_batches, num_shards))
    if not mine:
        raise ValueError(f"the corpus has {num_batches} batches of {batch}, too few for {num_shards} shards")
    while True:
        for b in mine:
            rows = corpus[b * batch:(b + 1) * batch]
            yield rows[:, :-1], rows[:, 1:]


# --------------------------------------------------------------------------- #
# The single-device model
# --------------------------------------------------------------------------- #


def _lstm(inputs: list[tf.Tensor], hidden: int) -> list[tf.Tensor]:
    """One LSTM layer unrolled over ``inputs`` (a list of ``[batch, dim]``), written with plain ops."""
    dim = int(inputs[0].shape[-1])
    batch = int(inputs[0].shape[0])
    kernel = tf.compat.v1.get_variable("lstm/kernel", [dim + hidden, 4 * hidden])
    bias = tf.compat.v1.get_variable("lstm/bias", [4 * hidden], initializer=tf.compat.v1.zeros_initializer())
    c = tf.zeros([batch, hidden])
    h = tf.zeros([batch, hidden])
    outputs = []
    for x in inputs:
        gates = tf.matmul(tf.concat([x, h], axis=1), kernel) + bias
        i, j, f, o = tf.split(gates, 4, axis=1)
        c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)  # forget bias 1
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
    return outputs


def model(inputs: tf.Tensor, targets: tf.Tensor, vocab: int, dim: int, hidden: int, num_sampled: int
          ) -> tf.Tensor:
    """The network in the current graph; ``inputs`` and ``targets`` are ``[batch, seq_len]`` word ids
    of static shape. Returns the sampled-softmax loss, mean per word. Variables (scope ``lm``):
    ``embedding`` ``[vocab, dim]``, ``lstm/kernel``, ``lstm/bias``, ``softmax_w`` ``[vocab, hidden]``,
    ``softmax_b`` ``[vocab]``."""
    batch, seq_len = (int(d) for d in inputs.shape)
    init = tf.compat.v1.random_uniform_initializer(-0.1, 0.1)
    with tf.compat.v1.variable_scope("lm", initializer=init):
        embedding = tf.compat.v1.get_variable("embedding", [vocab, dim])
        words = tf.nn.embedding_lookup(embedding, inputs)                    # [batch, seq_len, dim]
        outputs = _lstm(tf.unstack(words, axis=1), hidden)                   # seq_len x [batch, hidden]
        softmax_w = tf.compat.v1.get_variable("softmax_w", [vocab, hidden])
        softmax_b = tf.compat.v1.get_variable("softmax_b", [vocab], initializer=tf.compat.v1.zeros_initializer())
    flat_outputs = tf.reshape(tf.stack(outputs, axis=1), [batch * seq_len, hidden])
    flat_targets = tf.reshape(targets, [batch * seq_len, 1])
    losses = tf.nn.sampled_softmax_loss(weights=softmax_w, biases=softmax_b, labels=flat_targets,
                                        inputs=flat_outputs, num_sampled=num_sampled, num_classes=vocab)
    return tf.reduce_mean(losses, name="loss")


def build_graph(vocab: int = 100_000, dim: int = 64, hidden: int = 64, batch: int = 32, seq_len: int = 10,
                num_sampled: int = 64, seed: int = 1, learning_rate: float = 0.5
                ) -> tuple[tf.Graph, SimpleNamespace]:
    """The single-device graph (placeholders, :func:`model`, Adagrad) and its tensors.

    Returns:
        ``(graph, t)`` where ``t`` has ``inputs``, ``targets`` (int64 placeholders
        ``[batch, seq_len]``), ``loss`` (sampled softmax, mean per word),
        ``train_op``, ``global_step``, and the variables ``embedding``
        ``[vocab, dim]``, ``softmax_w`` ``[vocab, hidden]``, ``softmax_b`` ``[vocab]``.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        inputs = tf.compat.v1.placeholder(tf.int64, [batch, seq_len], name="inputs")
        targets = tf.compat.v1.placeholder(tf.int64, [batch, seq_len], name="targets")
        loss = model(inputs, targets, vocab, dim, hidden, num_sampled)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(loss, global_step=global_step)
        variables = {v.op.name.split("/")[-1]: v for v in tf.compat.v1.global_variables()}
    return graph, SimpleNamespace(inputs=inputs, targets=targets, loss=loss, train_op=train_op,
                                  global_step=global_step, embedding=variables["embedding"],
                                  softmax_w=variables["softmax_w"], softmax_b=variables["softmax_b"])


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--run_option", default="HYBRID", choices=["PS", "MPI", "HYBRID", "AUTO"],
                        type=str.upper, help="how Parallax spreads the job (default HYBRID)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64, help="embedding width")
    parser.add_argument("--hidden", type=int, default=64, help="LSTM width")
    parser.add_argument("--batch", type=int, default=32, help="sentences per replica and step")
    parser.add_argument("--seq_len", type=int, default=10)
    parser.add_argument("--num_sampled", type=int, default=64, help="negative classes of the sampled softmax")
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--corpus_sequences", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log_every", type=int, default=20)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.log_every < 1:
        parser.error("--steps and --log_every must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    tf.get_logger().setLevel(logging.ERROR)  # TensorFlow's deprecation notices

    graph, t = build_graph(args.vocab, args.dim, args.hidden, args.batch, args.seq_len, args.num_sampled,
                           args.seed, args.learning_rate)
    config = parallax.Config(run_option=args.run_option)
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
        graph, args.resource_info, sync=True, parallax_config=config)
    chief = worker_id == 0
    print(f"worker {worker_id} of {num_workers} ready, {num_replicas} replica(s) in this process", flush=True)

    corpus = make_corpus(args.vocab, args.corpus_sequences, args.seq_len, seed=args.seed)
    # Every replica of the job reads its own shard: shard = worker_id * num_replicas + replica.
    total_replicas = num_workers * num_replicas
    readers = [shard_batches(corpus, args.batch, worker_id * num_replicas + r, total_replicas)
               for r in range(num_replicas)]
    words_per_step = args.batch * args.seq_len * total_replicas

    first_loss, window_loss, window_steps = None, 0.0, 0
    start = window_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batches = [next(reader) for reader in readers]
        losses, _ = sess.run([t.loss, t.train_op],
                             feed_dict={t.inputs: [b[0] for b in batches], t.targets: [b[1] for b in batches]})
        loss = float(np.mean(losses))
        first_loss = loss if first_loss is None else first_loss
        window_loss, window_steps = window_loss + loss, window_steps + 1
        if chief and (step % args.log_every == 0 or step == args.steps):
            now = time.perf_counter()
            print(f"step {step:5d}  loss {window_loss / window_steps:.3f}  "
                  f"{words_per_step * window_steps / (now - window_start):8.0f} words/s", flush=True)
            window_loss, window_steps, window_start = 0.0, 0, now
    seconds = time.perf_counter() - start
    if chief:
        gstep = sess.run(t.global_step)[0]
        print(f"done: {args.run_option}, {num_workers} worker(s) x {num_replicas} replica(s), vocab {args.vocab}, "
              f"{args.steps} steps (global step {gstep}) in {seconds:.1f} s, "
              f"{words_per_step * args.steps / seconds:.0f} words/s; "
              f"sampled-softmax loss {first_loss:.3f} -> {loss:.3f}", flush=True)
    sess.close()


if __name__ == "__main__":
    main()
