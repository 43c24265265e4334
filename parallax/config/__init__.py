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

This module holds the classes themselves (``parallax`` exports them from here); the
values their fields allow are named in :mod:`parallax.config.values`, the check each
assignment runs is in :mod:`parallax.config.checks`, and the checked record they all
are is :mod:`parallax.config.base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallax.config.base import _ConfigBase, _field

# `noqa: F401`: some names (parse_bytes, _describe, BACKENDS, COMPRESSED_FORMATS, ...) are imported only so that
# every name of the module this package was stays importable from parallax.config (parallax.comm, parallax.plan
# and parallax.launch import the value lists from here).
from parallax.config.checks import (  # noqa: F401
    _UNITS,
    _backend,
    _bool,
    _bytes_or_none,
    _compression,
    _describe,
    _fusion_bytes,
    _hooks,
    _instance_of,
    _mpirun_options,
    _non_negative_int,
    _optional_bool,
    _optional_str,
    _plan_overrides,
    _positive_int,
    _positive_int_or_none,
    _positive_number_or_none,
    _profile_range,
    _profile_steps,
    _profile_worker,
    _protocol,
    _run_option,
    _schedule,
    _scope_list,
    _sess_config,
    _tf_checkpoint,
    _zero_stage,
    parse_bytes,
)
from parallax.config.values import (  # noqa: F401
    _HOROVOD_COMPRESSORS,
    ALLREDUCE_BACKENDS,
    BACKENDS,
    BF16,
    COMPRESSED_FORMATS,
    COMPRESSION_AUTO,
    COMPRESSIONS,
    FP16,
    NO_COMPRESSION,
    OVERRIDE_SYNC,
    PS_PROTOCOLS,
    RUN_OPTIONS,
)

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

# --------------------------------------------------------------------------- #
# PSConfig
# --------------------------------------------------------------------------- #

@dataclass(eq=True, repr=True)
class PSConfig(_ConfigBase):
    """How PS (and the PS half of HYBRID) communicates.

    Args:
        protocol: the protocol of TensorFlow's servers: ``"grpc"`` (default;
            the only one in stock TensorFlow 2), ``"grpc+verbs"``,
            ``"grpc+gdr"``, ``"grpc+mpi"`` (the seed's values; ``parallel_run``
            refuses all but ``"grpc"`` before it launches anything,
            :func:`parallax.job.settings.derive`).
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

@dataclass(eq=True, repr=True)
class Config(_ConfigBase):
    """Everything that tunes a Parallax run besides the graph and the resources.

    Args:
        run_option: ``"PS"``, ``"MPI"``, ``"HYBRID"`` or ``"AUTO"`` (case does
            not matter); ``None`` means the default: ``"HYBRID"`` (the seed's) for a
            ``tf.compat.v1`` graph; ``"AUTO"`` (Parallax only) for ``parallax.fit`` and a
            ``tf.function`` step (:mod:`parallax.job.in_force`); ``"PS"`` for ``sync=False``.
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
            and exit code 1 (an elastic job restarts: the stall counts as a failure); in a job a cluster manager
            started, worker 0 ends itself so, and the other tasks end as it has gone. Default 900: longer than
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
        staggered_start: (Parallax only) on each host, the processes of a launched job run the program up to
            their training call one after another (each starts when the one before it has reached its call), so
            that data the program downloads or extracts on every run is written by one process at a time, never
            while another reads it (:mod:`parallax.member.entry`). Costs the host's processes' ways to their
            training call one after another, once per job. Default ``True``.
        fuse_updates: (Parallax only) each optimizer update made of element-wise ops (Keras 3's optimizers) that
            runs in a worker (or on a parameter server of its host) is one op: one pass over the variable, its
            slots and its gradient instead of a dozen, compiled on first use, the same numbers to the bit (what
            TensorFlow's graph optimizer would compute otherwise is left as it is):
            :mod:`parallax.rewrite.fused_updates`. Default ``True``.
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
    fuse_updates: bool = _field(True, _bool)

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
