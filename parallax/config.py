"""User-facing configuration objects, as in the seed API.

``Config`` (also exported as ``ParallaxConfig``), ``CommunicationConfig``,
``PSConfig``, ``MPIConfig``, ``CheckPointConfig`` and ``ProfileConfig`` keep the
seed system's names, arguments and defaults. They stay mutable by attribute
(``cfg.run_option = "PS"`` works, as the seed shows), and every assignment is
checked at once: a bad value raises ``TypeError``/``ValueError`` naming the
field, the value and what is allowed. Rules that involve two fields are
checked by :meth:`validate`, which ``parallel_run`` calls. Parallax never writes
to these objects; it derives its own frozen settings from them.

Example::

    cfg = parallax.Config(run_option="MPI")
    cfg.ckpt_config = parallax.CheckPointConfig(ckpt_dir="/tmp/ckpt", save_ckpt_steps=100)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from dataclasses import fields as fields_of
from typing import Any

__all__ = [
    "Config",
    "OVERRIDE_SYNC",
    "ParallaxConfig",
    "CommunicationConfig",
    "PSConfig",
    "MPIConfig",
    "CheckPointConfig",
    "ProfileConfig",
    "ElasticConfig",
    "Compression",
    "RUN_OPTIONS",
    "COMPRESSIONS",
]

RUN_OPTIONS = ("PS", "MPI", "HYBRID", "AUTO")
NO_COMPRESSION, FP16, BF16, COMPRESSION_AUTO = "none", "fp16", "bf16", "auto"
#: The 16-bit formats gradients may travel in (parallax/comm/compression.py).
COMPRESSED_FORMATS = (FP16, BF16)
#: ``CommunicationConfig.compression``'s values.
COMPRESSIONS = (NO_COMPRESSION, *COMPRESSED_FORMATS, COMPRESSION_AUTO)
#: Horovod's compressor classes (``hvd.Compression.none``, ``hvd.Compression.fp16``), taken for their names.
_HOROVOD_COMPRESSORS = {"NoneCompressor": NO_COMPRESSION, "FP16Compressor": FP16}
PS_PROTOCOLS = ("grpc", "grpc+verbs", "grpc+gdr", "grpc+mpi")


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


def _field(default: Any, check: Callable[[str, str, Any], Any], factory: bool = False) -> Any:
    """A config field: its default (written here once) and the checker every assignment runs."""
    if factory:
        return field(default_factory=default, metadata={"check": check})
    return field(default=default, metadata={"check": check})


class _ConfigBase:
    """Attribute-checked config object.

    Subclasses are dataclasses whose fields come from :func:`_field`: the
    default is written once, in the field, and the signature, ``repr`` and
    ``==`` follow from it. Every assignment (the constructor's too) runs the
    field's checker, so a bad value is reported where it is set, not deep
    inside a run.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dataclass_fields__  # type: ignore[attr-defined]
        if name not in fields:
            allowed = ", ".join(fields)
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; its fields are: {allowed}")
        checker = fields[name].metadata["check"]
        object.__setattr__(self, name, checker(type(self).__name__, name, value))

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check rules that involve more than one field. Raises ValueError."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (nested configs become dicts), for logs and the launcher."""
        out: dict[str, Any] = {}
        for f in fields_of(self):
            value = getattr(self, f.name)
            if isinstance(value, _ConfigBase):
                value = value.to_dict()
            elif f.name == "sess_config" and value is not None:
                value = str(value)
            out[f.name] = value
        return out


# --------------------------------------------------------------------------- #
# PSConfig
# --------------------------------------------------------------------------- #

def _protocol(owner: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{owner}.{field} must be a string, got {_describe(value)}")
    if value not in PS_PROTOCOLS:
        raise ValueError(f"{owner}.{field} is {value!r}; the protocols TensorFlow's servers accept "
                         f"are {', '.join(PS_PROTOCOLS)} (stock TensorFlow builds have only 'grpc')")
    return value


@dataclass(eq=True, repr=True)
class PSConfig(_ConfigBase):
    """How PS (and the PS half of HYBRID) communicates.

    Args:
        protocol: the protocol of TensorFlow's servers: ``"grpc"`` (default;
            the only one in stock TensorFlow 2), ``"grpc+verbs"``,
            ``"grpc+gdr"``, ``"grpc+mpi"`` (the seed's values; ``parallel_run``
            refuses all but ``"grpc"`` before it launches anything,
            :func:`parallax.settings.derive`).
        replicate_variables: each replica reads a local copy of the variables,
            refreshed after every update. Only with ``sync=True``.
        local_aggregation: aggregate the gradients of a host's replicas before
            sending them to the servers.
        boundary_among_servers: place the ops between aggregated gradients and
            the update on the variable's server.
        boundary_between_workers_and_servers: move slicing/gathering to the side
            that sends fewer bytes.
        num_servers: (not in the seed) how many of the job's parameter servers
            hold variables. ``None`` (default): Parallax weighs it, since every
            server that holds a variable is called by every worker's step: a
            server on each host spreads the bytes over more links, one server
            makes fewer calls (``parallax plan`` says what it chose and why).
            An int: that many (all of them when the job has fewer).
    """

    protocol: str = _field("grpc", _protocol)
    replicate_variables: bool = _field(True, _bool)
    local_aggregation: bool = _field(True, _bool)
    boundary_among_servers: bool = _field(True, _bool)
    boundary_between_workers_and_servers: bool = _field(True, _bool)
    num_servers: int | None = _field(None, _positive_int_or_none)


# --------------------------------------------------------------------------- #
# MPIConfig
# --------------------------------------------------------------------------- #

def _mpirun_options(owner: str, field: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return " ".join(str(v) for v in value)
    raise TypeError(f"{owner}.{field} must be a string or a list of strings "
                    f"(e.g. '-mca btl ^openib'), got {_describe(value)}")


#: The all-reduce backends, by name: the one list (:mod:`parallax.comm.registry` maps each to its class).
BACKENDS = ("mpi", "collective", "horovod")
#: What ``MPIConfig.backend`` takes: a backend, or ``auto`` (mpi on CPUs, collective on GPUs).
ALLREDUCE_BACKENDS = ("auto", *BACKENDS)


def _backend(owner: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in ALLREDUCE_BACKENDS:
        raise ValueError(f"{owner}.{field} is {value!r}; allowed: {', '.join(ALLREDUCE_BACKENDS)} "
                         "('auto': mpi on CPUs, collective on GPUs)")
    return value.lower()


def _non_negative_int(owner: str, field: str, value: Any, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner}.{field} must be an int >= 0{unit}, got {_describe(value)}")
    return value


def _fusion_bytes(owner: str, field: str, value: Any) -> int:
    return _non_negative_int(owner, field, value, " (bytes; 0 = no fusion)")


@dataclass(eq=True, repr=True)
class MPIConfig(_ConfigBase):
    """How MPI (and the all-reduce half of HYBRID) communicates.

    Args:
        use_allgatherv: all-gather sparse gradients with MPI ``Allgatherv``
            whatever the all-reduce backend.
        mpirun_options: extra ``mpirun`` options, a string or a list of strings
            (a list is joined with spaces, as in the seed system).
        backend: the all-reduce backend: ``"mpi"`` (mpi4py inside the graph),
            ``"collective"`` (TF collective ops; NCCL on GPUs), ``"horovod"``
            (needs horovod installed), or ``"auto"`` (default: mpi on CPUs,
            collective on GPUs). Not in the seed API.
        fusion_bytes: the mpi backend fuses dense gradients into buffers of at
            most this many bytes (default 64 MiB; 0 sends each on its own).
            Not in the seed API.
        overlap: all-reduce the dense gradients in the order the backward pass
            makes them ready, in buckets, each as soon as its gradients are
            there, while the backward pass computes the rest (default True;
            Horovod's tensor fusion, PyTorch DDP's buckets). False: every
            all-reduce waits for the whole backward pass. Not in the seed API.
    """

    use_allgatherv: bool = _field(False, _bool)
    mpirun_options: str | list[str] = _field("", _mpirun_options)
    backend: str = _field("auto", _backend)
    fusion_bytes: int = _field(64 * 1024 * 1024, _fusion_bytes)
    overlap: bool = _field(True, _bool)


class Compression:
    """The values of ``CommunicationConfig.compression``, by Horovod's names (``hvd.Compression.fp16``).

    ``none``: gradients travel in their own dtype; ``fp16``: in IEEE half precision, scaled (see
    docs/performance.md); ``bf16``: in bfloat16; ``auto``: 16 bits when the job spans several hosts,
    and ``parallax tune`` tries each.
    """

    none = NO_COMPRESSION
    fp16 = FP16
    bf16 = BF16
    auto = COMPRESSION_AUTO


def _compression(owner: str, field: str, value: Any) -> str:
    if value is None:
        return NO_COMPRESSION
    if isinstance(value, type) and value.__name__ in _HOROVOD_COMPRESSORS:
        return _HOROVOD_COMPRESSORS[value.__name__]
    if not isinstance(value, str) or value.lower() not in COMPRESSIONS:
        raise ValueError(f"{owner}.{field} is {_describe(value)}; allowed: {', '.join(map(repr, COMPRESSIONS))}, "
                         "None, or parallax.Compression.<name>")
    return value.lower()


@dataclass(eq=True, repr=True)
class CommunicationConfig(_ConfigBase):
    """The PS and MPI communication settings together.

    Args:
        ps_config: a :class:`PSConfig` (a fresh default one when omitted).
        mpi_config: an :class:`MPIConfig` (a fresh default one when omitted).
        compression: (Parallax only) the format gradients cross processes in: ``"none"`` (default, or
            ``None``: their own dtype), ``"fp16"`` (half precision, scaled), ``"bf16"`` (bfloat16), or
            ``"auto"`` (16 bits across hosts; ``parallax tune`` tries each). It applies to all-reduces,
            all-gathers and pushes to parameter servers; :class:`Compression` names the values,
            Horovod's ``hvd.Compression.none`` and ``.fp16`` are taken too. Results then differ
            from one device's by the format's rounding (docs/performance.md).
    """

    ps_config: PSConfig = _field(PSConfig, _instance_of(lambda: PSConfig), factory=True)
    mpi_config: MPIConfig = _field(MPIConfig, _instance_of(lambda: MPIConfig), factory=True)
    compression: str = _field(NO_COMPRESSION, _compression)


# --------------------------------------------------------------------------- #
# CheckPointConfig
# --------------------------------------------------------------------------- #

@dataclass(eq=True, repr=True)
class CheckPointConfig(_ConfigBase):
    """Checkpointing of the global variables.

    Args:
        ckpt_dir: directory to save checkpoints in and restore the latest from.
        save_ckpt_steps: save every this many global steps.
        save_ckpt_secs: save every this many seconds. At most one of
            ``save_ckpt_steps`` and ``save_ckpt_secs`` may be set.
        checkpoint: (Parallax only) for a ``tf.function`` step: the program's
            ``tf.train.Checkpoint`` (``tf.train.Checkpoint(model=model,
            optimizer=optimizer)``). Its latest save in ``ckpt_dir`` is restored
            before the step is traced, and worker 0 saves it there (TensorFlow 2's
            object form, as the single-device program saves it) every
            ``save_ckpt_steps`` steps or ``save_ckpt_secs`` seconds and when the
            step is closed. See docs/tf2_programs.md.
    """

    ckpt_dir: str | None = _field(None, _optional_str)
    save_ckpt_steps: int | None = _field(None, _positive_int_or_none)
    save_ckpt_secs: float | None = _field(None, _positive_number_or_none)
    checkpoint: Any = _field(None, _tf_checkpoint)

    def validate(self) -> None:
        if self.save_ckpt_steps is not None and self.save_ckpt_secs is not None:
            raise ValueError("CheckPointConfig: set save_ckpt_steps or save_ckpt_secs, not both "
                             f"(got {self.save_ckpt_steps} steps and {self.save_ckpt_secs} secs)")
        if self.ckpt_dir is None and (self.save_ckpt_steps or self.save_ckpt_secs):
            raise ValueError("CheckPointConfig: save_ckpt_steps/save_ckpt_secs need ckpt_dir "
                             "(the directory to save into)")
        if self.ckpt_dir is None and self.checkpoint is not None:
            raise ValueError("CheckPointConfig: checkpoint needs ckpt_dir (the directory to save it into and "
                             "restore its latest save from)")


# --------------------------------------------------------------------------- #
# ElasticConfig
# --------------------------------------------------------------------------- #

@dataclass(eq=True, repr=True)
class ElasticConfig(_ConfigBase):
    """(Parallax only) Restart a launched job that loses a process or a host, from its last checkpoint, on
    the hosts that still answer (docs/launching.md, "Elastic and preemptible jobs"). ``parallax-run``'s
    ``--max-restarts``, ``--min-np``, ``--max-np`` and ``--host-discovery-script`` set these fields (the names
    of torchrun's and horovodrun's options).

    The program must train up to a global step (``tf.compat.v1.train.StopAtStepHook(last_step=...)``, or a
    loop that reads the global step), not for a number of steps: a restarted job resumes at the step of its
    last checkpoint.

    Args:
        max_restarts: restart the job at most this many times; ``0`` (the default) turns elastic mode off:
            a failure ends the job, as without this config.
        min_workers: fewer worker processes than this left: the job ends instead of restarting (default 1).
        max_workers: at most this many worker processes after a restart (the resource file's first ones,
            and then those of discovered hosts); default: every one there is.
        host_discovery_script: a command run before each restart whose output lists the hosts to use,
            one ``host`` or ``host:slots`` a line (horovodrun's convention); ``slots`` caps the worker
            processes on that host. A host the resource file names keeps its lines; another gets the lines
            of the file's first host. ``None``: the resource file's hosts that still answer.
        save_ckpt_steps: when the program sets no ``CheckPointConfig.ckpt_dir``, elastic mode saves one itself
            every this many global steps (into ``parallax_elastic/<script>`` under the directory the program
            runs in, named in the log).
        save_ckpt_secs: ... or every this many seconds (the default, 300, when neither is set).
    """

    max_restarts: int = _field(0, _non_negative_int)
    min_workers: int = _field(1, _positive_int)
    max_workers: int | None = _field(None, _positive_int_or_none)
    host_discovery_script: str | None = _field(None, _optional_str)
    save_ckpt_steps: int | None = _field(None, _positive_int_or_none)
    save_ckpt_secs: float | None = _field(None, _positive_number_or_none)

    @property
    def enabled(self) -> bool:
        """Whether a failure restarts the job."""
        return self.max_restarts > 0

    def validate(self) -> None:
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"ElasticConfig: max_workers ({self.max_workers}) is below min_workers "
                             f"({self.min_workers})")
        if self.save_ckpt_steps is not None and self.save_ckpt_secs is not None:
            raise ValueError("ElasticConfig: set save_ckpt_steps or save_ckpt_secs, not both "
                             f"(got {self.save_ckpt_steps} steps and {self.save_ckpt_secs} secs)")


# --------------------------------------------------------------------------- #
# ProfileConfig
# --------------------------------------------------------------------------- #

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


@dataclass(eq=True, repr=True)
class ProfileConfig(_ConfigBase):
    """Profiling (RunMetadata and Chrome traces) of chosen steps.

    Args:
        profile_dir: directory for the RunMetadata and timeline files.
        profile_steps: a list of steps to profile.
        profile_range: a ``(start, end)`` pair: profile steps ``start <= s < end``.
            Set ``profile_steps`` or ``profile_range``, not both.
        profile_worker: the worker to profile; ``None`` profiles every worker.
    """

    profile_dir: str | None = _field(None, _optional_str)
    profile_steps: list[int] | None = _field(None, _profile_steps)
    profile_range: tuple[int, int] | None = _field(None, _profile_range)
    profile_worker: int | None = _field(None, _profile_worker)

    def validate(self) -> None:
        if self.profile_steps is not None and self.profile_range is not None:
            raise ValueError("ProfileConfig: set profile_steps or profile_range, not both "
                             f"(got profile_steps={list(self.profile_steps)}, "
                             f"profile_range={self.profile_range})")
        if self.profile_dir is None and (self.profile_steps is not None or self.profile_range is not None):
            raise ValueError("ProfileConfig: profile_steps/profile_range need profile_dir "
                             "(the directory to write profiles into)")


# --------------------------------------------------------------------------- #
# Config / ParallaxConfig
# --------------------------------------------------------------------------- #

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


#: The sync methods a plan override may ask for (``Config.plan_overrides``, ``parallax plan --override``).
OVERRIDE_SYNC = ("allreduce", "allgather", "ps")


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


@dataclass(eq=True, repr=True)
class Config(_ConfigBase):
    """Everything that tunes a Parallax run besides the graph and the resources.

    Args:
        run_option: ``"PS"``, ``"MPI"``, ``"HYBRID"`` or ``"AUTO"`` (case does
            not matter); ``None`` means the default, ``"HYBRID"``.
        average_sparse: update sparse variables with the average of the
            replicas' gradients (``True``) or their sum (``False``, the seed's
            default). ``None`` (the default) is the program's own convention: a
            ``tf.compat.v1`` graph sums, as in the seed; a ``tf.function`` step and
            :func:`parallax.fit` average, as ``model.fit`` and TensorFlow's
            distribution strategies do (equal to one device on the union batch).
        sess_config: a ``tf.compat.v1.ConfigProto`` for the session.
        redirect_path: directory for each process's stdout/stderr.
        search_partitions: search the partition count of variables built with
            :func:`parallax.get_partitioner`.
        communication_config: a :class:`CommunicationConfig`.
        ckpt_config: a :class:`CheckPointConfig`.
        profile_config: a :class:`ProfileConfig`.
        elastic_config: (Parallax only) an :class:`ElasticConfig`: restart a launched job that loses a
            process or a host, from its last checkpoint.
        plan_overrides: (Parallax only) per-variable choices that win over
            the run option's: ``{"embedding": "ps", "softmax/*": {"sync":
            "allgather"}, "emb": {"density": 0.02}}``. Keys are variable names
            or globs (a partitioned variable's name covers its parts); values
            a sync method (``"allreduce"``, ``"allgather"``, ``"ps"``) or a
            dict with ``sync`` and/or ``density`` (the fraction of rows one
            worker touches per step, for the cost model). See docs/modes.md.
        hooks: (Parallax only) ``tf.compat.v1.train.SessionRunHook`` objects run with
            every ``sess.run`` in every worker process (each process gets its
            own copies of what the hooks hold; check ``worker_id`` for chief-only
            work). Their ``begin`` sees the rewritten graph.
        export_graph_path: a directory where every process writes the graph it
            runs after the rewrite, as a text ``MetaGraphDef``:
            ``worker-<id>_metagraph`` (in-process replicas: ``worker-0_metagraph``).
            The original Parallax's field of the same name.
        zero_stage: (Parallax only) shard the optimizer's state over the workers
            that all-reduce (ZeRO; MPI and HYBRID): ``0`` off (the default);
            ``1`` each worker keeps and updates ``1/n`` of every dense
            variable's slots (Adam's moments, momentum, accumulators) and the
            updated parts are all-gathered; ``2`` also sums the gradients with a
            reduce-scatter, so each worker gets only its ``1/n`` of them. See
            docs/modes.md.
        pipeline_stages: (Parallax only) cut each replica's forward and backward
            passes into this many stages, each on a device of its own: each
            worker's devices (its resource-file line) are taken this many at a
            time as one replica's stages. Default 1 (no pipeline). See
            docs/modes.md.
        micro_batches: (Parallax only) split each replica's batch into this
            many micro-batches along the first axis of every batch input; their
            gradients are averaged before the one update, so a step equals one
            step on the whole batch. Default 1.
        pipeline_cuts: (Parallax only) the scopes (or ops) where stages
            ``1 .. k-1`` begin, in the order the model makes them, instead of
            cuts chosen by estimated cost; ``pipeline_stages`` then defaults to
            ``len(pipeline_cuts) + 1``.
        pipeline_schedule: (Parallax only) ``"gpipe"`` (default: TensorFlow runs each op
            when its inputs are there, so forwards may run ahead of backwards) or ``"1f1b"``
            (on stage ``s`` of ``k``, micro-batch ``j``'s forward waits for micro-batch
            ``j-(k-s)``'s backward there: at most ``k-s`` micro-batches' activations are kept).
        device_memory: (Parallax only) the memory one device may give the model's
            variables and optimizer slots, in bytes or as ``"16GB"``: when they do
            not fit one device, the plan cuts each replica into the fewest
            pipeline stages (devices) in which each part fits (model
            parallelism); a pipeline whose stage does not fit is refused.
        stall_timeout: (Parallax only) seconds a launched process may wait for
            its peers (in ``sess.run`` or while its session starts) before the
            launcher prints who waits for whom and where; again every that many
            seconds while it lasts. ``None`` turns the check off. Default 30.
        stall_shutdown: (Parallax only) seconds a launched process may wait for its peers (in ``sess.run``
            or while its session starts) before the launcher ends the job, with the stall report as the reason
            and exit code 1 (an elastic job restarts: the stall counts as a failure). Default 900: longer than
            a slow first step (XLA compiling a large model, a cold input pipeline filling its buffers) takes, so
            that only a job that truly hangs is ended. ``None``: never. Needs ``stall_timeout`` (the check
            that sees the wait).
        check_first_step: (Parallax only) before a ``tf.function`` step's (or ``parallax.fit``'s) first step,
            worker 0 checks that the gradient of its part is the mean of its halves' and says at WARNING
            where it is not (batch statistics, an op over the batch, random draws: the result then differs
            from one device): :mod:`parallax.tf2.first_step`. Default ``True``.
        sync_batch_norm: (Parallax only) every batch normalisation of ``parallax.fit``'s model (Keras 3's
            ``BatchNormalization``, tf_keras's) normalises by the statistics of the whole global batch, summed
            over every replica of the job in the forward pass and their gradients in the backward one, as
            ``BatchNormalization(synchronized=True)`` asks for itself: training then equals one device's. A
            layer that asks so is synchronised whatever this says (:mod:`parallax.tf2.replica_sums`).
            Default ``False``: each replica normalises its part by its part's statistics (said at WARNING).
        staggered_start: (Parallax only) on each host, the first process of a launched job runs the program up
            to its training call before the host's other processes start, so that data the program downloads
            or extracts is written once, not by every process at the same time (:mod:`parallax.member.entry`).
            Costs that first process's way to the training call, once per host. Default ``True``.
    """

    run_option: str | None = _field(None, _run_option)
    average_sparse: bool | None = _field(None, _optional_bool)
    sess_config: Any = _field(None, _sess_config)
    redirect_path: str | None = _field(None, _optional_str)
    search_partitions: bool = _field(False, _bool)
    communication_config: CommunicationConfig = _field(
        CommunicationConfig, _instance_of(lambda: CommunicationConfig), factory=True)
    ckpt_config: CheckPointConfig = _field(CheckPointConfig, _instance_of(lambda: CheckPointConfig), factory=True)
    profile_config: ProfileConfig = _field(ProfileConfig, _instance_of(lambda: ProfileConfig), factory=True)
    plan_overrides: dict[str, Any] | None = _field(dict, _plan_overrides, factory=True)
    hooks: list | None = _field(tuple, _hooks, factory=True)
    export_graph_path: str | None = _field(None, _optional_str)
    stall_timeout: float | None = _field(30.0, _positive_number_or_none)
    zero_stage: int = _field(0, _zero_stage)
    pipeline_stages: int = _field(1, _positive_int)
    micro_batches: int = _field(1, _positive_int)
    pipeline_cuts: list | None = _field(tuple, _scope_list, factory=True)
    device_memory: int | str | None = _field(None, _bytes_or_none)
    pipeline_schedule: str = _field("gpipe", _schedule)
    elastic_config: ElasticConfig = _field(ElasticConfig, _instance_of(lambda: ElasticConfig), factory=True)
    check_first_step: bool = _field(True, _bool)
    stall_shutdown: float | None = _field(900.0, _positive_number_or_none)
    staggered_start: bool = _field(True, _bool)
    sync_batch_norm: bool = _field(False, _bool)

    @property
    def stages(self) -> int:
        """The pipeline's stages: ``pipeline_stages``, or one more than the cuts named."""
        return len(self.pipeline_cuts) + 1 if self.pipeline_cuts and self.pipeline_stages == 1 \
            else self.pipeline_stages

    def validate(self, sync: bool = True) -> None:
        """Check the whole configuration, nested configs included.

        Args:
            sync: the ``sync`` argument of ``parallel_run``.

        Raises:
            ValueError: a rule across fields is broken.
        """
        self.ckpt_config.validate()
        self.profile_config.validate()
        self.elastic_config.validate()
        if not sync and self.run_option in ("MPI", "HYBRID", "AUTO"):
            raise ValueError(f"sync=False needs run_option='PS' (got run_option={self.run_option!r}): "
                             "all-reduce is synchronous by nature")
        if self.zero_stage and self.run_option == "PS":
            raise ValueError(f"zero_stage={self.zero_stage} shards optimizer states over workers that all-reduce; "
                             "run_option='PS' has none (its servers hold each variable once already): use 'MPI' "
                             "or 'HYBRID'")
        if self.zero_stage and not sync:
            raise ValueError(f"zero_stage={self.zero_stage} needs synchronous training (sync=True)")
        if self.pipeline_cuts and self.stages != len(self.pipeline_cuts) + 1:
            raise ValueError(f"pipeline_cuts names {len(self.pipeline_cuts)} cut(s), which make "
                             f"{len(self.pipeline_cuts) + 1} stages, but pipeline_stages={self.pipeline_stages}")
        if (self.stages > 1 or self.micro_batches > 1) and not sync:
            raise ValueError(f"pipeline_stages={self.stages}, micro_batches={self.micro_batches}: a pipeline "
                             "averages its micro-batches' gradients before one synchronous update; it needs "
                             "sync=True")


ParallaxConfig = Config
