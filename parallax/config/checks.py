"""Field checkers: each takes (owner name, field name, value) and returns the value to store, or raises
``TypeError``/``ValueError`` naming the field, the value and what is allowed (:func:`parse_bytes` reads the
sizes they take)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parallax.config.values import (
    _HOROVOD_COMPRESSORS,
    ALLREDUCE_BACKENDS,
    COMPRESSIONS,
    NO_COMPRESSION,
    OVERRIDE_SYNC,
    PS_PROTOCOLS,
    RUN_OPTIONS,
)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


# --------------------------------------------------------------------------- #
# Field checkers: each takes (owner name, field name, value) and returns the
# value to store, or raises. Kept small and shared by every config class.
# --------------------------------------------------------------------------- #

def _bool(owner: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{field} must be True or False, got {_describe(value)}")
    return value


def _optional_bool(owner: str, field: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{owner}.{field} must be True, False or None, got {_describe(value)}")
    return value


def _optional_str(owner: str, field: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{owner}.{field} must be a string or None, got {_describe(value)}")
    if value == "":
        raise ValueError(f"{owner}.{field} must not be empty; use None to leave it unset")
    return value


def _positive_int_or_none(owner: str, field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{field} must be a positive int or None, got {_describe(value)}")
    if value <= 0:
        raise ValueError(f"{owner}.{field} must be a positive int or None, got {value}")
    return value


def _positive_number_or_none(owner: str, field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}.{field} must be a positive number of seconds or None, "
                        f"got {_describe(value)}")
    if value <= 0:
        raise ValueError(f"{owner}.{field} must be a positive number of seconds or None, got {value}")
    return value


def _tf_checkpoint(owner: str, field: str, value: Any) -> Any:
    if value is None:
        return None
    import tensorflow as tf  # local: keep `import parallax.config` light

    if not isinstance(value, tf.train.Checkpoint):
        raise TypeError(f"{owner}.{field} must be a tf.train.Checkpoint of the step's objects "
                        f"(tf.train.Checkpoint(model=model, optimizer=optimizer)) or None, got {_describe(value)}")
    return value


def _zero_stage(owner: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (0, 1, 2):
        raise ValueError(f"{owner}.{field} must be 0 (off), 1 (optimizer states sharded) or 2 (and gradients), "
                         f"got {_describe(value)}")
    return value


def _positive_int(owner: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{field} must be a positive int, got {_describe(value)}")
    return value


def _non_negative_int(owner: str, field: str, value: Any, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}.{field} must be an int >= 0{unit}, got {_describe(value)}")
    return value


def _scope_list(owner: str, field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"{owner}.{field} must be a list of op or scope names (non-empty strings), "
                        f"got {_describe(value)}")
    return tuple(value)


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_bytes(text: str, where: str) -> int:
    """``"16GB"``, ``"512MiB"``, ``"1000"``: a number of bytes.

    >>> parse_bytes("1.5GiB", "x"), parse_bytes("200kB", "x")
    (1610612736, 200000)

    Raises:
        ValueError: naming ``where`` and what was expected.
    """
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"{where} must be a size such as 16GB, 512MiB or 1000000 (bytes), got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _bytes_or_none(owner: str, field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_bytes(value, f"{owner}.{field}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{field} must be a positive number of bytes (or a size such as '16GB'), "
                         f"got {_describe(value)}")
    return value


def _schedule(owner: str, field: str, value: Any) -> str:
    if value not in ("gpipe", "1f1b"):
        raise ValueError(f"{owner}.{field} must be 'gpipe' (forwards may run ahead of backwards) or '1f1b' (a "
                         f"stage's forward waits for the backward the stages after it need), got {_describe(value)}")
    return value


def _instance_of(cls_getter: Callable[[], type]) -> Callable:
    """A checker for a nested config; ``None`` stands for a fresh default one."""
    def check(owner: str, field: str, value: Any) -> Any:
        cls = cls_getter()
        if value is None:
            return cls()
        if not isinstance(value, cls):
            raise TypeError(f"{owner}.{field} must be a parallax.{cls.__name__}, "
                            f"got {_describe(value)}")
        return value
    return check


# --------------------------------------------------------------------------- #
# Checkers of one config class's fields, in the order of the classes.
# --------------------------------------------------------------------------- #

def _protocol(owner: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{field} must be a string, got {_describe(value)}")
    if value not in PS_PROTOCOLS:
        raise ValueError(f"{owner}.{field} is {value!r}; the protocols TensorFlow's servers accept "
                         f"are {', '.join(PS_PROTOCOLS)} (stock TensorFlow builds have only 'grpc')")
    return value


def _mpirun_options(owner: str, field: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return " ".join(str(v) for v in value)
    raise TypeError(f"{owner}.{field} must be a string or a list of strings "
                    f"(e.g. '-mca btl ^openib'), got {_describe(value)}")


def _backend(owner: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in ALLREDUCE_BACKENDS:
        raise ValueError(f"{owner}.{field} is {value!r}; allowed: {', '.join(ALLREDUCE_BACKENDS)} "
                         "('auto': mpi on CPUs, collective on GPUs)")
    return value.lower()


def _fusion_bytes(owner: str, field: str, value: Any) -> int:
    return _non_negative_int(owner, field, value, " (bytes; 0 = no fusion)")


def _compression(owner: str, field: str, value: Any) -> str:
    if value is None:
        return NO_COMPRESSION
    if isinstance(value, type) and value.__name__ in _HOROVOD_COMPRESSORS:
        return _HOROVOD_COMPRESSORS[value.__name__]
    if not isinstance(value, str) or value.lower() not in COMPRESSIONS:
        raise ValueError(f"{owner}.{field} is {_describe(value)}; allowed: {', '.join(map(repr, COMPRESSIONS))}, "
                         "None, or parallax.Compression.<name>")
    return value.lower()


def _profile_steps(owner: str, field: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{owner}.{field} must be a list of step numbers, got {_describe(value)}")
    steps = list(value)
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"{owner}.{field} must hold non-negative ints, got {s!r} in {steps!r}")
    return tuple(sorted(set(steps)))


def _profile_range(owner: str, field: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        raise TypeError(f"{owner}.{field} must be a (start, end) pair of ints, got {_describe(value)}")
    start, end = value
    if start < 0 or end <= start:
        raise ValueError(f"{owner}.{field} must satisfy 0 <= start < end, got ({start}, {end})")
    return (start, end)


def _profile_worker(owner: str, field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}.{field} must be a worker id (int >= 0) or None for every worker, "
                         f"got {_describe(value)}")
    return value


def _run_option(owner: str, field: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], str):
        raise TypeError(f"{owner}.{field} must be a string, got the tuple {value!r}; "
                        "is there a stray trailing comma after the assignment?")
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{field} must be one of {', '.join(RUN_OPTIONS)} or None, "
                        f"got {_describe(value)}")
    if value.upper() not in RUN_OPTIONS:
        raise ValueError(f"{owner}.{field} is {value!r}; allowed: {', '.join(RUN_OPTIONS)} "
                         "(or None for the default, HYBRID)")
    return value.upper()


def _sess_config(owner: str, field: str, value: Any) -> Any:
    if value is None:
        return None
    from tensorflow.core.protobuf import config_pb2  # local: keep `import parallax.config` light

    if not isinstance(value, config_pb2.ConfigProto):
        raise TypeError(f"{owner}.{field} must be a tf.compat.v1.ConfigProto or None, "
                        f"got {_describe(value)}")
    return value


def _plan_overrides(owner: str, field: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{owner}.{field} must be a dict from variable names (or globs) to a sync method "
                        f"or to {{'sync': ..., 'density': ...}}, got {_describe(value)}")
    checked: dict[str, Any] = {}
    for name, entry in value.items():
        where = f"{owner}.{field}[{name!r}]"
        if not isinstance(name, str) or not name:
            raise TypeError(f"{owner}.{field}: keys must be variable names or globs, got {_describe(name)}")
        if isinstance(entry, str):
            entry = {"sync": entry}
        if not isinstance(entry, dict) or not entry or set(entry) - {"sync", "density", "stage"}:
            raise ValueError(f"{where} must be one of {', '.join(OVERRIDE_SYNC)} or a dict with keys "
                             f"'sync', 'density' and/or 'stage', got {_describe(entry)}")
        if "stage" in entry and (isinstance(entry["stage"], bool) or not isinstance(entry["stage"], int)
                                 or entry["stage"] < 0):
            raise ValueError(f"{where}: stage must be a pipeline stage's index (an int >= 0), "
                             f"got {_describe(entry['stage'])}")
        if "sync" in entry and entry["sync"] not in OVERRIDE_SYNC:
            raise ValueError(f"{where}: sync must be one of {', '.join(OVERRIDE_SYNC)}, got {entry['sync']!r}")
        if "density" in entry:
            d = entry["density"]
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d <= 1:
                raise ValueError(f"{where}: density must be a number in (0, 1] (the fraction of rows one "
                                 f"worker's gradient touches per step), got {_describe(d)}")
        checked[name] = dict(entry)
    return checked


def _hooks(owner: str, field: str, value: Any) -> tuple:
    if value is None:
        return ()
    import tensorflow as tf  # local: keep `import parallax.config` light

    if not isinstance(value, (list, tuple)) or not all(isinstance(h, tf.compat.v1.train.SessionRunHook)
                                                       for h in value):
        raise TypeError(f"{owner}.{field} must be a list of tf.compat.v1.train.SessionRunHook objects, "
                        f"got {_describe(value)}")
    return tuple(value)
