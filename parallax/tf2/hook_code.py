"""What a Keras callback's hook can reach, as its code shows (:func:`contained`).

``parallax.fit`` does work after every batch for a callback with batch hooks of its own, because such a hook may
read the batch logs or the model's metrics, set the learning rate or another variable of the step, or stop training
(:mod:`parallax.tf2.batch_hooks`). A hook whose code touches only its own callback's plain data (a timer:
``self.steps += 1; self.times.append(time.perf_counter())``) can do none of that, and ``model.fit``'s batch work is
then Parallax's to skip. The reading is of the hook's bytecode (``dis``) and of the values of the callback's
attributes it names; whatever it cannot see through is taken to reach anything.
"""

from __future__ import annotations

import builtins
import collections
import dis
import inspect
import itertools
from typing import Any

import numpy as np

__all__ = ["contained", "loads_logs", "reads_weights"]

#: attributes through which a hook's code may reach the model, its optimizer and metrics, variables, or frames
_REACH = frozenset({"model", "_model", "optimizer", "metrics", "get_metrics_result", "stop_training", "set_weights",
                    "assign", "assign_add", "assign_sub", "_getframe", "currentframe", "f_back", "f_locals",
                    "get_objects", "get_referrers"})
#: built-ins that touch nothing but their arguments
_PURE = frozenset({abs, all, any, bool, dict, enumerate, float, format, int, isinstance, len, list, max, min, print,
                   range, repr, round, set, sorted, str, sum, tuple, zip})
#: modules whose functions a contained hook may call (none of them reaches a TensorFlow variable)
_MODULES = frozenset({"time", "math", "numpy", "datetime", "statistics", "random", "logging", "sys", "os", "json",
                      "collections", "itertools", "operator"})
#: how a class makes an attribute access run code of its own, beside its properties
_ACCESS = ("__getattr__", "__getattribute__", "__setattr__", "__delattr__")
#: attributes through which code reads a model's weights, or runs the model on them
_WEIGHTS = frozenset({"weights", "trainable_weights", "non_trainable_weights", "trainable_variables",
                      "non_trainable_variables", "variables", "get_weights", "layers", "get_layer", "kernel", "bias",
                      "embeddings", "predict", "predict_on_batch", "evaluate", "test_on_batch", "save", "save_weights",
                      "export"})
#: the methods a contained hook may call: those of Python's containers, strings and NumPy's arrays
_METHODS = frozenset({"append", "extend", "insert", "pop", "clear", "copy", "add", "update", "discard", "remove",
                      "get", "setdefault", "items", "keys", "values", "count", "index", "sort", "format", "join",
                      "split", "strip", "lower", "upper", "startswith", "endswith", "replace", "item", "tolist",
                      "mean", "total_seconds"})


def contained(callback: Any, function: Any) -> bool:
    """Whether ``function``, a hook of ``callback`` (Keras passes ``(batch, logs=...)``), touches only its arguments
    and the callback's own plain data, as its code shows: no ``*args`` or ``**kwargs``, no closure; no attribute of
    :data:`_REACH`; an attribute of the callback (or of its class) it names holds plain data (numbers, strings,
    arrays, containers of them: not a method, nor a property), and its class makes no attribute access its own; the
    methods it calls are those of :data:`_METHODS`; its globals are modules of :data:`_MODULES` and :data:`_PURE`
    built-ins. An attribute the callback does not hold yet (set in ``on_train_begin`` or ``on_epoch_begin``) is
    plain only where every method of its class that sets it is of that kind too (:func:`_setters`). A hook
    whose code cannot be seen (a built-in) is not.
    """
    code = getattr(function, "__code__", None)
    if code is None or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_freevars:
        return False
    if "logs" not in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        return False  # Keras passes logs=...: a hook without the argument takes it some other way
    if any(getattr(type(callback), a, None) is not getattr(object, a, None) for a in _ACCESS):
        return False  # an attribute access of the callback's class's own runs code of its own
    return _plain_code(callback, _codes(code), getattr(function, "__globals__", {}), frozenset())


def _plain_code(callback: Any, codes: list, found: dict, seen: frozenset) -> bool:
    """Whether ``codes`` (a function's and those within it, its globals ``found``) touch only plain data of
    ``callback``'s and call only what :func:`contained` allows; the attributes of ``seen`` are taken as plain (their
    setters are being read)."""
    names = {n for c in codes for n in c.co_names}
    if names & _REACH:
        return False
    kind, own = type(callback), vars(callback)
    for name in names - seen:
        if _held(callback, name):  # on the callback now: plain data (a method or a property runs code of its own)
            if not _plain(own[name] if name in own else getattr(kind, name)):
                return False
        elif not all(_plain_code(callback, _codes(f.__code__), f.__globals__, seen | {name})
                     for f in _setters(kind, name)):
            return False  # an attribute the callback holds only later, set from something else than plain data
    for instruction in (i for c in codes for i in dis.get_instructions(c)):
        if _calls_method(instruction) and instruction.argval not in _METHODS:
            return False
        if instruction.opname == "LOAD_GLOBAL":
            value = found.get(instruction.argval, getattr(builtins, instruction.argval, None))
            if inspect.ismodule(value):
                if value.__name__.split(".")[0] not in _MODULES:
                    return False
            elif not any(value is pure for pure in _PURE):
                return False
    return True


def _held(callback: Any, name: str) -> bool:
    """Whether ``callback`` (or its class) holds an attribute ``name`` now; else its class's :func:`_setters` may set
    it later (``on_train_begin``, ``on_epoch_begin``)."""
    return name in vars(callback) or hasattr(type(callback), name)


def _setters(kind: type, name: str) -> list:
    """The functions of class ``kind`` (and its bases) whose code sets the attribute ``name``."""
    return [f for k in kind.__mro__ if k is not object for f in vars(k).values() if inspect.isfunction(f)
            and any(i.opname == "STORE_ATTR" and i.argval == name for c in _codes(f.__code__)
                    for i in dis.get_instructions(c))]


def reads_weights(callback: Any, function: Any, depth: int = 3) -> bool:
    """Whether ``function``, a hook of ``callback``, may read the model's weights (so that within an epoch it needs
    the weights trained so far), as its code shows: it names one of :data:`_WEIGHTS` (``self.model.get_weights()``,
    ``layer.kernel``, ``self.model.predict(...)``), or a function it calls does (a method of the callback's class, a
    function of the program's, a closure's: ``depth`` calls deep), or the code that set an attribute of the callback
    it reads does (``self.kernel = self.model.trainable_weights[0]`` in ``on_train_begin``). What it reaches through
    other objects' methods is not seen."""
    code = getattr(function, "__code__", None)
    if code is None:
        return True  # a built-in: its code cannot be seen
    names = names_of(function)
    if names & _WEIGHTS:
        return True
    if depth == 0:
        return False
    kind = type(callback)
    setters = [f for n in names if not _held(callback, n) for f in _setters(kind, n)]
    if any(names_of(f) & _WEIGHTS for f in setters):  # the setter's own code: what it calls may set other things
        return True
    called = [getattr(kind, n) for n in names if inspect.isfunction(getattr(kind, n, None))]
    found = getattr(function, "__globals__", {})
    called += [found[n] for n in names if inspect.isfunction(found.get(n))]
    called += [c.cell_contents for c in getattr(function, "__closure__", None) or ()
               if inspect.isfunction(getattr(c, "cell_contents", None))]
    return any(f is not function and reads_weights(callback, f, depth - 1) for f in called)


def names_of(function: Any) -> set:
    """The names ``function``'s code (and the code within it) loads or stores: attributes, globals, methods."""
    return {n for c in _codes(function.__code__) for n in c.co_names}


def loads_logs(function: Any) -> bool:
    """Whether the hook ``function`` (a :func:`contained` one) reads its ``logs`` argument."""
    code = function.__code__
    return "logs" in code.co_cellvars or any(
        i.opname.startswith("LOAD") and "logs" in (i.argval if isinstance(i.argval, tuple) else (i.argval,))
        for i in dis.get_instructions(code))


def _calls_method(instruction: dis.Instruction) -> bool:
    """Whether ``instruction`` loads a method to call (Python 3.11's ``LOAD_METHOD``; 3.12's ``LOAD_ATTR`` that
    pushes the object beside it)."""
    return instruction.opname == "LOAD_METHOD" or (
        instruction.opname == "LOAD_ATTR" and "NULL|self" in (instruction.argrepr or ""))


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data: ``None``, a number, a string, a NumPy value or array of numbers, or (to
    three levels, their first thousand items) a container of plain data."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype != object
    if depth >= 3:
        return False
    if isinstance(value, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in itertools.islice(value.items(), 1000))
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return all(_plain(v, depth + 1) for v in itertools.islice(value, 1000))
    return False


def _codes(code: Any) -> list:
    """``code`` and the code of the functions, lambdas and comprehensions within it."""
    found = [code]
    for constant in code.co_consts:
        if inspect.iscode(constant):
            found.extend(_codes(constant))
    return found
