"""The records an :class:`~parallax.invocation.Invocation` is made of, and how each control variable's text is
read into its field and written back.

Every reader here raises :class:`ValueError` naming the variable, the text and what was expected: a bad value
is reported once, where the invocation is read (``parallel_run``, a command), not by the module that uses it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = ["Kind", "PlanRequest", "TrialRequest", "LaunchIdentity", "RankChannel", "CommTuning", "SearchRequest",
           "READERS", "WRITERS", "PLAN_ENV", "TRIAL_ENV", "LAUNCH_ENV"]

PLAN_ENV = "PARALLAX_PLAN_ONLY"
TRIAL_ENV = "PARALLAX_TRIAL"
LAUNCH_ENV = "PARALLAX_LAUNCH"


class Kind(str, Enum):
    """What a process is (:attr:`~parallax.invocation.Invocation.kind`; the package docstring's table). A
    ``str``: ``Kind.PLAN == "plan"``."""

    PLAN = "plan"
    MANIFEST = "manifest"
    TUNE = "tune"
    TRIAL = "trial"
    LAUNCHED = "launched"
    MANAGED = "managed"
    PLAIN = "plain"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PlanRequest:
    """What ``parallax plan``, ``parallax manifest`` or ``parallax tune`` asks of the script's ``parallel_run``
    (:data:`PLAN_ENV`): its resource file, run option, plan overrides and config fields replace the script's.

    Attributes:
        manager: the cluster manager the planned processes would be started by (``"TF_CONFIG"``), or ``None``.
        tune: ``parallax tune``'s request (``{"space": ...}``): list every layout instead of the script's.
        manifest: ``parallax manifest``'s request (its kind, command, image, ...): write those files.
        output: the file the answer goes to (the plan's JSON; the candidates).
    """

    resource_info: str | None = None
    run_option: str | None = None
    overrides: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)
    manager: str | None = None
    tune: dict | None = None
    manifest: dict | None = None
    output: str | None = None

    @property
    def kind(self) -> Kind:
        return Kind.TUNE if self.tune is not None else Kind.MANIFEST if self.manifest else Kind.PLAN

    @classmethod
    def from_json(cls, text: str) -> PlanRequest:
        try:
            data = json.loads(text)
            known = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known and v is not None})
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{PLAN_ENV}={text[:200]!r}: expected the JSON parallax plan, manifest or tune "
                             "writes; unset it to run the script") from e

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None}, sort_keys=True)


@dataclass(frozen=True)
class TrialRequest:
    """What a trial measures (:data:`TRIAL_ENV`): the choice it tries, the steps it discards and the ones it
    times."""

    choice: dict[str, Any] = field(default_factory=dict)
    warmup: int = 2
    steps: int = 5

    @classmethod
    def from_json(cls, text: str) -> TrialRequest:
        try:
            data = json.loads(text)
            return cls(dict(data.get("choice") or {}), max(0, int(data.get("warmup", 2))),
                       max(1, int(data.get("steps", 5))))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{TRIAL_ENV}={text!r}: expected JSON like "
                             '{"choice": {...}, "warmup": 2, "steps": 5}') from e

    def to_json(self) -> str:
        return json.dumps({"choice": self.choice, "warmup": self.warmup, "steps": self.steps}, sort_keys=True)


@dataclass(frozen=True)
class LaunchIdentity:
    """What the launcher told a rank (:data:`LAUNCH_ENV`): every rank of the job, as layout JSON
    (:func:`parallax.launch.layout.layout_from_json`), and what the ranks must agree on with the launcher.

    Attributes:
        layout: the job plan's layout (``"MPI"``, ``"PS"``, ...); ``None`` for plain ranks.
        digest: the job plan's digest.
        gpus: how many GPUs a bare host line stands for.
        allocation: the resources the launcher read from its environment (``{"text", "source"}``: a Slurm
            allocation), which a rank's own environment does not describe.
        staggered: the host's first rank runs the program up to its training call before the host's other
            ranks start (``Config.staggered_start``, :mod:`parallax.member.entry`).
        bound_cores: the cores ``mpirun`` binds each rank to, its own (:func:`parallax.launch.command.placement`);
            ``None``: the ranks are not bound and share their host's cores.
        seed: the seed every rank's Python, NumPy and TensorFlow random generators start from, drawn once a job
            (:mod:`parallax.member.seeds`); ``None``: left as they are.
    """

    ranks: str
    layout: str | None = None
    digest: str | None = None
    gpus: int | None = None
    allocation: dict | None = None
    staggered: bool = False
    bound_cores: int | None = None
    seed: int | None = None

    @classmethod
    def from_json(cls, text: str) -> LaunchIdentity:
        try:
            data = json.loads(text)
            job = data.get("job") or {}
            return cls(data["ranks"], job.get("layout"), job.get("digest"), job.get("gpus"), job.get("allocation"),
                       bool(job.get("staggered", False)), job.get("bound_cores"), job.get("seed"))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{LAUNCH_ENV}: expected the launcher's JSON, got {text[:200]!r}") from e

    def to_json(self) -> str:
        job = {k: v for k, v in (("layout", self.layout), ("digest", self.digest), ("gpus", self.gpus),
                                 ("allocation", self.allocation), ("staggered", self.staggered or None),
                                 ("bound_cores", self.bound_cores), ("seed", self.seed))
               if v is not None}
        return json.dumps({"job": job, "ranks": self.ranks}, sort_keys=True)


@dataclass(frozen=True)
class RankChannel:
    """How a launched rank reaches its launcher (``PARALLAX_JOB_DIR``, ``PARALLAX_MONITOR``,
    ``PARALLAX_STALL_TIMEOUT``): all ``None`` outside a launched job.

    Attributes:
        job_dir: where ranks register for failure reports.
        monitor: the launcher's stall monitor's ``host:port`` (``None``: it runs none).
        stall_timeout: seconds without a heartbeat that make a stall.
    """

    job_dir: str | None = None
    monitor: str | None = None
    stall_timeout: float | None = None


@dataclass(frozen=True)
class CommTuning:
    """How the communication of this process is tuned beyond its config (``PARALLAX_NATIVE_OPS``,
    ``PARALLAX_HUGE_PAGES``, ``PARALLAX_ARRIVAL_SPIN_US``, ``PARALLAX_SLOT_DEVICE``).

    Attributes:
        native_ops: the mpi backend sums through its compiled op (``False``: through Python).
        huge_pages: the compiled op's large buffers ask for transparent huge pages.
        arrival_spin: ``None`` (decided per job), ``"off"``, or the seconds awake before the mpi backend
            waits asleep for late members (:attr:`parallax.job.settings.Settings.arrival_spin`).
        slot_device: the device each slot of an MPIJob's hostfile stands for (``"cpu"`` or ``"gpu"``).
    """

    native_ops: bool = True
    huge_pages: bool = True
    arrival_spin: float | str | None = None
    slot_device: str = "cpu"


@dataclass(frozen=True)
class SearchRequest:
    """How the partition search runs and what it was given (``PARALLAX_NUM_PARTITIONS``,
    ``PARALLAX_SEARCH_STEPS``, ``PARALLAX_TRIAL_BACKEND``, ``PARALLAX_DASK_SCHEDULER``,
    ``PARALLAX_TRIAL_TIMEOUT``, ``PARALLAX_RERUN``; :mod:`parallax.tuning.search`).

    Attributes:
        partitions: the partition count ``get_partitioner`` gives (``None``: its own minimum).
        steps: a trial's ``(warm-up, timed)`` steps.
        backend: where the trials run: ``local`` or ``dask``.
        scheduler: a running Dask scheduler's address, for the dask backend.
        trial_timeout: seconds a trial may run.
        rerun: this process is the script run again by the process the user started, with a tuned or searched
            partition count.
    """

    partitions: int | None = None
    steps: tuple[int, int] = (2, 5)
    backend: str = "local"
    scheduler: str | None = None
    trial_timeout: float = 600.0
    rerun: bool = False


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(name: str, text: str) -> bool:
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"{name}={text!r}: expected 1 or 0 (true/false, yes/no, on/off)")
    return word in _TRUE


def _count(name: str, text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{name}={text!r}: expected a count (a whole number, e.g. 8)")
    return int(text.strip())


def _seconds(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected seconds (a number)") from None


def _json(name: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={text[:200]!r}: expected a JSON object")
    return value


def _steps(name: str, text: str) -> tuple[int, int]:
    try:
        warmup, timed = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected 'warmup,timed', e.g. '2,5'") from None
    return max(0, warmup), max(1, timed)


def _spin(name: str, text: str) -> float | str | None:
    text = text.strip()
    if not text:
        return None
    if text.lower() == "off":
        return "off"
    try:
        micros = float(text)
    except ValueError:
        micros = -1.0
    if not micros >= 0:
        raise ValueError(f"{name}={text!r}: expected 'off' or microseconds (a number >= 0)")
    return micros * 1e-6


def _shutdown(name: str, text: str) -> float | str:
    return "none" if text.strip().lower() == "none" else _seconds(name, text)


def _word(default: str):
    """A reader of a lower-case word, ``default`` for blanks."""
    return lambda name, text: text.strip().lower() or default


#: How the text of a variable of each form becomes its field's value (``form(name, text)``).
READERS = {
    "text": lambda name, text: text,
    "device": _word("cpu"),
    "backend": _word("local"),
    "flag": _flag,
    "count": _count,
    "seconds": _seconds,
    "json": _json,
    "steps": _steps,
    "spin": _spin,
    "shutdown": _shutdown,
    "plan": lambda name, text: PlanRequest.from_json(text),
    "trial": lambda name, text: TrialRequest.from_json(text),
    "launch": lambda name, text: LaunchIdentity.from_json(text),
}


def _number(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


#: A field's value of each form as its variable's text (:data:`READERS` backwards); a ``str`` is written as is.
WRITERS = {
    "flag": lambda value: "1" if value else "0",
    "count": str,
    "seconds": _number,
    "json": lambda value: json.dumps(value, sort_keys=True),
    "steps": lambda value: f"{value[0]},{value[1]}",
    "spin": lambda value: f"{value * 1e6:g}",
    "shutdown": _number,
    "plan": lambda value: value.to_json(),
    "trial": lambda value: value.to_json(),
    "launch": lambda value: value.to_json(),
}
