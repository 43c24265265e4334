"""``parallel_run``: resources -> analysis -> plan -> rewrite -> (launch) -> session."""

from __future__ import annotations

import os
import sys

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax import search
from parallax.analysis import GraphAnalysis, analyse_graph
from parallax.checkpoint import check_schedule
from parallax.config import Config
from parallax.errors import LaunchError
from parallax.launch.bootstrap import (
    LAUNCH_ENV,
    RankContext,
    finish_together,
    launched_context,
    leave_together,
    make_heartbeat,
    tee_output,
)
from parallax.launch.launcher import (
    DRY_RUN_ENV,
    current_program,
    extra_mpirun_options,
    is_local_host,
    job_command,
    launch,
    resource_override,
)
from parallax.launch.layout import RankSpec, hybrid_ranks, ps_ranks, ranks_per_device
from parallax.logs import log as logger
from parallax.plan import Plan, TaskSpec, build_plan
from parallax.plan.model import CommSpec, PSSpec
from parallax.plan.policies import choose_sync
from parallax.profiling import Profiler
from parallax.resources import Cluster, Device, WorkerTask, parse_resource_file
from parallax.rewrite.classify import classify
from parallax.rewrite.pipeline import rewrite_for_task, wait_points
from parallax.rewrite.replicate import shard_op_names
from parallax.session import ParallaxSession
from parallax.startup import GROUP_LEADER, start_server, start_session

__all__ = ["parallel_run", "preview_plan", "PLAN_ENV"]


def parallel_run(single_gpu_graph: tf.Graph | meta_graph_pb2.MetaGraphDef | str,
                 resource_info: str | os.PathLike, sync: bool = True,
                 parallax_config: Config | None = None
                 ) -> tuple[ParallaxSession, int, int, int]:
    """Train ``single_gpu_graph`` data-parallel on the devices of ``resource_info``.

    The graph is analysed (variables, gradients, training op), a plan is made,
    the graph is rewritten for this process, and a session over the rewritten
    graph is returned with the variables initialized (equal on every worker).

    With ``run_option='MPI'`` (or a resource file that needs several worker
    processes), the first call starts the whole job: it runs this same program
    once per device through ``mpirun``, where each process's ``parallel_run``
    returns its own session; the launching process then waits and exits with
    the job's exit code (it does not return).

    Example::

        sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
            graph, "resource_info")
        for step in range(1000):
            loss_values, _ = sess.run([loss, train_op], feed_dict={x: [b0, b1], y: [l0, l1]})

    Args:
        single_gpu_graph: a ``tf.Graph`` that trains on one device, or its
            ``MetaGraphDef`` (a proto, or the path of a ``.meta`` file).
        resource_info: path of the resource file (see ``docs/resources.md``).
        sync: synchronous training (``False`` needs ``run_option='PS'``).
        parallax_config: a :class:`parallax.Config`; defaults when ``None``.

    Returns:
        ``(session, num_workers, worker_id, num_replicas_per_worker)``.

    Raises:
        TypeError, ValueError: bad arguments or config values.
        ResourceFileError: the resource file is malformed.
        AnalysisError: the graph has no training op.
        LaunchError: the resources cannot be used as asked.
    """
    config = parallax_config if parallax_config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"parallel_run: parallax_config must be a parallax.Config, got "
                        f"{type(config).__name__}")
    if not isinstance(sync, bool):
        raise TypeError(f"parallel_run: sync must be True or False, got {sync!r}")
    if not isinstance(resource_info, (str, os.PathLike)):
        raise TypeError(f"parallel_run: resource_info must be the path of a resource file, got "
                        f"{type(resource_info).__name__}")
    config.validate(sync=sync)
    resource_info = resource_override(resource_info)
    if os.environ.get(PLAN_ENV) and os.environ.get(LAUNCH_ENV) is None:
        _print_plan_and_exit(single_gpu_graph, resource_info, sync, config)
    graph, meta_graph = _load_graph(single_gpu_graph)
    check_schedule(config.ckpt_config, graph)
    cluster = parse_resource_file(resource_info)
    context = launched_context(config.redirect_path)

    analysis = analyse_graph(graph)
    if context is not None:
        if config.search_partitions:
            _search_partitions(graph, cluster, config, sync, context, launching=False)
        return _in_trial(_run_rank(context, cluster, graph, meta_graph, analysis, config, sync))
    layout = _multiprocess_layout(cluster, _run_option(config, sync), analysis, config)
    if os.environ.get(DRY_RUN_ENV):
        _write_launch_and_exit(layout, config)
    if config.search_partitions:
        _search_partitions(graph, cluster, config, sync, None, launching=layout is not None)
    if layout is None:
        if config.redirect_path:
            _once("tee", lambda: tee_output(config.redirect_path))
        return _in_trial(_run_in_process(cluster, graph, meta_graph, analysis, config, sync))
    for worker in cluster.workers:  # this machine's device lists are checked before anything starts
        if is_local_host(worker.host):
            _resolve_devices(worker, cluster.source)
    _launch_and_exit(*layout, config)
    raise AssertionError("unreachable")  # pragma: no cover


# --------------------------------------------------------------------------- #
# Which path
# --------------------------------------------------------------------------- #

def _multiprocess_layout(cluster: Cluster, run_option: str, analysis: GraphAnalysis,
                         config: Config) -> tuple[tuple[RankSpec, ...], str] | None:
    """The ranks to launch and the layout they use (``MPI``, ``PS`` or ``HYBRID``), or
    ``None`` when this process alone trains (one local worker, which needs no server).

    HYBRID and AUTO decide per variable first (:func:`choose_sync`): without
    variables for the servers they run as MPI, with nothing to all-reduce as PS."""
    single_local_worker = len(cluster.workers) == 1 and is_local_host(cluster.workers[0].host)
    if run_option == "MPI":
        ranks = ranks_per_device(cluster)
        if len(ranks) == 1 and single_local_worker:
            return None
        return ranks, "MPI"
    if run_option == "PS":
        return None if single_local_worker and not cluster.servers else (ps_ranks(cluster), "PS")
    per_device = ranks_per_device(cluster)
    if len(per_device) == 1 and single_local_worker and not cluster.servers:
        return None
    choices, _ = choose_sync(analysis, len(per_device), 1, run_option.lower(), config.plan_overrides)
    on_servers = sorted(name for name, c in choices.items() if c.sync == "ps")
    if not on_servers:
        logger.warning("Parallax: run_option=%s: no variable goes to parameter servers (%s), so the job runs as "
                       "MPI%s", run_option, "no sparse gradient" if run_option == "HYBRID" else "the cost model "
                       "chose all-reduce or all-gather for every variable",
                       "; the ps lines of the cluster file are not used" if cluster.servers else "")
        return per_device, "MPI"
    if len(on_servers) == len(choices):
        logger.warning("Parallax: run_option=%s: every variable goes to parameter servers (%s), so the job runs "
                       "as PS", run_option, "no dense gradient" if run_option == "HYBRID" else "cost model")
        return ps_ranks(cluster), "PS"
    return hybrid_ranks(cluster), "HYBRID"


def _launch_and_exit(ranks: tuple[RankSpec, ...], run_option: str, config: Config) -> None:
    program = current_program()
    options = extra_mpirun_options(config.communication_config.mpi_config.mpirun_options)
    result = launch(ranks, run_option, program, options, redirect_path=config.redirect_path,
                    stall_timeout=config.stall_timeout)
    if result.failure is not None:
        sys.stderr.write(f"\n{result.failure}\n")
        sys.stderr.flush()
    raise SystemExit(result.returncode)


def _write_launch_and_exit(layout: tuple[tuple[RankSpec, ...], str] | None, config: Config) -> None:
    """``parallax-run --dry_run``: write what would run (the mpirun command, or that this process trains)."""
    if layout is None:
        text = "# one worker on this machine: the script trains in its own process, nothing is launched"
    else:
        options = extra_mpirun_options(config.communication_config.mpi_config.mpirun_options)
        command, _ = job_command(layout[0], layout[1], current_program(), options, "<job dir>")
        text = f"# run_option {layout[1]}, {len(layout[0])} processes\n" + " ".join(command.argv)
    with open(os.environ[DRY_RUN_ENV], "w", encoding="utf-8") as f:
        f.write(text + "\n")
    raise SystemExit(0)


# --------------------------------------------------------------------------- #
# One process, one worker, in-graph replicas
# --------------------------------------------------------------------------- #

def _run_in_process(cluster, graph, meta_graph, analysis, config, sync):
    worker = cluster.workers[0]
    devices = _resolve_devices(worker, cluster.source)
    plan = _job_plan("local", [(worker.host, tuple(d.tf_name for d in devices), "/device:CPU:0")], (),
                     analysis, config, sync, CommSpec())
    logger.info("Parallax plan:\n%s", plan.describe())
    task = TaskSpec(worker_index=0)
    rewritten = _rewrite(meta_graph, plan, task, config)
    cpus = max([d.index + 1 for d in devices if d.kind == "cpu"], default=0)
    session, dist_graph = start_session(rewritten, config.sess_config, cpu_devices=cpus,
                                        **_session_extras(config, plan, saves=True))
    wrapper = ParallaxSession(session, dist_graph, graph, _replicated_ops(meta_graph, plan), len(devices),
                              profiler=Profiler.from_config(config.profile_config, 0))
    return wrapper, plan.num_workers, task.worker_index, len(devices)


# --------------------------------------------------------------------------- #
# One rank of a launched job
# --------------------------------------------------------------------------- #

def _run_rank(context: RankContext, cluster, graph, meta_graph, analysis: GraphAnalysis, config, sync):
    if context.run_option in ("PS", "HYBRID"):
        return _run_server_job_rank(context, cluster, graph, meta_graph, analysis, config, sync)
    _check_launched_layout(ranks_per_device(cluster), context, cluster.source)
    _once("finish", lambda: finish_together(context.rank))
    beat = _heartbeat(context, "initialising the variables and taking rank 0's values")
    gpus = len(tf.config.list_physical_devices("GPU"))
    mpi = config.communication_config.mpi_config
    uses_gpu = [_rank_device(r, gpus).kind == "gpu" for r in context.ranks]
    comm = _mpi_comm(config, any(uses_gpu))
    backend = comm.backend
    my_device = _rank_device(context.spec, gpus)
    my_gpu = my_device.index if my_device.kind == "gpu" else None
    server = None
    if backend == "collective":
        server = _once("server", lambda: start_server(
            context.rank, [("worker", r) for r in range(context.size)], config.sess_config,
            group_leader=GROUP_LEADER, visible_gpus=None if my_gpu is None else str(my_gpu)))
    workers = []
    for r, spec in enumerate(context.ranks):
        kind = "GPU" if uses_gpu[r] else "CPU"
        prefix = f"/job:worker/replica:0/task:{r}" if server is not None else ""
        device = f"{prefix}/device:{kind}:0"
        workers.append((spec.host, (device,), device))
    plan = _job_plan("MPI", workers, (), analysis, config, sync, comm)
    if context.rank == 0:
        logger.info("Parallax plan:\n%s", plan.describe())
    task = TaskSpec(worker_index=context.rank)
    rewritten = _rewrite(meta_graph, plan, task, config)
    on_this_host = sum(1 for r in context.ranks if r.host == context.spec.host)
    session, dist_graph = start_session(
        rewritten, config.sess_config, cpu_devices=0, visible_gpu=my_gpu,
        threads=max(1, (os.cpu_count() or 1) // on_this_host) if on_this_host > 1 else 0,
        server=server, broadcast=True,
        group_leader=GROUP_LEADER if server is not None else None,
        bind_mpi=backend == "mpi" or mpi.use_allgatherv, horovod=backend == "horovod",
        **_session_extras(config, plan, saves=context.rank == 0))
    beat.set("user")
    wrapper = ParallaxSession(session, dist_graph, graph, _replicated_ops(meta_graph, plan), 1,
                              profiler=Profiler.from_config(config.profile_config, context.rank),
                              heartbeat=beat, waits=wait_points(plan, task))
    return wrapper, context.size, context.rank, 1


def _run_server_job_rank(context: RankContext, cluster, graph, meta_graph, analysis: GraphAnalysis, config,
                         sync):
    """A worker or parameter server of a PS or HYBRID job (see docs/modes.md).

    PS: one worker per worker line, its devices in-graph replicas. HYBRID: one
    worker per device, as in MPI mode; the all-reduced variables' gradients go
    over MPI among the workers only (servers are not in that communicator).
    """
    import atexit

    from mpi4py import MPI

    hybrid = context.run_option == "HYBRID"
    _check_launched_layout(hybrid_ranks(cluster) if hybrid else ps_ranks(cluster), context, cluster.source)
    world = MPI.COMM_WORLD
    jobs, counters = [], {"worker": 0, "ps": 0}
    for r in context.ranks:
        jobs.append((r.role, counters[r.role]))
        counters[r.role] += 1
    role, index = jobs[context.rank]
    workers_comm, host_comm = _worker_comms(context)
    # Each worker resolves its own devices; everyone learns everyone's.
    mine = None
    if role == "worker" and hybrid:
        mine = (_rank_device(context.spec, len(tf.config.list_physical_devices("GPU"))),)
    elif role == "worker":
        mine = _resolve_devices(WorkerTask(context.spec.host, context.spec.devices, None, context.spec.line),
                                cluster.source)
    # A worker sees only its own GPUs, renumbered from 0 (two workers on one host share none).
    gpu_ids = [d.index for d in mine if d.kind == "gpu"] if mine else []
    visible = ",".join(str(i) for i in gpu_ids) if gpu_ids else None
    if mine:
        mine = tuple(Device("gpu", gpu_ids.index(d.index)) if d.kind == "gpu" else d for d in mine)
    all_devices = _once("devices", lambda: world.allgather(None if mine is None else
                                                           [(d.kind, d.index) for d in mine]))
    cpus = max([d.index + 1 for d in mine if d.kind == "cpu"], default=0) if mine else 0
    def start():
        server = start_server(context.rank, jobs, config.sess_config, cpu_devices=cpus, port=context.spec.port,
                              protocol=config.communication_config.ps_config.protocol, visible_gpus=visible)
        atexit.register(leave_together)  # servers wait for the workers; a failed worker does not wait
        return server

    server = _once("server", start)
    if role == "ps":
        _heartbeat(context, "").set("serve")
        logger.info("Parallax: parameter server %d serving on %s", index, context.spec.host)
        raise SystemExit(0)  # the barrier above holds this process until every worker has finished
    workers = []
    for spec, (job, w), devices in zip(context.ranks, jobs, all_devices):
        if job == "worker":
            workers.append(_worker_entry(w, spec.host, devices))
    servers = tuple(f"/job:ps/replica:0/task:{s}/device:CPU:0" for s in range(counters["ps"]))
    mpi = config.communication_config.mpi_config
    if hybrid and mpi.backend == "collective":
        logger.warning("Parallax: HYBRID all-reduces over MPI: TF collectives abort beside parameter servers")
    plan = _job_plan(context.run_option, workers, servers, analysis, config, sync,
                     _server_job_comm(config, any(d.kind == "gpu" for d in mine)))
    if index == 0:
        logger.info("Parallax plan:\n%s", plan.describe())
    task = TaskSpec(worker_index=index)
    beat = _heartbeat(context, "initialising the variables" if index == 0 else
                      "waiting for the chief (worker 0) to initialise the variables")
    rewritten = _rewrite(meta_graph, plan, task, config)
    on_this_host = sum(1 for r in context.ranks if r.host == context.spec.host and r.role == "worker")
    session, dist_graph = start_session(
        rewritten, config.sess_config, cpu_devices=cpus, visible_gpu=visible, server=server, is_chief=index == 0,
        device_filters=("/job:ps", f"/job:worker/task:{index}"),
        threads=max(1, (os.cpu_count() or 1) // on_this_host) if hybrid and on_this_host > 1 else 0,
        broadcast=hybrid, bind_mpi=hybrid, horovod=hybrid and plan.comm.backend == "horovod",
        comm=workers_comm, mpi_groups={"host": host_comm} if hybrid else None,
        **_session_extras(config, plan, saves=index == 0))
    beat.set("user")
    wrapper = ParallaxSession(session, dist_graph, graph, _replicated_ops(meta_graph, plan), len(mine),
                              profiler=Profiler.from_config(config.profile_config, index),
                              heartbeat=beat, waits=wait_points(plan, task))
    return wrapper, counters["worker"], index, len(mine)


class _NoHeartbeat:
    """Stands in for a heartbeat where the launcher runs no stall monitor."""

    def set(self, state: str, where: str = "", steps: int | None = None) -> None:
        pass

    def step_done(self) -> None:
        pass


def _heartbeat(context: RankContext, where: str):
    """This process's heartbeat to the stall monitor, now in state ``start`` waiting ``where``."""
    beat = _once("heartbeat", lambda: make_heartbeat(context)) or _NoHeartbeat()
    beat.set("start", where)
    return beat


def _rewrite(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
             config: Config) -> meta_graph_pb2.MetaGraphDef:
    """The graph ``task`` runs; written to ``Config.export_graph_path`` when one is set."""
    rewritten = rewrite_for_task(meta_graph, plan, task)
    if config.export_graph_path:
        os.makedirs(config.export_graph_path, exist_ok=True)
        path = os.path.join(config.export_graph_path, f"worker-{task.worker_index}_metagraph")
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(rewritten))
        logger.info("Parallax: wrote the graph of worker %d to %s", task.worker_index, path)
    return rewritten


def _worker_comms(context: RankContext):
    """The MPI communicators of a PS or HYBRID job's workers, and of the workers of this
    rank's host (``None`` on servers); made once per process, by every rank together."""
    from mpi4py import MPI

    def split():
        world = MPI.COMM_WORLD
        worker = context.spec.role == "worker"
        hosts = list(dict.fromkeys(r.host for r in context.ranks))
        return (world.Split(0 if worker else MPI.UNDEFINED, context.rank),
                world.Split(hosts.index(context.spec.host) if worker else MPI.UNDEFINED, context.rank))

    return _once("worker_comms", split)


def _check_launched_layout(expected: tuple[RankSpec, ...], context: RankContext, source: str) -> None:
    if expected != context.ranks:
        raise LaunchError(f"{source} does not describe the {context.run_option} job this process was "
                          f"launched in ({len(expected)} processes in the file, {len(context.ranks)} launched); "
                          "give parallel_run the resource file the job was started with")


def _rank_device(spec: RankSpec, gpus: int) -> Device:
    if spec.device is None:
        return Device("gpu", 0) if gpus else Device("cpu", 0)
    return spec.device


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #

def _job_plan(layout: str, workers: list, servers: tuple[str, ...], analysis: GraphAnalysis, config: Config,
              sync: bool, comm: CommSpec) -> Plan:
    """The plan of a job laid out as ``layout`` (``local``, ``MPI``, ``PS``, ``HYBRID``);
    the same in every process, and in ``parallax plan``."""
    auto = _run_option(config, sync) == "AUTO"
    cross_worker = {"local": "local", "MPI": "auto" if auto else "allreduce", "PS": "ps",
                    "HYBRID": "auto" if auto else "hybrid"}[layout]
    ps_config = config.communication_config.ps_config
    notes = (f"run_option={_run_option(config, sync)} runs as {layout}",) \
        if layout not in ("local", _run_option(config, sync)) else ()
    return build_plan(analysis, workers, run_option=layout if layout != "local" else _run_option(config, sync),
                      sync=sync, average_sparse=config.average_sparse, cross_worker=cross_worker, comm=comm,
                      server_devices=servers, notes=notes,
                      overrides=config.plan_overrides if layout != "local" else _local_overrides(config),
                      ps=PSSpec(local_aggregation=ps_config.local_aggregation, protocol=ps_config.protocol,
                                replicate_variables=ps_config.replicate_variables,
                                boundary_among_servers=ps_config.boundary_among_servers,
                                boundary_between_workers_and_servers=(
                                    ps_config.boundary_between_workers_and_servers)))


def _mpi_comm(config: Config, gpu: bool) -> CommSpec:
    """All-reduce settings of an MPI job: ``backend='auto'`` is TF collectives (NCCL) on GPUs, else MPI."""
    mpi = config.communication_config.mpi_config
    backend = mpi.backend if mpi.backend != "auto" else ("collective" if gpu else "mpi")
    return CommSpec(backend=backend, fusion_bytes=mpi.fusion_bytes, use_allgatherv=mpi.use_allgatherv, gpu=gpu)


def _server_job_comm(config: Config, gpu: bool) -> CommSpec:
    """All-reduce settings beside parameter servers: MPI (or horovod), never TF collectives (DESIGN.md)."""
    mpi = config.communication_config.mpi_config
    return CommSpec(backend="horovod" if mpi.backend == "horovod" else "mpi", fusion_bytes=mpi.fusion_bytes,
                    use_allgatherv=mpi.use_allgatherv, gpu=gpu)


def preview_plan(single_gpu_graph: tf.Graph | meta_graph_pb2.MetaGraphDef | str,
                 resource_info: str | os.PathLike, sync: bool = True,
                 parallax_config: Config | None = None) -> Plan:
    """The plan ``parallel_run`` would use for worker 0, without starting anything.

    Devices are taken from the resource file (a bare host counts as one CPU),
    so the device names may differ from a real run's; what goes where does not.
    This is what ``parallax plan`` prints.
    """
    config = parallax_config if parallax_config is not None else Config()
    config.validate(sync=sync)
    graph, _ = _load_graph(single_gpu_graph)
    cluster = parse_resource_file(resource_info)
    analysis = analyse_graph(graph)
    layout = _multiprocess_layout(cluster, _run_option(config, sync), analysis, config)
    if layout is None:
        worker = cluster.workers[0]
        devices = worker.devices or (Device("cpu", 0),)
        return _job_plan("local", [(worker.host, tuple(d.tf_name for d in devices), "/device:CPU:0")], (),
                         analysis, config, sync, CommSpec())
    ranks, kind = layout
    workers, servers = [], []
    for r in ranks:
        if r.role == "ps":
            servers.append(f"/job:ps/replica:0/task:{len(servers)}/device:CPU:0")
        else:
            devices = r.devices or (Device("cpu", 0),)
            workers.append(_worker_entry(len(workers), r.host, [(d.kind, d.index) for d in devices]))
    gpu = any(d.kind == "gpu" for r in ranks for d in (r.devices or ()))
    comm = _mpi_comm(config, gpu) if kind == "MPI" else _server_job_comm(config, gpu)
    return _job_plan(kind, workers, tuple(servers), analysis, config, sync, comm)


#: Set by ``parallax plan``: parallel_run prints the plan and exits (JSON: resource_info,
#: run_option, overrides, output; each optional).
PLAN_ENV = "PARALLAX_PLAN_ONLY"


def _print_plan_and_exit(graph, resource_info, sync: bool, config: Config) -> None:
    import copy
    import json

    request = json.loads(os.environ[PLAN_ENV])
    config = copy.copy(config)  # the user's config is not changed
    if request.get("run_option"):
        config.run_option = request["run_option"]
    if request.get("overrides"):
        config.plan_overrides = {**config.plan_overrides, **request["overrides"]}
    plan = preview_plan(graph, request.get("resource_info") or resource_info, sync, config)
    print(plan.describe(), flush=True)
    if request.get("output"):
        with open(request["output"], "w", encoding="utf-8") as f:
            json.dump(plan.to_dict(), f, indent=1, sort_keys=True)
    raise SystemExit(0)


def _run_option(config: Config, sync: bool) -> str:
    """The run option in force: the default (``HYBRID``) becomes ``PS`` for ``sync=False``."""
    if config.run_option is None and not sync:
        return "PS"
    return config.effective_run_option


def _local_overrides(config: Config) -> dict:
    """In one process every variable is local: only the densities of the overrides matter."""
    return {k: {"density": v["density"]} for k, v in config.plan_overrides.items() if "density" in v}


def _session_extras(config: Config, plan: Plan, saves: bool) -> dict:
    """Checkpoints (only ``saves`` restores and saves) and user hooks, for ``start_session``."""
    return {"saved_names": frozenset(v.name for v in plan.variables), "ckpt": config.ckpt_config, "saves": saves,
            "hooks": tuple(config.hooks)}


def _in_trial(result: tuple) -> tuple:
    """During a partition-search trial, the session times its steps and ends the trial."""
    trial = search.active_trial()
    if trial is None:
        return result
    session, *rest = result
    return (search.TrialSession(session, trial), *rest)


def _search_partitions(graph: tf.Graph, cluster: Cluster, config: Config, sync: bool,
                       context: RankContext | None, launching: bool) -> None:
    """``search_partitions=True`` (see :mod:`parallax.search`): returns when this call should
    go on as usual; otherwise searches, trains with the best count and ends the process."""
    from parallax.partitioner import PARTITIONS_ENV

    if search.active_trial() is not None or search.in_final_run():
        return  # a nested run of the script, inside the search
    if context is not None and context.spec.role == "ps":
        return  # servers serve every trial
    start = search.min_partitions(graph)
    if start is None:
        logger.warning("Parallax: search_partitions=True, but no variable is built with "
                       "parallax.get_partitioner(): nothing to search")
        return
    if os.environ.get(PARTITIONS_ENV):
        logger.warning("Parallax: partition count %s given (%s): no search", os.environ[PARTITIONS_ENV],
                       PARTITIONS_ENV)
        return
    with open(cluster.source, encoding="utf-8") as f:
        key = search.cache_key(graph, f.read(), _run_option(config, sync), sync)
    cached = search.cached_count(key) if context is None else None
    if cached is not None:
        logger.warning("Parallax: partition search: using %d partitions found by an earlier search (cache %s)",
                       cached, key[:12])
        os.environ[PARTITIONS_ENV] = str(cached)
        if launching:
            return  # the launched processes build the graph with it
        search.run_final(cached)
        raise SystemExit(0)
    if launching:
        return  # the launched processes search
    comm = None
    if context is not None and context.run_option in ("PS", "HYBRID"):
        comm = _worker_comms(context)[0]  # the servers make these with the workers, then serve every trial
    elif context is not None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    rows = max([shape[0] or 1 for shape in _partitioned_shapes(graph)], default=1)

    def agree(seconds: float | None) -> float | None:
        if comm is None:
            return seconds
        values = [v for v in comm.allgather(seconds) if v is not None]
        return max(values) if len(values) == comm.size else None

    def between_trials() -> None:
        if comm is not None:
            comm.Barrier()
        server = _PROCESS.get("server")
        if server is not None and (comm is None or comm.rank == 0):
            tf.compat.v1.Session.reset(server.target)  # the servers forget the trial's variables
        if comm is not None:
            comm.Barrier()

    best, results, seconds = search.search(start, rows, agree, between_trials, report=comm is None or comm.rank == 0)
    if comm is None or comm.rank == 0:
        path = search.store_count(key, best, results, seconds)
        logger.warning("Parallax: partition search chose %d partitions (%s) in %.1f s; stored in %s", best,
                       ", ".join(f"{p}: {t * 1e3:.2f} ms/step" for p, t in results.items()), seconds, path)
    search.run_final(best)
    raise SystemExit(0)


def _partitioned_shapes(graph: tf.Graph) -> list[tuple]:
    """Full shapes of the variables split by a partitioner (their ``save_slice_info``)."""
    shapes = []
    for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        info = getattr(v, "_save_slice_info", None)
        if info is not None:
            shapes.append(tuple(info.full_shape))
    return shapes


#: What a process starts once and keeps across partition-search trials.
_PROCESS: dict[str, object] = {}


def _once(key: str, make):
    """``make()`` the first time this process asks for ``key``; the same object after."""
    if key not in _PROCESS:
        _PROCESS[key] = make()
    return _PROCESS[key]


def _worker_entry(index: int, host: str, devices) -> tuple[str, tuple[str, ...], str]:
    """``(host, replica devices, shared device)`` of worker task ``index`` with ``(kind, index)`` devices."""
    prefix = f"/job:worker/replica:0/task:{index}"
    return host, tuple(f"{prefix}/device:{k.upper()}:{i}" for k, i in devices), f"{prefix}/device:CPU:0"


def _load_graph(single_gpu_graph) -> tuple[tf.Graph, meta_graph_pb2.MetaGraphDef]:
    if isinstance(single_gpu_graph, tf.Graph):
        with single_gpu_graph.as_default():
            meta = tf.compat.v1.train.export_meta_graph(graph=single_gpu_graph,
                                                        clear_extraneous_savers=True)
        return single_gpu_graph, meta
    if isinstance(single_gpu_graph, (str, os.PathLike)):
        path = os.fspath(single_gpu_graph)
        if not os.path.exists(path):
            raise ValueError(f"parallel_run: single_gpu_graph {path!r} does not exist; expected a "
                             "tf.Graph or the path of a MetaGraphDef (.meta) file")
        meta = meta_graph_pb2.MetaGraphDef()
        with open(path, "rb") as f:
            data = f.read()
        try:
            meta.ParseFromString(data)
        except Exception:  # noqa: BLE001 - fall back to the text format
            from google.protobuf import text_format

            text_format.Merge(data.decode("utf-8"), meta)
        single_gpu_graph = meta
    if isinstance(single_gpu_graph, meta_graph_pb2.MetaGraphDef):
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.train.import_meta_graph(single_gpu_graph)
        return graph, single_gpu_graph
    raise TypeError(f"parallel_run: single_gpu_graph must be a tf.Graph or a MetaGraphDef, got "
                    f"{type(single_gpu_graph).__name__}")


def _resolve_devices(worker: WorkerTask, source: str) -> tuple[Device, ...]:
    gpus = len(tf.config.list_physical_devices("GPU"))
    if worker.devices is None:
        return tuple(Device("gpu", i) for i in range(gpus)) if gpus else (Device("cpu", 0),)
    for d in worker.devices:
        if d.kind == "gpu" and d.index >= gpus:
            raise LaunchError(
                f"{source}, line {worker.line}: lists GPU {d.index} of {worker.host}, but TensorFlow "
                f"sees {gpus} GPU(s) on this machine. For replicas on the CPU write cpu:<n> ids, e.g. "
                f"\"{worker.host}: cpu:0,cpu:1\"")
    return worker.devices


def _replicated_ops(meta: meta_graph_pb2.MetaGraphDef, plan: Plan) -> frozenset[str]:
    shard_ops = frozenset(n for n in shard_op_names(meta) if n)
    return classify(meta.graph_def, plan, extra_inputs=shard_ops).replicated | shard_ops
