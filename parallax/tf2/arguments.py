"""The arguments of ``parallax.fit``, ``parallax.evaluate`` and ``parallax.predict``, checked before anything
starts.

A distributed job is the wrong place to find out that ``batch_size`` was ``0``: Keras takes some such values
silently (``batch_size=0`` trains as if 32; ``steps_per_epoch=0`` trains nothing), others fail inside the
launched workers twenty seconds later with a NumPy or TensorFlow traceback. So each argument is checked here, in
the process the user started, and a bad one is refused with a ``TypeError`` or ``ValueError`` that names the
argument, the value and what is expected. Values Keras itself refuses are refused the same way, earlier.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["check_fit", "check_evaluate", "check_predict", "is_dataset_like", "check_optimizer"]


def is_dataset_like(x: Any) -> bool:
    """A ``tf.data.Dataset``, a generator, or a ``keras.utils.PyDataset``: data that yields its own batches."""
    if isinstance(x, tf.data.Dataset):
        return True
    if hasattr(x, "__next__") or hasattr(x, "send"):
        return True
    return type(x).__name__ in ("PyDataset", "Sequence") or any(
        c.__name__ in ("PyDataset", "Sequence") for c in type(x).__mro__[1:])


def _count(caller: str, name: str, value: Any, *, least: int = 1, none: bool = True) -> None:
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{caller}: {name} must be an int{' or None' if none else ''}, got {type(value).__name__} "
                        f"{value!r}")
    if value < least:
        raise ValueError(f"{caller}: {name} must be at least {least}, got {value}")


def input_queue(keras_3: bool, max_queue_size: Any, workers: Any, use_multiprocessing: Any) -> dict:
    """tf_keras's ``model.fit`` arguments for the threads or processes that read a generator or a ``Sequence``, as its
    data handler takes them (those given). Keras 3's ``model.fit`` takes none (a ``keras.utils.PyDataset`` takes its
    own ``workers``).

    Raises:
        TypeError: one given for a Keras 3 model, or of another type; ValueError: a count below its least.
    """
    given = {name: value for name, value in (("max_queue_size", max_queue_size), ("workers", workers),
                                             ("use_multiprocessing", use_multiprocessing)) if value is not None}
    if given and keras_3:
        raise TypeError(f"parallax.fit: {', '.join(given)} is an argument of tf_keras's model.fit, which Keras 3's "
                        "does not take (a keras.utils.PyDataset takes its workers and use_multiprocessing itself)")
    _count("parallax.fit", "max_queue_size", max_queue_size)
    _count("parallax.fit", "workers", workers, least=0)
    if use_multiprocessing is not None and not isinstance(use_multiprocessing, bool):
        raise TypeError(f"parallax.fit: use_multiprocessing must be a bool, got {use_multiprocessing!r}")
    return given


def _verbose(caller: str, verbose: Any) -> None:
    if verbose != "auto" and (isinstance(verbose, bool) or verbose not in (0, 1, 2)):
        raise ValueError(f"{caller}: verbose must be 'auto', 0, 1 or 2, got {verbose!r}")


def _length(value: Any) -> int | None:
    """The examples of arrays (or a structure of arrays), ``None`` for data of another kind."""
    leaves = tf.nest.flatten(value)
    if not leaves or any(not hasattr(a, "__len__") and not hasattr(a, "shape") for a in leaves):
        return None
    sizes = {len(np.asarray(a)) if np.ndim(a) else -1 for a in leaves}
    return sizes.pop() if len(sizes) == 1 else -2


def _arrays(caller: str, x: Any, y: Any, sample_weight: Any, batch_size: Any) -> None:
    """``x``, ``y`` and ``sample_weight`` as ``model.fit`` takes them: arrays of one length, or data that yields
    its own batches (then no ``y``, weights or ``batch_size`` beside it)."""
    if x is None:
        raise TypeError(f"{caller}: x is missing (arrays, or a tf.data.Dataset of (inputs, targets) batches)")
    if is_dataset_like(x):
        for name, value in (("y", y), ("sample_weight", sample_weight), ("batch_size", batch_size)):
            if value is not None:
                raise ValueError(f"{caller}: {name} goes with arrays; x is a {type(x).__name__}, which yields its own "
                                 f"batches (of (inputs, targets[, sample_weights])): leave {name} out")
        return
    examples = _length(x)
    if examples is None or examples < 0:
        raise ValueError(f"{caller}: x must be arrays (or a dict, list or tuple of arrays) of one number of examples "
                         f"along their first axis, or a tf.data.Dataset; got {type(x).__name__}"
                         + (" of arrays of different lengths" if examples == -2 else ""))
    if examples == 0:
        raise ValueError(f"{caller}: x has no examples")
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is None:
            continue
        length = _length(value)
        if length != examples:
            raise ValueError(f"{caller}: {name} must have one entry per example of x ({examples}), got "
                             + ("arrays of different lengths" if length == -2 else
                                f"{length}" if length is not None else type(value).__name__))


def check_fit(x: Any, y: Any, batch_size: Any, epochs: Any, verbose: Any, callbacks: Any, validation_split: Any,
              validation_data: Any, shuffle: Any, class_weight: Any, sample_weight: Any, initial_epoch: Any,
              steps_per_epoch: Any, validation_steps: Any, validation_batch_size: Any, validation_freq: Any,
              seed: Any) -> None:
    """Check ``parallax.fit``'s arguments (see the module docstring).

    Raises:
        TypeError, ValueError: naming the argument, the value and what is expected.
    """
    caller = "parallax.fit"
    _count(caller, "batch_size", batch_size)
    _count(caller, "epochs", epochs, none=False)
    _count(caller, "initial_epoch", initial_epoch, least=0, none=False)
    if initial_epoch >= epochs:
        raise ValueError(f"{caller}: initial_epoch ({initial_epoch}) must be less than epochs ({epochs}): "
                         "epochs is the index of the last epoch, not a count of more epochs")
    _count(caller, "steps_per_epoch", steps_per_epoch)
    _count(caller, "validation_steps", validation_steps)
    _count(caller, "validation_batch_size", validation_batch_size)
    if not isinstance(validation_freq, numbers.Integral) or isinstance(validation_freq, bool):
        raise TypeError(f"{caller}: validation_freq must be an int (every that many epochs), got "
                        f"{type(validation_freq).__name__} {validation_freq!r}; a list of epochs is not taken")
    _count(caller, "validation_freq", validation_freq, none=False)
    _verbose(caller, verbose)
    if shuffle not in (True, False, "batch"):
        raise ValueError(f"{caller}: shuffle must be True, False or 'batch', got {shuffle!r}")
    if isinstance(validation_split, bool) or not isinstance(validation_split, numbers.Real) \
            or not 0 <= validation_split < 1:
        raise ValueError(f"{caller}: validation_split must be a number in [0, 1), got {validation_split!r}")
    if class_weight is not None and not isinstance(class_weight, dict):
        raise TypeError(f"{caller}: class_weight must be a dict of class index to weight, got "
                        f"{type(class_weight).__name__}")
    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"{caller}: callbacks must be a list of Keras callbacks, got {type(callbacks).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{caller}: seed must be an int, got {type(seed).__name__} {seed!r}")
    _arrays(caller, x, y, sample_weight, batch_size)
    if validation_data is not None:
        _validation(caller, validation_data)


def _validation(caller: str, data: Any) -> None:
    """``validation_data``: ``(x, y)``, ``(x, y, sample_weight)``, or a dataset."""
    if is_dataset_like(data):
        return
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        raise ValueError(f"{caller}: validation_data must be (x_val, y_val), (x_val, y_val, val_sample_weight) or "
                         f"a tf.data.Dataset, got {type(data).__name__}"
                         + (f" of {len(data)}" if isinstance(data, (tuple, list)) else ""))
    _arrays(f"{caller}: validation_data", data[0], data[1], data[2] if len(data) == 3 else None, None)


def check_evaluate(x: Any, y: Any, batch_size: Any, verbose: Any, sample_weight: Any, steps: Any) -> None:
    """Check ``parallax.evaluate``'s arguments.

    Raises:
        TypeError, ValueError: naming the argument, the value and what is expected.
    """
    _check_sharded("parallax.evaluate", x, y, sample_weight, batch_size, verbose, steps)


def check_predict(x: Any, batch_size: Any, verbose: Any, steps: Any) -> None:
    """Check ``parallax.predict``'s arguments.

    Raises:
        TypeError, ValueError: naming the argument, the value and what is expected.
    """
    _check_sharded("parallax.predict", x, None, None, batch_size, verbose, steps)


def _check_sharded(caller: str, x: Any, y: Any, sample_weight: Any, batch_size: Any, verbose: Any, steps: Any
                   ) -> None:
    _count(caller, "batch_size", batch_size)
    _count(caller, "steps", steps)
    _verbose(caller, verbose)
    _arrays(caller, x, y, sample_weight, batch_size)


def check_model(model: Any) -> None:
    """Refuse a model whose layers keep state from one batch to the next (``stateful=True`` recurrent layers, for
    a batch size fixed in their ``Input(batch_shape=...)``): each replica sees a part of each batch, and the state
    of a whole batch cannot be carried over as one device carries it (TensorFlow's error said only "Incompatible
    shapes" inside the loss's gradient).

    Raises:
        ValueError: naming the layer and what to do.
    """
    stateful = [layer.name for layer in getattr(model, "_flatten_layers", lambda: [])()
                if getattr(layer, "stateful", False) is True]
    if stateful:
        raise ValueError(f"parallax.fit: {', '.join(stateful)} {'is' if len(stateful) == 1 else 'are'} stateful "
                         "(stateful=True): it carries its state from each batch to the next, for every example of a "
                         "batch of fixed size, while each replica trains a part of each batch; train it on one "
                         "device (model.fit), or with stateful=False")


def check_optimizer(model: Any, config: Any) -> None:
    """Refuse what the model's optimizer cannot do in the job ``config`` asks for, before anything starts:
    ``zero_stage`` with an optimizer that writes its slots with plain assign ops; Keras 3's
    ``gradient_accumulation_steps`` for a model with an ``Embedding`` in ``run_option='PS'`` (the first step fails
    inside TensorFlow there; ``'MPI'`` and ``'HYBRID'`` train it, as PS trains accumulation without a table).

    Raises:
        ValueError: naming the optimizer, the setting and what to use instead.
    """
    accumulates = getattr(getattr(model, "optimizer", None), "gradient_accumulation_steps", None)
    tables = [layer.name for layer in getattr(model, "_flatten_layers", lambda: [])()
              if type(layer).__name__ == "Embedding"]
    if accumulates and tables and getattr(config, "run_option", None) == "PS":
        raise ValueError(f"parallax.fit: gradient_accumulation_steps={accumulates} of "
                         f"{type(model.optimizer).__name__} with a table looked up by ids ({tables[0]}) is not "
                         "supported with run_option='PS' (its update every few steps, inside a conditional, fails on "
                         "the parameter servers): use run_option='MPI' or 'HYBRID'")
    _refuse_sharded_slots(model, config)


def _refuse_sharded_slots(model: Any, config: Any) -> None:
    """``zero_stage`` shards the slots of optimizers that update through ``Apply*`` ops (tf_keras's legacy ones)
    and of Keras 3's, whose updates are element-wise (:mod:`parallax.rewrite.zero_regions`); tf_keras's new
    optimizers write in other ways, which the job's workers would refuse after launch: refused here, before
    anything starts."""
    stage = getattr(config, "zero_stage", 0)
    optimizer = getattr(model, "optimizer", None)
    module = type(optimizer).__module__
    legacy = "legacy" in module or "optimizer_v2" in module
    keras3 = module.startswith("keras.") and not module.startswith("keras.optimizers.legacy")
    if stage and not (legacy or keras3):
        raise ValueError(f"parallax.fit: zero_stage={stage} shards the slots of Keras 3's optimizers and of "
                         f"tf_keras.optimizers.legacy.*; {type(optimizer).__name__} ({module}) writes its slots in "
                         "another way: use one of those, or zero_stage=0")
    if stage and keras3:
        _refuse_keras3_whole(optimizer, stage)


#: Keras 3 optimizers whose update of a variable reads all of it (Lamb's trust ratio: norms of the variable and
#: of its update; Adafactor's factored moments: means over rows and columns; Muon: an orthogonalisation of the
#: whole matrix): no worker can update its part alone
_WHOLE_UPDATES = {"Lamb": "a norm of each variable", "Adafactor": "means over each variable's rows and columns",
                  "Muon": "an orthogonalisation of each whole matrix"}


def _refuse_keras3_whole(optimizer: Any, stage: int) -> None:
    """What the workers' rewrite (:mod:`parallax.rewrite.zero_regions`) would refuse after launch, refused here:
    stage 2, an update inside a conditional, an update that reads the whole variable."""
    name = type(optimizer).__name__
    if stage == 2:
        raise ValueError(f"parallax.fit: zero_stage=2 with {name}, a Keras 3 optimizer: its update is made of "
                         "element-wise ops, whose gradients are all-reduced whole; use zero_stage=1, which shards "
                         "its slots and its update")
    if name == "LossScaleOptimizer" or getattr(optimizer, "gradient_accumulation_steps", None):
        why = ("skips the update on a step whose scaled gradients overflow" if name == "LossScaleOptimizer" else
               f"applies the gradients every {optimizer.gradient_accumulation_steps} steps")
        raise ValueError(f"parallax.fit: zero_stage={stage} with {name}, which {why}: the update runs inside a "
                         "conditional, which zero_stage cannot cut into parts; use zero_stage=0")
    if name in _WHOLE_UPDATES:
        raise ValueError(f"parallax.fit: zero_stage={stage} with {name}, whose update reads "
                         f"{_WHOLE_UPDATES[name]}: no worker can update its part alone; use zero_stage=0")
