"""The input work each worker does for ``parallax.fit(model, dataset)`` (issue 50, item 4).

    python benchmarks/input_share.py                # 3 rounds, 1, 2 and 3 workers
    python benchmarks/input_share.py --rounds 1 --examples 8192

A worker reads only its share of a ``tf.data`` pipeline of global batches (parallax/tf2/input_split.py): the
per-example maps before ``batch()`` run on its block of each batch alone. Measured here without training, in
one process, one worker after the other: the CPU seconds (all of the process's threads: the work, whatever
else runs on the machine) to iterate one epoch of what a worker iterates, for one worker (the whole pipeline:
what every worker read before) and for each worker of 2 and 3, and the examples its maps processed. Four
pipelines: the one ``make bench-tf2`` trains (ids made strings, hashed back, cast, clipped:
``benchmarks/tf2_runs.dataset``), a text pipeline (a line of 64 words split, hashed into a vocabulary, cut
or padded to 64 ids), the same lines read from ``TFRecord`` files (a length known only by reading them:
each global batch's size comes with it), and images scaled and resized by a map after ``batch()`` (of whole
batches, which works row by row), all in global batches of 384 (which 2 and 3 divide). The ratio is a
worker's seconds over one worker's, the median over the rounds; 1/N is the goal. Results:
``benchmarks/results/input_share.{json,png}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, finish_plot, save_results  # noqa: E402
from benchmarks.tf2_runs import dataset, examples  # noqa: E402

WORDS, VOCAB = 64, 20000
BATCH = 384  # a global batch 2 and 3 workers divide


def _lines(n: int) -> list[str]:
    """``n`` lines of ``WORDS`` words."""
    import numpy as np

    rng = np.random.default_rng(1)
    return [" ".join(f"w{v}" for v in row) for row in rng.integers(0, 50000, (n, WORDS))]


def _ids(line):
    """A line's words, lower-cased, hashed into ``VOCAB`` ids, cut or padded to ``WORDS``."""
    import tensorflow as tf

    ids = tf.strings.to_hash_bucket_fast(tf.strings.split(tf.strings.lower(line)), VOCAB)[:WORDS]
    return tf.pad(ids, [[0, WORDS - tf.shape(ids)[0]]])


def text_dataset(n: int, mapped):
    """Lines of ``WORDS`` words, each split, hashed into ``VOCAB`` and made ``WORDS`` ids, batched."""
    import numpy as np
    import tensorflow as tf

    def prepare(line, label):
        mapped.assign_add(1)
        return _ids(line), label

    return (tf.data.Dataset.from_tensor_slices((_lines(n), np.zeros(n, np.float32))).shuffle(n, seed=1)
            .map(prepare, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE))


_RECORDS: dict[int, list[str]] = {}


def records_dataset(n: int, mapped):
    """The text pipeline's lines as ``tf.train.Example`` records in 4 ``TFRecord`` files (written once), read by a
    ``TFRecordDataset``: a length not known before reading; each record parsed, then prepared as above."""
    import tempfile

    import tensorflow as tf

    if n not in _RECORDS:
        lines = _lines(n)
        folder = tempfile.mkdtemp(prefix="parallax-input-share-")
        _RECORDS[n] = [os.path.join(folder, f"part-{i}.tfrecord") for i in range(4)]
        for i, name in enumerate(_RECORDS[n]):
            with tf.io.TFRecordWriter(name) as writer:
                for line in lines[i::4]:
                    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[line.encode()]))
                    writer.write(tf.train.Example(features=tf.train.Features(
                        feature={"line": feature})).SerializeToString())

    def prepare(record):
        mapped.assign_add(1)
        return _ids(tf.io.parse_single_example(record, {"line": tf.io.FixedLenFeature([], tf.string)})["line"]), 0.0

    return (tf.data.TFRecordDataset(_RECORDS[n]).map(prepare, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
            .prefetch(tf.data.AUTOTUNE))


def images_dataset(n: int, mapped):
    """Images of 32x32x3 bytes, batched, then each batch scaled to [0, 1] and resized to 96x96 by a map of whole
    batches (``ds.batch(B).map(...)``, as keras-io's image programs write it): a map that works row by row, so that
    each worker maps its own block of each batch (``mapped`` counts the rows it maps)."""
    import numpy as np
    import tensorflow as tf

    images = np.random.default_rng(2).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)

    def prepare(x, label):
        mapped.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
        return tf.image.resize(tf.cast(x, tf.float32) / 255.0, [96, 96]), label

    return (tf.data.Dataset.from_tensor_slices((images, np.zeros(n, np.float32))).shuffle(n, seed=1).batch(BATCH)
            .map(prepare, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))


def ids_dataset(n: int, mapped):
    """``make bench-tf2``'s tf.data input (model A's ids)."""
    return dataset(*examples("A", n), batch=BATCH, mapped=mapped)


PIPELINES = {"ids (bench-tf2)": ids_dataset, "text": text_dataset, "text records": records_dataset,
             "images, batches mapped": images_dataset}


def epoch_seconds(make, n: int, workers: int, worker: int) -> tuple[float, int]:
    """CPU seconds (every thread of the process: tf.data maps in a pool of its own) to iterate one epoch of worker
    ``worker``'s share (the whole pipeline for one worker), and the examples its maps processed."""
    import tensorflow as tf

    from parallax.tf2.input_split import share_of

    mapped = tf.Variable(0, dtype=tf.int64)
    ds = make(n, mapped)
    if workers > 1:
        share = share_of(ds, workers, worker, 1)
        assert not isinstance(share, str), share
        ds = share.dataset
    began = time.process_time()
    for _ in ds:
        pass
    return time.process_time() - began, int(mapped.numpy())


def measure(n: int, rounds: int) -> list[dict]:
    """Each pipeline's rows; the record files written for it are removed at the end."""
    try:
        return _measure(n, rounds)
    finally:
        for paths in _RECORDS.values():
            shutil.rmtree(os.path.dirname(paths[0]), ignore_errors=True)
        _RECORDS.clear()


def _measure(n: int, rounds: int) -> list[dict]:
    rows = []
    for name, make in PIPELINES.items():
        epoch_seconds(make, n, 1, 0)  # warm up: the first epoch pays for tracing
        for workers in (1, 2, 3):
            for worker in range(workers):
                times, mapped = [], 0
                for _ in range(rounds):
                    seconds, mapped = epoch_seconds(make, n, workers, worker)
                    times.append(seconds)
                rows.append({"pipeline": name, "workers": workers, "worker": worker, "examples": n,
                             "mapped": mapped, "seconds": statistics.median(times), "rounds": times})
        whole = next(r["seconds"] for r in rows if r["pipeline"] == name and r["workers"] == 1)
        for r in rows:
            if r["pipeline"] == name:
                r["ratio"] = r["seconds"] / whole
                print(f"{name:16s} {r['workers']} workers, worker {r['worker']}: {r['seconds']:.3f} CPU s, "
                      f"{r['mapped']} examples mapped, {r['ratio']:.2f}x one worker's", flush=True)
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(dict.fromkeys(r["pipeline"] for r in rows))
    width = 0.12
    for i, name in enumerate(names):
        mine = [r for r in rows if r["pipeline"] == name]
        for j, r in enumerate(mine):
            ax.bar(i + (j - len(mine) / 2) * width, r["ratio"], width,
                   color=f"C{r['workers'] - 1}", label=f"{r['workers']} worker(s)" if i == 0 and r["worker"] == 0
                   else None)
    for workers in (2, 3):
        ax.axhline(1 / workers, color=f"C{workers - 1}", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(names)), names)
    finish_plot(fig, ax, path, "Input work per worker (each bar a worker)",
                "one epoch's input CPU time\n/ one worker's")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--examples", type=int, default=32768)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out_dir", default=RESULTS)
    args = p.parse_args(argv)
    rows = measure(args.examples, args.rounds)
    save_results(args.out_dir, "input_share", {"rows": rows}, lambda data, path: plot(data["rows"], path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
