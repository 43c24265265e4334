"""A ``tf.function`` step without an ``input_signature``, traced at its first call, as ``tf.function`` traces.

TensorFlow's own tutorials write the step ``@tf.function def train_step(images, labels)``: no signature,
traced when it is first called. ``parallel_run(train_step, ...)`` then returns a :class:`DeferredStep` at once
(with the job's numbers as far as they are known before the graph is: :func:`parallax.member.identity.numbers`);
its first call takes the signature from the arguments it is given (each tensor's dtype and shape, the batch
dimension left open, of one replica's part), traces the step into the graph and starts what ``parallel_run``
starts for a step with a signature (in the process the user ran, that launches the job and exits with its exit
code). A later call whose arguments do not fit that signature is refused, naming the argument.

A step that cannot be traced with its batch dimension open (TensorFlow's VAE tutorial draws
``tf.random.normal(shape=mean.shape)``, a shape it needs whole) is traced with the first call's shapes, as
``tf.function`` itself traces a first call: every later call must then give parts of that size, and one that does
not is refused (a last batch that does not divide: ``drop_remainder=True``); the INFO log says why.

An argument that is neither a tensor nor numbers (TensorFlow's VAE tutorial calls ``train_step(model, x,
optimizer)``; a flag ``training=True``; a string; ``None``) is traced as ``tf.function`` traces it, as the Python
value it is (:func:`static`), and every later call must pass that same value: the job's graph is traced once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.logs import log as logger

__all__ = ["DeferredStep", "signature_of", "traceable", "static", "positional"]


def signature_of(args: tuple, num_replicas: int, open_batch: bool = True) -> list:
    """The ``tf.TensorSpec`` structure of one replica's arguments, the batch dimension open, from arguments shaped
    as the step takes them: each tensor (a leaf of an argument's structure) one batch per replica (a list or
    tuple of ``num_replicas`` of them), or the batch itself.

    >>> signature_of(([np.zeros((4, 3), np.float32)], np.arange(4)), 1)
    [TensorSpec(shape=(None, 3), dtype=tf.float32, name=None), TensorSpec(shape=(None,), dtype=tf.int64, name=None)]
    >>> signature_of(({"ids": [np.zeros((2, 5), np.int32)] * 2, "x": [np.zeros((2, 3))] * 2},), 2)[0]["ids"]
    TensorSpec(shape=(None, 5), dtype=tf.int32, name=None)
    >>> signature_of((print, np.zeros(3), True), 1)  # Python values: in the signature as they are (static)
    [<built-in function print>, TensorSpec(shape=(None,), dtype=tf.float64, name=None), True]
    """
    return [_specs(arg, num_replicas, open_batch) for arg in args]


def traceable(fn: Any, args: tuple, num_replicas: int) -> list:
    """The signature to trace ``fn`` with for a first call with ``args``: the batch dimension open, or, where the
    step cannot be traced so (it needs a static batch size), the first call's shapes (see the module docstring).

    Raises:
        Exception: what tracing with the first call's shapes raises (the step's own error), where that fails too.
    """
    signature = signature_of(args, num_replicas)
    try:
        fn.get_concrete_function(*signature)
        return signature
    except (TypeError, ValueError) as e:
        fixed = signature_of(args, num_replicas, open_batch=False)
        # traced by a tf.function of its own first: what the failed trace left unmade (an optimizer's slots) is
        # made there, so that the step's own trace makes no variable on what is no longer its first call
        tf.function(fn.python_function).get_concrete_function(*fixed)
        logger.info("Parallax: the step %r is traced with its first call's shapes: with the batch dimension open it "
                    "fails (%s: %s); every call must give parts of the first call's size",
                    getattr(fn, "python_function", fn).__name__, type(e).__name__, str(e).splitlines()[0] if str(e)
                    else "")
        return fixed


def positional(fn: Any, args: tuple, kwargs: dict) -> tuple:
    """A call's ``args`` and ``kwargs`` as the positional arguments of the ``tf.function`` ``fn`` (its Python
    function's parameters bind them: ``step(x=xs, y=ys)`` is ``step(xs, ys)``), as the step is traced and fed.

    >>> def train_step(x, y, training=True): ...
    >>> positional(train_step, (1,), {"y": 2})
    (1, 2)

    Raises:
        TypeError: arguments the function does not take, or a keyword-only one (the step takes its arguments by
            position), named.
    """
    if not kwargs:
        return args
    python = getattr(fn, "python_function", fn)
    try:
        bound = inspect.signature(python).bind(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise TypeError(f"the step {getattr(python, '__name__', python)!r} was called with arguments it does not "
                        f"take: {e}") from None
    if bound.kwargs:
        raise TypeError(f"the step {python.__name__!r} takes {', '.join(bound.kwargs)} by keyword only; Parallax "
                        "feeds a step's arguments by position: make them positional parameters")
    return bound.args


def static(value: Any) -> bool:
    """Whether a step's argument is a Python value ``tf.function`` traces as it is, not a tensor: neither a
    tensor, an array nor a number (a bool is a value, as ``tf.function`` takes it), nor a list, tuple or dict
    (whose items are looked at one by one): a model, an optimizer, a flag, a string, ``None``."""
    if isinstance(value, (bool, np.bool_)):
        return True
    return not isinstance(value, (tf.Tensor, tf.Variable, np.ndarray, np.generic, int, float, list, tuple, dict))


def _specs(value: Any, num_replicas: int, open_batch: bool) -> Any:
    if static(value):
        return value
    if isinstance(value, (list, tuple)) and len(value) == num_replicas and all(
            isinstance(v, (np.ndarray, tf.Tensor)) for v in value):
        return _spec(value[0], open_batch)  # a tensor's batch on each replica
    if isinstance(value, dict):
        return {k: _specs(v, num_replicas, open_batch) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_specs(v, num_replicas, open_batch) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return _spec(value, open_batch)


def _spec(value: Any, open_batch: bool) -> tf.TensorSpec:
    if isinstance(value, tf.Tensor):
        shape, dtype = value.shape.as_list(), value.dtype
    else:
        array = np.asarray(value)
        shape, dtype = list(array.shape), tf.as_dtype(array.dtype)
    if not shape:
        return tf.TensorSpec([], dtype)
    return tf.TensorSpec([None if open_batch else shape[0], *shape[1:]], dtype)


class DeferredStep:
    """A step traced at its first call (see the module docstring).

    Args:
        fn: the ``tf.function`` without an input signature.
        start: called once, with the signature, at the first call: what ``parallel_run`` returns for the step
            traced with it, ``(step, num_workers, worker_id, num_replicas)`` (or it ends the process, in the
            one that launches the job).
        numbers: ``(num_workers, worker_id, num_replicas)`` as ``parallel_run`` returned them.
    """

    def __init__(self, fn: Any, start: Callable[[list], tuple], numbers: tuple[int, int, int]) -> None:
        self._fn = fn
        self._start = start
        self._numbers = numbers
        self._step: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = positional(self._fn, args, kwargs)
        if self._step is None:
            signature = traceable(self._fn, args, self._numbers[2])
            step, *numbers = self._start(signature)
            if tuple(numbers) != tuple(self._numbers):
                step.close()
                raise RuntimeError(f"parallel_run returned num_workers, worker_id, num_replicas = {self._numbers} "
                                   f"before the step {self._name!r} was traced, and its job has {tuple(numbers)}: give "
                                   "the tf.function an input_signature so that they are known at once")
            self._step = step
        return self._step(*args)

    @property
    def _name(self) -> str:
        return getattr(self._fn, "python_function", self._fn).__name__

    def __getattr__(self, name: str) -> Any:  # session, graph, num_replicas, sync_variables, should_stop
        if name.startswith("_"):
            raise AttributeError(name)
        if self.__dict__.get("_step") is None:
            raise RuntimeError(f"the step {self._name!r} has no input_signature, so it is traced at its first call; "
                               f"call it before asking for its {name}")
        return getattr(self._step, name)

    def close(self) -> None:
        """Close the step's session (a step never called has none)."""
        if self._step is not None:
            self._step.close()

    def __enter__(self) -> DeferredStep:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return exc_type is tf.errors.OutOfRangeError
