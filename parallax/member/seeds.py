"""Every rank's random generators start alike: a program that draws without a seed draws the same numbers in
every rank, as one device would draw them once.

Every rank runs the program's whole data preparation (:mod:`parallax.member.entry`). Where the program seeds
nothing, each process would draw its own: an unseeded ``Dataset.shuffle`` (TensorFlow's own tutorials shuffle so),
``Dataset.list_files``, ``keras.utils.text_dataset_from_directory`` without a seed, synthetic data from
``np.random``, a vocabulary read from a ``set`` of words (Python's string hashing). Each worker would then
train its part of another batch, and the union would be no batch of the data; Parallax refused such data at
the first batch (:func:`parallax.tf2.batches.check_same`). So the launcher draws one seed a job
(:attr:`parallax.invocation.LaunchIdentity.seed`) and every rank seeds its generators with it before its program
runs: Python's ``random`` at once, NumPy's global generator and TensorFlow's global seed as each is imported
(importing them here would read their environment before the program sets it, ``TF_ENABLE_ONEDNN_OPTS`` and
the like). Every rank then draws the numbers the others draw, and the job trains as the program would on one
device with its generators so seeded (not quite as one begun with ``keras.utils.set_random_seed(seed)``:
importing Keras draws from Python's ``random``). The launcher also gives the ranks one ``PYTHONHASHSEED`` (its
own, where it has one). Seeds the program sets itself replace these, as they would on one device; draws from the
operating system's entropy (``np.random.default_rng()``, ``tf.random.Generator.from_non_deterministic_state()``)
stay each rank's own, and the first batch's check refuses data made from them.
"""

from __future__ import annotations

import random
import secrets

import wrapt

__all__ = ["job_seed", "seed_alike"]


def job_seed() -> int:
    """A new job's seed, drawn from the operating system's entropy: each job draws other numbers, as each run of
    a program that seeds nothing does on one device."""
    return secrets.randbelow(2**31)


def seed_alike(seed: int) -> None:
    """Seed this process's Python ``random`` now, and NumPy's global generator and TensorFlow's global seed
    when each is imported (at once if it already is), with ``seed`` (``0 <= seed < 2**31``)."""
    random.seed(seed)
    wrapt.register_post_import_hook(lambda numpy: numpy.random.seed(seed), "numpy")
    wrapt.register_post_import_hook(lambda tensorflow: tensorflow.random.set_seed(seed), "tensorflow")
