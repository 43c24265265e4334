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

Every other setting of the table :data:`CONTROLS` is a field of :class:`Invocation` too, parsed here into
what it means (a number, a flag, a record of :mod:`parallax.invocation.records`: :class:`RankChannel`,
:class:`CommTuning`, :class:`SearchRequest`), a bad value reported here with its variable's name. The doors
(``parallel_run``, the commands) read the invocation once and hand its records to the code that uses them;
no module below them reads these variables (:func:`setting` reads one without parsing the rest, for the
logger). The modules that give them to a child process build its environment with :meth:`Invocation.to_env`
or :func:`env_with`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any

from parallax.invocation.records import (
    LAUNCH_ENV,
    PLAN_ENV,
    READERS,
    TRIAL_ENV,
    WRITERS,
    CommTuning,
    Kind,
    LaunchIdentity,
    PlanRequest,
    RankChannel,
    SearchRequest,
    TrialRequest,
)

__all__ = ["Control", "CONTROLS", "FORWARDED", "Invocation", "Kind", "PlanRequest", "TrialRequest", "LaunchIdentity",
           "RankChannel", "CommTuning", "SearchRequest", "current", "setting", "env_with", "export", "RESOURCE_ENV",
           "RUN_OPTION_ENV", "MPIRUN_OPTIONS_ENV", "DRY_RUN_ENV", "PLAN_ENV", "SKIP_CHECK_ENV", "LAUNCH_ENV",
           "JOB_DIR_ENV", "MONITOR_ENV", "STALL_ENV", "LEVEL_ENV", "TRIAL_ENV", "RESULT_ENV", "PARAMS_ENV", "TUNED_ENV",
           "USE_TUNED_ENV", "PARTITIONS_ENV", "SEARCH_STEPS_ENV", "CACHE_ENV", "TRIAL_BACKEND_ENV", "SCHEDULER_ENV",
           "TRIAL_TIMEOUT_ENV", "FINISH_TIMEOUT_ENV", "ARRIVAL_SPIN_ENV", "NATIVE_OPS_ENV", "HUGE_PAGES_ENV",
           "SLOT_DEVICE_ENV", "TF_CONFIG_ENV", "RERUN_ENV", "ELASTIC_ENV", "ELASTIC_CKPT_ENV", "STALL_SHUTDOWN_ENV",
           "STAGGERED_ENV", "HASH_SEED_ENV"]


@dataclass(frozen=True)
class Control:
    """A control variable: its name, the :class:`Invocation` field it fills, whether the launcher gives it to
    every rank, and what sets it.

    Attributes:
        attr: its name among the others (:func:`env_with`'s keywords, :func:`setting`'s names).
        form: how its text is read (:data:`~parallax.invocation.records.READERS`): ``text`` as it is.
        record: the field of :class:`Invocation` whose record holds it (``None``: a field of its own).
        field: its field in that record (default: ``attr``).
    """

    name: str
    attr: str
    forwarded: bool
    doc: str
    form: str = "text"
    record: str | None = None
    field: str | None = None

    def read(self, text: str) -> Any:
        """Its field's value for the variable's ``text``.

        Raises:
            ValueError: ``text`` is not what the variable takes (the message names it).
        """
        return READERS[self.form](self.name, text)

    def write(self, value: Any) -> str:
        """The variable's text for its field's ``value`` (a ``str`` as it is)."""
        return value if isinstance(value, str) else WRITERS[self.form](value)


RESOURCE_ENV = "PARALLAX_RESOURCE_INFO"
RUN_OPTION_ENV = "PARALLAX_RUN_OPTION"
MPIRUN_OPTIONS_ENV = "PARALLAX_MPIRUN_OPTIONS"
DRY_RUN_ENV = "PARALLAX_DRY_RUN"
SKIP_CHECK_ENV = "PARALLAX_SKIP_HOST_CHECK"
JOB_DIR_ENV = "PARALLAX_JOB_DIR"
MONITOR_ENV = "PARALLAX_MONITOR"
STALL_ENV = "PARALLAX_STALL_TIMEOUT"
LEVEL_ENV = "PARALLAX_LOG_LEVEL"
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
#: Python's own: its string hashing's seed, read when the interpreter starts; the launcher gives every rank one
#: (:mod:`parallax.member.seeds`).
HASH_SEED_ENV = "PYTHONHASHSEED"

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
            "parallax plan / manifest / tune: JSON of a PlanRequest; parallel_run answers it and exits",
            form="plan"),
    Control(SKIP_CHECK_ENV, "skip_host_check", False,
            "1: skip the hosts' check before a job on several machines",
            form="flag"),
    Control(LAUNCH_ENV, "launch", False,
            "the launcher, to every rank: the ranks and what they must agree on with it (JSON)",
            form="launch"),
    Control(JOB_DIR_ENV, "job_dir", False,
            "the launcher, to every rank: where ranks register for failure reports",
            record="channel"),
    Control(MONITOR_ENV, "monitor", False,
            "the launcher, to every rank: its stall monitor's host:port",
            record="channel"),
    Control(STALL_ENV, "stall_timeout", False,
            "the launcher, to every rank: seconds without a heartbeat that make a stall",
            form="seconds", record="channel"),
    Control(LEVEL_ENV, "log_level", False,
            "the parallax logger's level (a number, or DEBUG, INFO, WARNING, ERROR); ranks log at INFO"),
    Control(TRIAL_ENV, "trial", True,
            "a trial's runner: the choice it tries and the steps it times (JSON of a TrialRequest)",
            form="trial"),
    Control(RESULT_ENV, "trial_result", True,
            "a trial's runner: the file its result is written to"),
    Control(PARAMS_ENV, "sweep_params", True,
            "a sweep's trial: the parameters it tries (JSON), for every process of its job",
            form="json"),
    Control(TUNED_ENV, "tuned", True,
            "the process the user started, to the ones it launches: the tuned choice they apply (JSON)",
            form="json"),
    Control(USE_TUNED_ENV, "use_tuned", True,
            "0, false, no or off: ignore what parallax tune stored",
            form="flag"),
    Control(PARTITIONS_ENV, "partitions", True,
            "a partition search (or by hand): the partition count get_partitioner gives",
            form="count", record="search"),
    Control(SEARCH_STEPS_ENV, "search_steps", True,
            "a partition search's trial: 'warmup,timed' steps (default 2,5)",
            form="steps", record="search", field="steps"),
    Control(CACHE_ENV, "cache_dir", True,
            "where the compiled op, the tuned layouts and the searches' results are kept (~/.cache/parallax)"),
    Control(TRIAL_BACKEND_ENV, "trial_backend", False,
            "where a partition search's trials run: local (default) or dask",
            form="backend", record="search", field="backend"),
    Control(SCHEDULER_ENV, "dask_scheduler", False,
            "a running Dask scheduler's address, for the dask trial backend",
            record="search", field="scheduler"),
    Control(TRIAL_TIMEOUT_ENV, "trial_timeout", False,
            "seconds a partition search's trial may run (default 600)",
            form="seconds", record="search"),
    Control(FINISH_TIMEOUT_ENV, "finish_timeout", True,
            "seconds the ranks of an all-reduce job wait for each other when they end (default 60)",
            form="seconds"),
    Control(ARRIVAL_SPIN_ENV, "arrival_spin", True,
            "how the mpi backend waits for late members: off, or microseconds awake between tests",
            form="spin", record="comm"),
    Control(NATIVE_OPS_ENV, "native_ops", True,
            "0: the mpi backend sums through Python, not its compiled op",
            form="flag", record="comm"),
    Control(HUGE_PAGES_ENV, "huge_pages", True,
            "0: the compiled all-reduce op's buffers without transparent huge pages",
            form="flag", record="comm"),
    Control(SLOT_DEVICE_ENV, "slot_device", False,
            "an MPIJob's launcher: the device each slot of its hostfile stands for",
            form="device", record="comm"),
    Control(RERUN_ENV, "rerun", False,
            "1: the script run again by the process the user started, with a tuned or searched partition count",
            form="flag", record="search"),
    Control(ELASTIC_ENV, "elastic", False,
            "parallax-run --max-restarts, --min-np, --max-np, --host-discovery-script: JSON of the ElasticConfig "
            "fields they replace"),
    Control(STALL_SHUTDOWN_ENV, "stall_shutdown", False,
            "parallax-run --stall-shutdown: the seconds that replace Config.stall_shutdown ('none': never)",
            form="shutdown"),
    Control(STAGGERED_ENV, "staggered_start", False,
            "0 or 1: replaces Config.staggered_start (the host's first process reaches its training call first)",
            form="flag"),
    Control(ELASTIC_CKPT_ENV, "elastic_ckpt", False,
            "the launcher of an elastic job, to every rank: JSON of the CheckPointConfig elastic mode saves with"),
    Control(TF_CONFIG_ENV, "tf_config", False,
            "a cluster manager (a TFJob, Polyaxon, by hand): the cluster and this task (JSON)"),
    Control(HASH_SEED_ENV, "hash_seed", False,
            "Python's string hashing's seed: the launcher gives every rank its own, else the job's seed"),
)}


_BY_ATTR = {c.attr: c for c in CONTROLS.values()}

#: The variables every rank gets from the launcher (when set there): the environment a program needs, and
#: the control variables marked forwarded.
FORWARDED: tuple[str, ...] = (
    "PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES",
    "OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules", "GLIBC_TUNABLES",
    *(c.name for c in CONTROLS.values() if c.forwarded))

#: The record class of each field of :class:`Invocation` that holds one.
_RECORDS = {"channel": RankChannel, "search": SearchRequest, "comm": CommTuning}


@dataclass(frozen=True)
class Invocation:
    """This process's control variables, parsed (see the package docstring): each field holds what its variable
    means, its default where the variable is unset (or empty); related ones are grouped in records
    (``channel``, ``search``, ``comm``). The settings whose checks and messages belong to their own module
    (``elastic``, ``elastic_ckpt``, ``tf_config``, ``log_level``) are kept as their text."""

    resource_info: str | None = None
    run_option: str | None = None
    mpirun_options: str | None = None
    dry_run: str | None = None
    plan: PlanRequest | None = None
    skip_host_check: bool = False
    launch: LaunchIdentity | None = None
    channel: RankChannel = field(default_factory=RankChannel)
    log_level: str | None = None
    trial: TrialRequest | None = None
    trial_result: str | None = None
    sweep_params: dict | None = None
    tuned: dict | None = None
    use_tuned: bool = True
    search: SearchRequest = field(default_factory=SearchRequest)
    cache_dir: str | None = None
    finish_timeout: float | None = None
    comm: CommTuning = field(default_factory=CommTuning)
    elastic: str | None = None
    elastic_ckpt: str | None = None
    stall_shutdown: float | str | None = None
    staggered_start: bool | None = None
    tf_config: str | None = None
    hash_seed: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Invocation:
        """The invocation ``environ`` (default: this process's environment) describes.

        Raises:
            ValueError: a variable is not what it takes (a request not what its writer writes, a number, a
                flag): the message names the variable and what it expected.
        """
        environ = os.environ if environ is None else environ
        own: dict[str, Any] = {}
        held: dict[str, dict[str, Any]] = {name: {} for name in _RECORDS}
        for c in CONTROLS.values():
            if environ.get(c.name):
                (held[c.record] if c.record else own)[c.field or c.attr] = c.read(environ[c.name])
        return cls(**own, **{name: _RECORDS[name](**values) for name, values in held.items() if values})

    def to_env(self) -> dict[str, str]:
        """The variables that say this invocation (those whose field is not its default), as :meth:`from_env`
        reads them."""
        return {c.name: c.write(value) for c, value in self._values() if value != _default(c)}

    def value(self, attr: str) -> Any:
        """The field of control ``attr`` (a record's field for a grouped one)."""
        c = _BY_ATTR[attr]
        holder = getattr(self, c.record) if c.record else self
        return getattr(holder, c.field or c.attr)

    def _values(self) -> list[tuple[Control, Any]]:
        return [(c, self.value(c.attr)) for c in CONTROLS.values()]

    @property
    def kind(self) -> Kind:
        """What this process is (the package docstring); a launched rank of a trial is ``launched``."""
        if self.plan is not None:
            return self.plan.kind
        if self.launch is not None:
            return Kind.LAUNCHED
        if self.trial is not None:
            return Kind.TRIAL
        if self.tf_config is not None:
            return Kind.MANAGED
        return Kind.PLAIN

    def cache_root(self) -> str:
        """Where Parallax keeps what it compiles, tunes and searches (:data:`CACHE_ENV`)."""
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "parallax")


def _default(c: Control) -> Any:
    """The value of ``c``'s field when its variable is unset."""
    if c.record:
        return next(f.default for f in fields(_RECORDS[c.record]) if f.name == (c.field or c.attr))
    return next(f.default for f in fields(Invocation) if f.name == c.attr)


def current() -> Invocation:
    """This process's invocation, as its environment says now (for the doors: ``parallel_run``, the commands).

    Raises:
        ValueError: a variable is not what it takes (:meth:`Invocation.from_env`).
    """
    return Invocation.from_env(os.environ)


def setting(attr: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The text of one control variable, read without parsing the others: what a module needs while it is
    imported (the log level), so that a malformed variable is reported by the call that reads the invocation,
    not by ``import parallax``.

    >>> setting("log_level", {"PARALLAX_LOG_LEVEL": "INFO", "PARALLAX_LAUNCH": "not json"})
    'INFO'
    """
    return (os.environ if environ is None else environ).get(_BY_ATTR[attr].name) or None


def env_with(base: Mapping[str, str] | None = None, **changes: Any) -> dict[str, str]:
    """``base`` (default: this process's environment) with the control variables of ``changes`` (their
    :attr:`Control.attr` names; a value as its field holds it, or its text) set, or removed where ``None``: the
    environment of a child process."""
    env = dict(os.environ if base is None else base)
    _apply(env, changes)
    return env


def export(**changes: Any) -> None:
    """Set (or, with ``None``, unset) control variables of this process (as :func:`env_with`), for what it runs
    later and the processes it starts: for the doors only."""
    _apply(os.environ, changes)


def _apply(env: MutableMapping[str, str], changes: dict[str, Any]) -> None:
    """Set in ``env`` the variables of ``changes`` (see :func:`env_with`), removing the ``None`` ones."""
    for attr, value in changes.items():
        c = _BY_ATTR[attr]
        if value is None:
            env.pop(c.name, None)
        else:
            env[c.name] = c.write(value)
