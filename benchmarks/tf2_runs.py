"""One run of ``benchmarks/tf2.py``, in the process ``tf2.py`` starts for it: the models, their inputs, and each way
of training them. Every run trains for ``--epochs`` and writes, from its worker 0, each epoch's seconds and steps
(a Keras callback around each epoch, or the custom loop's own clock) as JSON to ``--out``.

Runs (:data:`RUNS`): ``fit`` (Keras 3's ``model.fit`` in one process; ``fit-1thread`` / ``fit-2threads`` with
TensorFlow's intra-op pool set to 1 or 2 threads; ``fit-tfkeras``: the same model in tf_keras), ``parallax-1``
(``parallax.fit`` on one worker), ``parallax-mpi`` / ``-hybrid`` / ``-auto`` (``parallax.fit`` on 2 worker
processes, that run option; ``parallax-mpi-zero`` with ``zero_stage=1``: each worker updates its half of every
variable and of its optimizer slots, and the halves are gathered), ``loop-mpi`` (a custom ``tf.function`` loop
through ``parallax.parallel_run``, 2 workers, MPI), ``mirrored`` (``MirroredStrategy`` over two logical CPU devices,
``model.fit`` in its scope), ``mwms`` (``MultiWorkerMirroredStrategy``, 2 processes on localhost, the tf_keras
model: see :data:`NOT_BY_DEFAULT`) and ``horovod`` (in ``.venv-horovod``; ``tf2.py`` records it as not measured
when that venv is missing). A run named with ``-x3`` (``parallax-mpi-x3``, ``mwms-x3``, ``horovod-x3``, ...) is
the same on 3 processes (:func:`processes`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

RUNS = ("fit", "fit-1thread", "fit-2threads", "fit-tfkeras", "parallax-1", "parallax-mpi", "parallax-mpi-zero",
        "parallax-hybrid", "parallax-auto", "loop-mpi", "mirrored", "mwms", "horovod", "mwms-keras3",
        "parallax-mpi-x3", "parallax-hybrid-x3", "parallax-auto-x3", "mwms-x3", "horovod-x3")
#: Left out unless asked for: Keras 3's ``model.fit`` under ``MultiWorkerMirroredStrategy`` fails in TensorFlow 2.21
#: (``ValueError: Attempt to convert a value (PerReplica:...)``; keras-team/keras#20585), so ``mwms`` trains the
#: same model built with tf_keras, beside ``fit-tfkeras``, tf_keras's ``model.fit`` in one process.
NOT_BY_DEFAULT = ("mwms-keras3",)
MODELS = {"A": "Embedding(20000, 64) + 2 x Dense(512) MLP, 20 ids",
          "B": "Transformer: token + position embeddings, 2 blocks (4 heads, d_model 64), 64 ids"}
INPUTS = {"numpy": "numpy arrays", "tfdata": "tf.data: from_tensor_slices + map (hash, cast, clip) + batch + prefetch"}
VOCAB, BATCH = 20_000, 256
LENGTH = {"A": 20, "B": 64}


def processes(run: str) -> int:
    """The processes ``run`` trains in: three for a ``-x3`` run, one for ``fit``, ``parallax-1`` and ``mirrored``,
    else two."""
    if run.endswith("-x3"):
        return 3
    return 1 if run.startswith("fit") or run in ("parallax-1", "mirrored") else 2


def examples(model: str, n: int) -> tuple:
    """``n`` reviews of word ids, positive when most of their words are in the first half of the vocabulary."""
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (n, LENGTH[model])).astype(np.int32)
    return ids, (np.mean(ids < VOCAB // 2, axis=1, keepdims=True) > 0.5).astype(np.float32)


def dataset(x, y, batch: int = BATCH, mapped=None):
    """The tf.data form of the arrays: each example's ids turned into strings, hashed back into the vocabulary,
    cast and clipped (a real map step; counted into the variable ``mapped`` where given), then batched and
    prefetched. Deterministic, so every worker of a job reads the same batches."""
    import tensorflow as tf

    def prepare(ids, label):
        if mapped is not None:
            mapped.assign_add(1)
        hashed = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), VOCAB)
        return tf.clip_by_value(tf.cast(hashed, tf.int32), 0, VOCAB - 1), label

    return (tf.data.Dataset.from_tensor_slices((x, y)).map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch).prefetch(tf.data.AUTOTUNE))


def keras_module(flavor: str = "keras3"):
    """``keras`` (Keras 3), ``tf_keras`` (Keras 2, in this venv) or ``tf.keras`` (Keras 2 under TensorFlow 2.15,
    in .venv-horovod)."""
    if flavor == "keras3":
        import keras
    elif flavor == "tf_keras":
        import tf_keras as keras
    else:
        import tensorflow as tf

        keras = tf.keras
    return keras


def build(model: str, compile_it: bool = True, flavor: str = "keras3"):
    """Model ``A`` or ``B`` of :data:`MODELS`, in that Keras, compiled with Adam and binary cross-entropy."""
    keras = keras_module(flavor)
    layers = keras.layers
    keras.utils.set_random_seed(7)
    if model == "A":
        net = keras.Sequential([keras.Input((LENGTH["A"],), dtype="int32"), layers.Embedding(VOCAB, 64),
                                layers.GlobalAveragePooling1D(), layers.Dense(512, activation="relu"),
                                layers.Dense(512, activation="relu"), layers.Dense(1, activation="sigmoid")])
    else:
        maxlen, d_model = LENGTH["B"], 64
        if flavor == "keras3":
            from keras import ops

            arange = ops.arange
        else:
            import tensorflow as tf

            arange = tf.range

        class TokenAndPosition(layers.Layer):  # keras-io's text classification with a Transformer
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.tokens, self.positions = layers.Embedding(VOCAB, d_model), layers.Embedding(maxlen, d_model)

            def call(self, ids):
                return self.tokens(ids) + self.positions(arange(0, maxlen))

        ids = keras.Input((maxlen,), dtype="int32")
        h = TokenAndPosition()(ids)
        for _ in range(2):
            h = layers.LayerNormalization(epsilon=1e-6)(h + layers.MultiHeadAttention(4, d_model // 4)(h, h))
            ffn = layers.Dense(d_model)(layers.Dense(128, activation="relu")(h))
            h = layers.LayerNormalization(epsilon=1e-6)(h + ffn)
        out = layers.Dense(1, activation="sigmoid")(layers.GlobalAveragePooling1D()(h))
        net = keras.Model(ids, out)
    if compile_it:
        net.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
    return net


def epoch_timer(flavor: str = "keras3"):
    """A Keras callback keeping each epoch's seconds, steps and loss in ``.epochs``, and ``within``: the seconds
    from its first batch's end to its last's (the steps between, without the epoch's start and end)."""
    keras = keras_module(flavor)

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[dict] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.steps, self.first, self.last = time.perf_counter(), 0, None, None

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            self.last = time.perf_counter()
            self.first = self.first or self.last

        def on_epoch_end(self, epoch, logs=None):
            loss = (logs or {}).get("loss")
            self.epochs.append({"seconds": time.perf_counter() - self.start, "steps": self.steps,
                                "within": self.last - self.first if self.steps > 1 else None,
                                "loss": None if loss is None else float(loss)})

    return EpochTimes()


def _write(out: str, epochs: list[dict], **info) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump({"epochs": epochs, **info}, f)
    os.replace(out + ".tmp", out)


def _inputs(args):
    """``model.fit``'s data arguments for the run's input form: ``(x, y, batch_size)``."""
    x, y = examples(args.model, args.examples)
    return (dataset(x, y), None, None) if args.input == "tfdata" else (x, y, BATCH)


def run_fit(args) -> None:
    import tensorflow as tf

    threads = {"fit-1thread": 1, "fit-2threads": 2}.get(args.run)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    flavor = "tf_keras" if args.run == "fit-tfkeras" else "keras3"
    model, timer = build(args.model, flavor=flavor), epoch_timer(flavor)
    x, y, batch_size = _inputs(args)
    model.fit(x, y, batch_size=batch_size, epochs=args.epochs, verbose=0, callbacks=[timer])
    _write(args.out, timer.epochs, workers=1)


def run_parallax(args) -> None:
    import parallax

    model, timer = build(args.model), epoch_timer()
    x, y, batch_size = _inputs(args)
    config = parallax.Config(run_option=args.run.split("-")[1].upper() if args.run != "parallax-1" else "MPI",
                             zero_stage=1 if args.run.endswith("-zero") else 0)
    history = parallax.fit(model, x, y, batch_size=batch_size, epochs=args.epochs, verbose=0, callbacks=[timer],
                           resource_info=args.resource_info, parallax_config=config)
    if history.worker_id == 0:
        _write(args.out, timer.epochs, workers=history.num_workers)


def run_loop(args) -> None:
    """The same model by a custom ``tf.function`` step through ``parallax.parallel_run``: each global batch cut
    into ``num_workers * num_replicas`` parts, this worker's replicas taking theirs (docs/tf2_programs.md)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import parallax

    model = build(args.model, compile_it=False)
    optimizer, loss_fn = keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy()

    @tf.function
    def train_step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step, num_workers, worker_id, num_replicas = parallax.parallel_run(
        train_step, args.resource_info, parallax_config=parallax.Config(run_option="MPI"))
    x, y = examples(args.model, args.examples)
    data = dataset(x, y) if args.input == "tfdata" else None
    parts, mine = num_workers * num_replicas, slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
    epochs = []
    for epoch in range(args.epochs):
        if data is None:
            order = np.random.default_rng(epoch).permutation(len(x))  # the same on every worker
            batches = ((x[order[i:i + BATCH]], y[order[i:i + BATCH]]) for i in range(0, len(x), BATCH))
        else:
            batches = iter(data.as_numpy_iterator())
        start, steps, waited, first = time.perf_counter(), 0, 0.0, None
        while True:
            before = time.perf_counter()
            ids, labels = next(batches, (None, None))
            waited += time.perf_counter() - before
            if ids is None:
                break
            losses = step(np.split(ids, parts)[mine], np.split(labels, parts)[mine])
            steps, last = steps + 1, time.perf_counter()
            first = first or last
        epochs.append({"seconds": time.perf_counter() - start, "steps": steps, "loss": float(np.mean(losses)),
                       "input_seconds": waited, "within": last - first if steps > 1 else None})
    step.close()
    _write(args.out if worker_id == 0 else f"{args.out}.worker{worker_id}", epochs, workers=num_workers)


def run_mirrored(args) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build(args.model)
    timer = epoch_timer()
    x, y, batch_size = _inputs(args)
    model.fit(x, y, batch_size=batch_size, epochs=args.epochs, verbose=0, callbacks=[timer])
    _write(args.out, timer.epochs, workers=1, replicas=strategy.num_replicas_in_sync)


def run_mwms_worker(args) -> None:
    """One task of the ``mwms`` job (``TF_CONFIG`` set by :func:`run_mwms`), its share of the cores as
    Parallax gives each of its processes."""
    import tensorflow as tf

    threads = max(1, (os.cpu_count() or 1) // len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads + 1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    flavor = "keras3" if args.run == "mwms-keras3-worker" else "tf_keras"
    with strategy.scope():
        model = build(args.model, flavor=flavor)
    timer = epoch_timer(flavor)
    x, y, batch_size = _inputs(args)
    model.fit(x, y, batch_size=batch_size, epochs=args.epochs, verbose=0, callbacks=[timer])
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        _write(args.out, timer.epochs, workers=strategy.num_replicas_in_sync)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_mwms(args, workers: int = 2) -> None:
    """Start the ``mwms`` job's tasks here (in the run's network namespace, on fresh free ports) and wait."""
    hosts = [f"localhost:{_free_port()}" for _ in range(workers)]
    procs = []
    for index in range(workers):
        config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
        argv = [sys.executable, *[a if a != args.run else f"{args.run}-worker" for a in sys.argv]]
        procs.append(subprocess.Popen(argv, env={**os.environ, "TF_CONFIG": json.dumps(config)}))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise SystemExit(f"MultiWorkerMirroredStrategy tasks exited with {codes}")


def run_horovod(args, workers: int = 2) -> None:
    """Horovod written by hand (``DistributedOptimizer``, the variables broadcast from rank 0), in .venv-horovod
    (TensorFlow 2.15 and its tf.keras: Horovod builds against no later TensorFlow): ``workers`` ranks of this
    script started by that venv's mpirun, as benchmarks/compare.py starts its Horovod jobs."""
    import tempfile

    from benchmarks.compare import HOROVOD_PYTHON, _mpirun

    program = [a if a != args.run else "horovod-worker" for a in sys.argv]
    with tempfile.TemporaryDirectory(prefix="tf2_horovod_") as work:
        argv, env = _mpirun(HOROVOD_PYTHON, ["localhost"] * workers, program, work)
        code = subprocess.run(argv, env={**os.environ, **env}).returncode
    if code:
        raise SystemExit(f"the Horovod job exited with {code}")


def run_horovod_worker(args) -> None:
    """One rank of :func:`run_horovod`: its share (every ``size``-th example) of each epoch, ``BATCH / size``
    examples a step, so that a step trains ``BATCH`` examples in all."""
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads + 1)
    model = build(args.model, compile_it=False, flavor="tf.keras")
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(1e-3)),
                  loss="binary_crossentropy", metrics=["accuracy"])
    x, y = examples(args.model, args.examples)
    x, y, batch = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], BATCH // hvd.size()
    timer = epoch_timer("tf.keras")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), timer]
    if args.input == "tfdata":
        model.fit(dataset(x, y, batch), epochs=args.epochs, verbose=0, callbacks=callbacks)
    else:
        model.fit(x, y, batch_size=batch, epochs=args.epochs, verbose=0, callbacks=callbacks)
    if hvd.rank() == 0:
        _write(args.out, timer.epochs, workers=hvd.size())


def run(args) -> None:
    global VOCAB
    VOCAB = getattr(args, "vocab", None) or VOCAB  # the run's table size (tf2.py --vocab)
    if args.run.startswith("fit"):
        run_fit(args)
    elif args.run.startswith("parallax"):
        run_parallax(args)
    else:
        workers = processes(args.run)
        {"loop-mpi": run_loop, "mirrored": run_mirrored, "mwms": lambda a: run_mwms(a, workers),
         "mwms-keras3": run_mwms, "mwms-worker": run_mwms_worker, "mwms-keras3-worker": run_mwms_worker,
         "horovod": lambda a: run_horovod(a, workers),
         "horovod-worker": run_horovod_worker}[args.run.replace("-x3", "")](args)
