"""Who this process is and what it was asked to do, as its environment says: the one reader and writer of
Parallax's control variables (``PARALLAX_*``, and ``TF_CONFIG`` of a cluster manager's task).

:func:`current` turns the environment into a frozen :class:`Invocation`; :meth:`Invocation.to_env` turns one
back into variables (the launcher gives every rank those :data:`FORWARDED` lists). What a process is
(:attr:`Invocation.kind`):

====================  ===========================================================================
``plan``              ``parallax plan``: print the job plan and exit (:class:`PlanRequest`)
``manifest``          ``parallax manifest``: write a cluster manager's files and exit
``tune``              ``parallax tune``'s first step: list the layouts to try and exit
``trial``             a trial of ``parallax tune`` or of the partition search (:class:`TrialRequest`)
``launched``          a rank the launcher started (:class:`LaunchIdentity`)
``managed``           a task a cluster manager started (``TF_CONFIG``)
``plain``             the process the user started: plan the job and train here, or launch it
====================  ===========================================================================

Every other setting of the table :data:`CONTROLS` is a field of :class:`Invocation` too, read where it is
used (``invocation.current().finish_timeout``; :func:`setting` reads one without parsing the rest). No other
module reads these variables; the modules that give them to a child process build its environment with
:meth:`Invocation.to_env` or :func:`env_with`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Control", "CONTROLS", "FORWARDED", "Invocation", "PlanRequest", "TrialRequest", "LaunchIdentity",
           "current", "setting", "env_with", "export", "RESOURCE_ENV", "RUN_OPTION_ENV", "MPIRUN_OPTIONS_ENV",
           "DRY_RUN_ENV", "PLAN_ENV", "SKIP_CHECK_ENV", "LAUNCH_ENV", "JOB_DIR_ENV", "MONITOR_ENV", "STALL_ENV",
           "LEVEL_ENV", "TRIAL_ENV", "RESULT_ENV", "PARAMS_ENV", "TUNED_ENV", "USE_TUNED_ENV", "PARTITIONS_ENV",
           "SEARCH_STEPS_ENV", "CACHE_ENV", "TRIAL_BACKEND_ENV", "SCHEDULER_ENV", "TRIAL_TIMEOUT_ENV",
           "FINISH_TIMEOUT_ENV", "ARRIVAL_SPIN_ENV", "NATIVE_OPS_ENV", "HUGE_PAGES_ENV", "SLOT_DEVICE_ENV",
           "TF_CONFIG_ENV", "RERUN_ENV", "ELASTIC_ENV", "ELASTIC_CKPT_ENV", "STALL_SHUTDOWN_ENV",
           "STAGGERED_ENV"]


@dataclass(frozen=True)
class Control:
    """A control variable: its name, the :class:`Invocation` field it fills, whether the launcher gives it to
    every rank, and what sets it."""

    name: str
    attr: str
    forwarded: bool
    doc: str


RESOURCE_ENV = "PARALLAX_RESOURCE_INFO"
RUN_OPTION_ENV = "PARALLAX_RUN_OPTION"
MPIRUN_OPTIONS_ENV = "PARALLAX_MPIRUN_OPTIONS"
DRY_RUN_ENV = "PARALLAX_DRY_RUN"
PLAN_ENV = "PARALLAX_PLAN_ONLY"
SKIP_CHECK_ENV = "PARALLAX_SKIP_HOST_CHECK"
LAUNCH_ENV = "PARALLAX_LAUNCH"
JOB_DIR_ENV = "PARALLAX_JOB_DIR"
MONITOR_ENV = "PARALLAX_MONITOR"
STALL_ENV = "PARALLAX_STALL_TIMEOUT"
LEVEL_ENV = "PARALLAX_LOG_LEVEL"
TRIAL_ENV = "PARALLAX_TRIAL"
RESULT_ENV = "PARALLAX_TRIAL_RESULT"
PARAMS_ENV = "PARALLAX_SWEEP_PARAMS"
TUNED_ENV = "PARALLAX_TUNED"
USE_TUNED_ENV = "PARALLAX_USE_TUNED"
PARTITIONS_ENV = "PARALLAX_NUM_PARTITIONS"
SEARCH_STEPS_ENV = "PARALLAX_SEARCH_STEPS"
CACHE_ENV = "PARALLAX_CACHE_DIR"
TRIAL_BACKEND_ENV = "PARALLAX_TRIAL_BACKEND"
SCHEDULER_ENV = "PARALLAX_DASK_SCHEDULER"
TRIAL_TIMEOUT_ENV = "PARALLAX_TRIAL_TIMEOUT"
FINISH_TIMEOUT_ENV = "PARALLAX_FINISH_TIMEOUT"
ARRIVAL_SPIN_ENV = "PARALLAX_ARRIVAL_SPIN_US"
NATIVE_OPS_ENV = "PARALLAX_NATIVE_OPS"
HUGE_PAGES_ENV = "PARALLAX_HUGE_PAGES"
SLOT_DEVICE_ENV = "PARALLAX_SLOT_DEVICE"
TF_CONFIG_ENV = "TF_CONFIG"
RERUN_ENV = "PARALLAX_RERUN"
ELASTIC_ENV = "PARALLAX_ELASTIC"
STALL_SHUTDOWN_ENV = "PARALLAX_STALL_SHUTDOWN"
ELASTIC_CKPT_ENV = "PARALLAX_ELASTIC_CKPT"
STAGGERED_ENV = "PARALLAX_STAGGERED_START"

#: Every control variable, by name.
CONTROLS: dict[str, Control] = {c.name: c for c in (
    Control(RESOURCE_ENV, "resource_info", True,
            "parallax-run: the resource file every parallel_run of the script uses instead of its own"),
    Control(RUN_OPTION_ENV, "run_option", True,
            "parallax manifest --run_option (or by hand): the run option that replaces Config.run_option"),
    Control(MPIRUN_OPTIONS_ENV, "mpirun_options", True,
            "parallax-run: mpirun options added to MPIConfig.mpirun_options"),
    Control(DRY_RUN_ENV, "dry_run", False,
            "parallax-run --dry_run: a file; parallel_run writes the command it would run there and exits"),
    Control(PLAN_ENV, "plan", False,
            "parallax plan / manifest / tune: JSON of a PlanRequest; parallel_run answers it and exits"),
    Control(SKIP_CHECK_ENV, "skip_host_check", False,
            "1: skip the hosts' check before a job on several machines"),
    Control(LAUNCH_ENV, "launch", False,
            "the launcher, to every rank: the ranks and what they must agree on with it (JSON)"),
    Control(JOB_DIR_ENV, "job_dir", False,
            "the launcher, to every rank: where ranks register for failure reports"),
    Control(MONITOR_ENV, "monitor", False,
            "the launcher, to every rank: its stall monitor's host:port"),
    Control(STALL_ENV, "stall_timeout", False,
            "the launcher, to every rank: seconds without a heartbeat that make a stall"),
    Control(LEVEL_ENV, "log_level", False,
            "the parallax logger's level (a number, or DEBUG, INFO, WARNING, ERROR); ranks log at INFO"),
    Control(TRIAL_ENV, "trial", True,
            "a trial's runner: the choice it tries and the steps it times (JSON of a TrialRequest)"),
    Control(RESULT_ENV, "trial_result", True,
            "a trial's runner: the file its result is written to"),
    Control(PARAMS_ENV, "sweep_params", True,
            "a sweep's trial: the parameters it tries (JSON), for every process of its job"),
    Control(TUNED_ENV, "tuned", True,
            "the process the user started, to the ones it launches: the tuned choice they apply (JSON)"),
    Control(USE_TUNED_ENV, "use_tuned", True,
            "0, false, no or off: ignore what parallax tune stored"),
    Control(PARTITIONS_ENV, "partitions", True,
            "a partition search (or by hand): the partition count get_partitioner gives"),
    Control(SEARCH_STEPS_ENV, "search_steps", True,
            "a partition search's trial: 'warmup,timed' steps (default 2,5)"),
    Control(CACHE_ENV, "cache_dir", True,
            "where the compiled op, the tuned layouts and the searches' results are kept (~/.cache/parallax)"),
    Control(TRIAL_BACKEND_ENV, "trial_backend", False,
            "where a partition search's trials run: local (default) or dask"),
    Control(SCHEDULER_ENV, "dask_scheduler", False,
            "a running Dask scheduler's address, for the dask trial backend"),
    Control(TRIAL_TIMEOUT_ENV, "trial_timeout", False,
            "seconds a partition search's trial may run (default 600)"),
    Control(FINISH_TIMEOUT_ENV, "finish_timeout", True,
            "seconds the ranks of an all-reduce job wait for each other when they end (default 60)"),
    Control(ARRIVAL_SPIN_ENV, "arrival_spin", True,
            "how the mpi backend waits for late members: off, or microseconds awake between tests"),
    Control(NATIVE_OPS_ENV, "native_ops", True,
            "0: the mpi backend sums through Python, not its compiled op"),
    Control(HUGE_PAGES_ENV, "huge_pages", True,
            "0: the compiled all-reduce op's buffers without transparent huge pages"),
    Control(SLOT_DEVICE_ENV, "slot_device", False,
            "an MPIJob's launcher: the device each slot of its hostfile stands for"),
    Control(RERUN_ENV, "rerun", False,
            "1: the script run again by the process the user started, with a tuned or searched partition count"),
    Control(ELASTIC_ENV, "elastic", False,
            "parallax-run --max-restarts, --min-np, --max-np, --host-discovery-script: JSON of the ElasticConfig "
            "fields they replace"),
    Control(STALL_SHUTDOWN_ENV, "stall_shutdown", False,
            "parallax-run --stall-shutdown: the seconds that replace Config.stall_shutdown ('none': never)"),
    Control(STAGGERED_ENV, "staggered_start", False,
            "0 or 1: replaces Config.staggered_start (the host's first process reaches its training call first)"),
    Control(ELASTIC_CKPT_ENV, "elastic_ckpt", False,
            "the launcher of an elastic job, to every rank: JSON of the CheckPointConfig elastic mode saves with"),
    Control(TF_CONFIG_ENV, "tf_config", False,
            "a cluster manager (a TFJob, Polyaxon, by hand): the cluster and this task (JSON)"),
)}


_NAME_OF = {c.attr: c.name for c in CONTROLS.values()}

#: The variables every rank gets from the launcher (when set there): the environment a program needs, and
#: the control variables marked forwarded.
FORWARDED: tuple[str, ...] = (
    "PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES",
    "OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules", "GLIBC_TUNABLES",
    *(c.name for c in CONTROLS.values() if c.forwarded))


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
    def kind(self) -> str:
        return "tune" if self.tune is not None else "manifest" if self.manifest else "plan"

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
    """

    ranks: str
    layout: str | None = None
    digest: str | None = None
    gpus: int | None = None
    allocation: dict | None = None
    staggered: bool = False

    @classmethod
    def from_json(cls, text: str) -> LaunchIdentity:
        try:
            data = json.loads(text)
            job = data.get("job") or {}
            return cls(data["ranks"], job.get("layout"), job.get("digest"), job.get("gpus"), job.get("allocation"),
                       bool(job.get("staggered", False)))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ValueError(f"{LAUNCH_ENV}: expected the launcher's JSON, got {text[:200]!r}") from e

    def to_json(self) -> str:
        job = {k: v for k, v in (("layout", self.layout), ("digest", self.digest), ("gpus", self.gpus),
                                 ("allocation", self.allocation), ("staggered", self.staggered or None))
               if v is not None}
        return json.dumps({"job": job, "ranks": self.ranks}, sort_keys=True)


#: The fields that hold a request, and its parser; every other field holds its variable's text.
_REQUESTS = {"plan": PlanRequest, "trial": TrialRequest, "launch": LaunchIdentity}


def _parsed(attr: str, text: str) -> Any:
    """A variable's value, as its field holds it."""
    return _REQUESTS[attr].from_json(text) if attr in _REQUESTS else text


def _text(value: Any) -> str:
    """A field's value as its variable's text (:func:`_parsed` backwards)."""
    return value if isinstance(value, str) else value.to_json()


@dataclass(frozen=True)
class Invocation:
    """This process's control variables, parsed (see the module docstring); ``None`` where one is unset (or
    empty). The settings whose checks and messages belong to their own module are kept as their text."""

    resource_info: str | None = None
    run_option: str | None = None
    mpirun_options: str | None = None
    dry_run: str | None = None
    plan: PlanRequest | None = None
    skip_host_check: str | None = None
    launch: LaunchIdentity | None = None
    job_dir: str | None = None
    monitor: str | None = None
    stall_timeout: str | None = None
    log_level: str | None = None
    trial: TrialRequest | None = None
    trial_result: str | None = None
    sweep_params: str | None = None
    tuned: str | None = None
    use_tuned: str | None = None
    partitions: str | None = None
    search_steps: str | None = None
    cache_dir: str | None = None
    trial_backend: str | None = None
    dask_scheduler: str | None = None
    trial_timeout: str | None = None
    finish_timeout: str | None = None
    arrival_spin: str | None = None
    native_ops: str | None = None
    huge_pages: str | None = None
    slot_device: str | None = None
    rerun: str | None = None
    elastic: str | None = None
    elastic_ckpt: str | None = None
    stall_shutdown: str | None = None
    staggered_start: str | None = None
    tf_config: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Invocation:
        """The invocation ``environ`` (default: this process's environment) describes.

        Raises:
            ValueError: a structured variable (a plan, trial or launch request) is not what its writer writes.
        """
        environ = os.environ if environ is None else environ
        return cls(**{c.attr: _parsed(c.attr, environ[c.name]) for c in CONTROLS.values() if environ.get(c.name)})

    def to_env(self) -> dict[str, str]:
        """The variables that say this invocation (the set ones), as :meth:`from_env` reads them."""
        return {c.name: _text(getattr(self, c.attr)) for c in CONTROLS.values() if getattr(self, c.attr) is not None}

    @property
    def kind(self) -> str:
        """``plan``, ``manifest``, ``tune``, ``trial``, ``launched``, ``managed`` or ``plain`` (the module
        docstring); a launched rank of a trial is ``launched``."""
        if self.plan is not None:
            return self.plan.kind
        if self.launch is not None:
            return "launched"
        if self.trial is not None:
            return "trial"
        if self.tf_config is not None:
            return "managed"
        return "plain"

    def cache_root(self) -> str:
        """Where Parallax keeps what it compiles, tunes and searches (:data:`CACHE_ENV`)."""
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "parallax")


def current() -> Invocation:
    """This process's invocation, as its environment says now."""
    return Invocation.from_env(os.environ)


def setting(attr: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The text of one control variable that holds text (a field of :class:`Invocation` other than a request),
    read without parsing the others: what a module needs while it is imported (the log level), so that a
    malformed request variable is reported by the call that reads it, not by ``import parallax``.

    >>> setting("log_level", {"PARALLAX_LOG_LEVEL": "INFO", "PARALLAX_LAUNCH": "not json"})
    'INFO'
    """
    if attr in _REQUESTS:
        raise ValueError(f"{attr} is a request: read it with current().{attr}")
    return (os.environ if environ is None else environ).get(_NAME_OF[attr]) or None


def env_with(base: Mapping[str, str] | None = None, **changes: Any) -> dict[str, str]:
    """``base`` (default: this process's environment) with the control variables of ``changes`` (fields of
    :class:`Invocation`) set, or removed where ``None``: the environment of a child process."""
    env = dict(os.environ if base is None else base)
    _apply(env, changes)
    return env


def export(**changes: Any) -> None:
    """Set (or, with ``None``, unset) control variables of this process (fields of :class:`Invocation`), for
    what it runs later and the processes it starts."""
    _apply(os.environ, changes)


def _apply(env: MutableMapping[str, str], changes: dict[str, Any]) -> None:
    """Set in ``env`` the variables of ``changes`` (fields of :class:`Invocation`), removing the ``None`` ones."""
    for attr, value in changes.items():
        if value is None:
            env.pop(_NAME_OF[attr], None)
        else:
            env[_NAME_OF[attr]] = _text(value)

