"""``parallel_run``: the door. Parse, plan, dispatch (see docs/architecture.md).

1. resolve what is in force once (:func:`parallax.job.in_force.in_force`: the script's config and
   resources with every replacement the invocation asks for), make the program (a TensorFlow 2 step
   through :func:`parallax.tf2.front.program`, the door's only way into ``tf2/``), and read the graph
   (:mod:`parallax.runtime.graph_input`), the resource file (:mod:`parallax.resources.files`) and the
   config into frozen :class:`~parallax.job.settings.Settings` (:func:`parallax.job.settings.derive`);
2. make the :class:`~parallax.job.plan.JobPlan` from the graph's analysis: every
   process of the job, its role and devices, and where each variable goes;
3. dispatch: print the plan (``parallax plan``), write the mpirun command
   (``--dry_run``), launch the job's processes and wait for them, or, in a
   process that trains (alone, or launched), let its role set it up
   (:mod:`parallax.member.roles`) and start its session (:func:`parallax.member.startup.start_worker`).

A call that ends its process (launching, serving, printing a plan, a partition
search) returns an exit code to :func:`parallel_run`, which exits in one place.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.analysis import analyse_graph
from parallax.config import CheckPointConfig, Config
from parallax.errors import ParallaxError
from parallax.invocation import USE_TUNED_ENV, Invocation, Kind, PlanRequest, current
from parallax.job.choice import describe_choice
from parallax.job.in_force import InForce, in_force, with_tuned
from parallax.job.overrides import environment_warning, partition_overrides, tuned_warning
from parallax.job.paths import check_paths
from parallax.job.plan import JobPlan, plan_job
from parallax.launch.elastic import checkpoint_to_text, elastic_checkpoints, latest_checkpoint, run_elastic
from parallax.launch.launcher import current_program, job_command, launch
from parallax.launch.runner import JobResult
from parallax.logs import log as logger
from parallax.manifests import write_requested
from parallax.manifests.common import planner
from parallax.member.identity import numbers, replicas_in_job
from parallax.member.joined import JoinedProcess, joined_process
from parallax.member.rank import LaunchedProcess, launched_process
from parallax.member.roles import check_local_devices, local_replicas, role_setup
from parallax.member.seeds import job_seed
from parallax.member.startup import start_worker
from parallax.plan import Plan
from parallax.resources.cluster import Cluster, Role
from parallax.resources.files import parse_resource_file, parse_resource_text
from parallax.runtime.checkpoint import check_checkpoint, check_schedule
from parallax.runtime.graph_input import load_graph
from parallax.runtime.session import ParallaxSession
from parallax.tf2.front import Program, deferred, graph_of, is_step_function, needs_first_call, program
from parallax.trials.mode import in_trial
from parallax.tuning import search

if TYPE_CHECKING:
    from parallax.tf2.step import DistributedStep

__all__ = ["parallel_run", "preview_plan"]

Graph = tf.Graph | meta_graph_pb2.MetaGraphDef | str | os.PathLike | Any  # Any: a tf.function step


def parallel_run(single_gpu_graph: Graph, resource_info: str | os.PathLike | None, sync: bool = True,
                 parallax_config: Config | None = None) -> tuple[ParallaxSession | DistributedStep, int, int, int]:
    """Train ``single_gpu_graph`` data-parallel on the devices of ``resource_info``.

    The graph is analysed (variables, gradients, training op), a plan is made,
    the graph is rewritten for this process, and a session over the rewritten
    graph is returned with the variables initialized (equal on every worker).

    With ``run_option='MPI'`` (or a resource file that needs several worker
    processes), the first call starts the whole job: it runs this same program
    once per process of the job plan through ``mpirun``, where each process's
    ``parallel_run`` returns its own session; the launching process then waits
    and exits with the job's exit code (it does not return).

    Example::

        sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
            graph, "resource_info")
        for step in range(1000):
            loss_values, _ = sess.run([loss, train_op], feed_dict={x: [b0, b1], y: [l0, l1]})

    A TensorFlow 2 training step, a ``tf.function`` (with an ``input_signature``, or traced at its first
    call from its arguments: :mod:`parallax.tf2.deferred`), is
    taken too (:mod:`parallax.tf2`): it is traced into the same kind of graph, and
    what comes back is a step to call like it, each argument one batch per replica::

        step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, "resource_info")
        for x, y in batches:
            losses = step([x], [y])     # one batch per local replica; one loss each

    Args:
        single_gpu_graph: a ``tf.Graph`` that trains on one device, or its
            ``MetaGraphDef`` (a proto, or the path of a ``.meta`` file), or a
            ``tf.function`` training step.
        resource_info: path of the resource file (see ``docs/resources.md``);
            ``"slurm"`` (or ``None`` inside a Slurm allocation): the nodes of the
            allocation this process runs in (:mod:`parallax.resources.slurm`).
        sync: synchronous training (``False`` needs ``run_option='PS'``).
        parallax_config: a :class:`parallax.Config`; defaults when ``None``.

    Returns:
        ``(session, num_workers, worker_id, num_replicas_per_worker)``; for a
        ``tf.function``, a :class:`parallax.tf2.step.DistributedStep` in place of the session.

    Raises:
        TypeError, ValueError: bad arguments or config values.
        ResourceFileError: the resource file is malformed.
        AnalysisError: the graph has no training op.
        LaunchError: the resources cannot be used as asked.
    """
    return _parallel_run(single_gpu_graph, resource_info, sync, parallax_config)


def _parallel_run(single_gpu_graph: Graph, resource_info: str | os.PathLike | None, sync: bool,
                  parallax_config: Config | None, signature: Any = None) -> tuple:
    """:func:`parallel_run`, with the signature a ``tf.function`` step without one was first called with."""
    config = _checked_config(parallax_config, sync, resource_info)
    invocation = current()  # the environment, read once here: what it asks goes down as arguments
    if signature is None and needs_first_call(single_gpu_graph):  # traced at its first call
        known = numbers(invocation, resource_info, config.redirect_path, len(tf.config.list_physical_devices("GPU")))
        return deferred(single_gpu_graph, lambda first: _parallel_run(
            single_gpu_graph, resource_info, sync, parallax_config, first), known)
    # everything that replaces the script's settings, and a TensorFlow 2 step's conventions
    force = in_force(config, resource_info, invocation, step=is_step_function(single_gpu_graph), sync=sync)
    run = program(single_gpu_graph, force.config, signature)  # a TensorFlow 2 step: traced
    try:
        outcome = _run(run, force, sync, invocation)
    except ParallaxError as e:
        if invocation.plan is None:
            raise
        print(f"parallax: {e}", file=sys.stderr, flush=True)  # parallax plan / manifest: the reason, no traceback
        outcome = 2
    if isinstance(outcome, int):
        raise SystemExit(outcome)  # the one place a parallel_run call ends its process
    return run.wrap(outcome)


def job_replicas(resource_info: str | os.PathLike | None, parallax_config: Config | None = None) -> int | None:
    """How many replicas a ``parallel_run`` call with these arguments trains in all (every worker's), as this
    process knows it before the call: the same number in the process the user started and in the ranks the
    launcher starts; ``None`` in a task a cluster manager started, or where the resources cannot be read."""
    config = parallax_config if parallax_config is not None else Config()
    invocation = current()
    try:
        force = in_force(config, resource_info, invocation, step=True)
    except ValueError:
        return None
    return replicas_in_job(invocation, force.resource_info, force.config.redirect_path,
                           len(tf.config.list_physical_devices("GPU")))


def preview_plan(single_gpu_graph: Graph, resource_info: str | os.PathLike | None, sync: bool = True,
                 parallax_config: Config | None = None) -> Plan:
    """The variable plan ``parallel_run`` would use, without starting anything.

    It is the plan of the same :class:`~parallax.job.plan.JobPlan` a real run makes
    (``parallax plan`` prints the whole job plan).
    """
    config = _checked_config(parallax_config, sync, resource_info)
    step = is_step_function(single_gpu_graph)
    invocation = current()
    force = in_force(config, resource_info, invocation, step=step, sync=sync)
    graph, _ = load_graph(graph_of(single_gpu_graph) if step else single_gpu_graph)
    cluster = parse_resource_file(force.resource_info)
    return plan_job(force.config, sync, cluster, analyse_graph(graph), invocation=invocation)[1].plan


def _checked_config(parallax_config: Config | None, sync: bool, resource_info: str | os.PathLike | None) -> Config:
    config = parallax_config if parallax_config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"parallel_run: parallax_config must be a parallax.Config, got {type(config).__name__}")
    if not isinstance(sync, bool):
        raise TypeError(f"parallel_run: sync must be True or False, got {sync!r}")
    if not isinstance(resource_info, (str, os.PathLike, type(None))):
        raise TypeError(f"parallel_run: resource_info must be the path of a resource file (or 'slurm'), got "
                        f"{type(resource_info).__name__}")
    return config


@dataclass(frozen=True)
class _Call:
    """One ``parallel_run`` call, ready for its handler: the invocation, the graph in both forms, and what is in
    force (:func:`parallax.job.in_force.in_force`; its config the program's: a TensorFlow 2 step keeps its own
    checkpoint)."""

    invocation: Invocation
    graph: tf.Graph
    meta_graph: meta_graph_pb2.MetaGraphDef
    force: InForce
    sync: bool
    step_ckpt_dir: str | None = None  # a tf.function step's own checkpoints' (elastic mode adds none)

    @property
    def config(self) -> Config:
        return self.force.config

    @property
    def resource_info(self) -> str | os.PathLike | None:
        return self.force.resource_info

    @property
    def in_trial(self) -> bool:
        """A trial's job (of ``parallax tune``, a search, a sweep, or any trial runner's): it keeps nothing, so it
        is neither restarted nor preempted with a checkpoint."""
        return self.invocation.trial is not None or self.invocation.trial_result is not None

    def report_overrides(self) -> None:
        """Say at WARNING each of the script's settings the environment replaces (once per job: see the
        handlers)."""
        for override in (*self.force.environment,
                         *partition_overrides(search.min_partitions(self.graph), self.invocation)):
            logger.warning(environment_warning(override))


def _run(run: Program, force: InForce, sync: bool, invocation: Invocation) -> tuple | int:
    """Hand the call to the handler of its ``invocation``'s kind; an ``int`` is the exit code the process ends
    with."""
    graph, meta_graph = load_graph(run.graph)
    check_schedule(run.config.ckpt_config, graph)
    check_checkpoint(run.config.ckpt_config, graph)  # another model's checkpoint: refused before anything starts
    call = _Call(invocation, graph, meta_graph, replace(force, config=run.config), sync, run.ckpt_dir)
    return _HANDLERS[invocation.kind](call)


def _answer_request(call: _Call) -> int:
    """``parallax plan``, ``parallax manifest``, ``parallax tune``: plan the job as its processes would, answer,
    start nothing."""
    request = call.invocation.plan
    cluster = parse_resource_file(call.resource_info)
    analysis = analyse_graph(call.graph)
    if request.kind == "tune":  # every layout, not the script's own
        return _write_candidates(call, request, cluster, analysis)
    _, job = plan_job(call.config, call.sync, cluster, analysis, manager=request.manager, invocation=call.invocation)
    if request.kind == "manifest":
        return write_requested(job, cluster, request.manifest, planner(call.config, call.sync, analysis,
                                                                       call.invocation))
    return _print_plan(job, request.output)


def _run_launched(call: _Call) -> tuple | int:
    """A process the launcher started: plan as the launcher did (its allocation, its tuned choice), check it
    plans the launcher's job, then take its part."""
    launched = launched_process(call.invocation, call.config.redirect_path)
    sent = launched.context.job.allocation  # a rank's own Slurm variables describe its step, not the job
    cluster = parse_resource_text(sent["text"], source=sent["source"]) if sent is not None \
        else parse_resource_file(call.resource_info)
    config = call.config
    if call.invocation.trial is None:
        config, code, _ = _tuned(call, cluster, launched=True)
        if code is not None:
            return code
    settings, job = plan_job(config, call.sync, cluster, analyse_graph(call.graph), gpus=launched.context.job.gpus,
                             invocation=call.invocation)
    launched.check_job(job, settings, cluster.source)
    check_local_devices(job, settings, cluster.source, launched.process_in(job))
    setup = role_setup(job, settings, launched)
    if setup.serve_only:
        return 0  # the exit barrier holds a server until every worker has finished
    return in_trial(start_worker(setup, job, settings, call.graph, call.meta_graph), job, call.invocation, launched)


def _run_managed(call: _Call) -> tuple | int:
    """A process a cluster manager started (``TF_CONFIG``): take its task's part; nothing is launched. A
    ``TF_CONFIG`` of one task is a plain call."""
    joined = joined_process(call.invocation)
    if joined is None:
        return _run_plain(call)
    if _speaks_for_the_job(None, joined, call.invocation.search.rerun):
        call.report_overrides()
    if call.resource_info is not None:
        logger.info("Parallax: %s describes the cluster; resource_info %s is not read", joined.managed.manager,
                    os.fspath(call.resource_info))
    cluster = parse_resource_text(joined.managed.cluster_text, source=joined.managed.source)
    settings, job = plan_job(call.config, call.sync, cluster, analyse_graph(call.graph),
                             manager=joined.managed.manager, invocation=call.invocation)
    joined.begin_call(settings)
    check_local_devices(job, settings, cluster.source, joined.process_in(job) if job.launched else None)
    if not job.launched:  # one worker and no ps task: it trains alone
        _say_notes(job)
        return start_worker(local_replicas(job, settings), job, settings, call.graph, call.meta_graph)
    setup = role_setup(job, settings, joined)
    if setup.serve_only:
        return 0  # the exit barrier holds the server until every worker has finished
    return start_worker(setup, job, settings, call.graph, call.meta_graph)


def _say_notes(job: JobPlan) -> None:
    """What the job chose for the user (INFO) and what differs from what was asked or from one device (WARNING)."""
    for choice in job.choices:
        logger.info("Parallax: %s", choice)
    for note in job.notes:
        logger.warning("Parallax: %s", note)


def _run_plain(call: _Call) -> tuple | int:
    """The process the user started (or a trial's): train here (one local worker) or launch the job."""
    cluster = parse_resource_file(call.resource_info)
    config, tuned, rerun = call.config, None, call.invocation.search.rerun
    if call.invocation.trial is None:
        if _speaks_for_the_job(None, None, rerun):
            call.report_overrides()
        # the script run again by its starter takes the tuned choice its starter took
        config, code, tuned = _tuned(call, cluster, launched=rerun)
        if code is not None:
            return code
    analysis = analyse_graph(call.graph)
    settings, job = plan_job(config, call.sync, cluster, analysis, invocation=call.invocation)
    elastic = config.elastic_config.enabled and job.launched and not call.in_trial
    checkpoints = _elastic_checkpoints(call, config) if elastic else None
    if checkpoints is not None:
        config = replace(config, ckpt_config=checkpoints)
        settings, job = plan_job(config, call.sync, cluster, analysis, invocation=call.invocation)
    _say_notes(job)
    dry_run = call.invocation.dry_run
    if dry_run:  # parallax-run --dry_run
        text = "# one worker on this machine: the script trains in its own process, nothing is launched"
        if job.launched:
            command, _ = job_command(job.ranks, _launch_info(job, settings, cluster, checkpoints, job_seed()),
                                     current_program(), settings.mpirun_options, "<job dir>",
                                     invocation=call.invocation, tuned=tuned)
            text = f"# run_option {job.layout}, {len(job.ranks)} processes\n" + " ".join(command.argv)
        with open(dry_run, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        return 0
    check_local_devices(job, settings, cluster.source)  # before anything starts
    here = [p for p in job.processes if p.role == Role.WORKER and (not job.launched or p.host in settings.local_hosts)]
    check_paths(settings.ckpt, settings.export_graph_path, saves=any(p.index == 0 for p in here), exports=bool(here))
    if settings.search_partitions:
        code = search.partition_search(call.graph, cluster.text, settings, cluster.device_keys(), call.invocation,
                                       tuned)
        if code is not None:
            return code
    if not job.launched:
        return in_trial(start_worker(local_replicas(job, settings), job, settings, call.graph, call.meta_graph), job,
                        call.invocation)
    return _launch_job(call, config, cluster, analysis, (settings, job), checkpoints, elastic, tuned)


def _launch_job(call: _Call, config: Config, cluster: Cluster, analysis, planned: tuple, checkpoints:
                CheckPointConfig | None, elastic: bool, tuned: dict | None = None) -> int:
    """Launch the job ``planned`` (its settings and job plan for ``cluster``; its ranks apply the ``tuned``
    choice) and wait for it: again on the hosts left after a failure when ``elastic``
    (:mod:`parallax.launch.elastic`); say how it ended. Returns the exit code."""
    settings = planned[0]
    ckpt_dir = settings.ckpt.ckpt_dir or call.step_ckpt_dir
    program = current_program()
    preemptible = not call.in_trial  # a trial keeps nothing: a SIGTERM ends it at once
    seed = job_seed()  # one a job: a restarted job's ranks prepare the same data as the first ones

    def start(resources: Cluster) -> JobResult:
        _, job = planned if resources is cluster else plan_job(config, call.sync, resources, analysis,
                                                               invocation=call.invocation)
        return launch(job.ranks, program, _launch_info(job, settings, resources, checkpoints, seed),
                      settings.mpirun_options,
                      redirect_path=settings.redirect_path, stall_timeout=settings.timeouts.stall,
                      stall_shutdown=settings.timeouts.shutdown,
                      preemptible=preemptible, invocation=call.invocation, tuned=tuned)

    if elastic:
        chosen = " (chosen by elastic mode: the program names none)" \
            if not (call.config.ckpt_config.ckpt_dir or call.step_ckpt_dir) else ""
        print(f"Parallax elastic: up to {config.elastic_config.max_restarts} restart(s); checkpoints in "
              f"{ckpt_dir}{chosen}", file=sys.stderr, flush=True)
        result = run_elastic(cluster, config.elastic_config, ckpt_dir, start, program)
    else:
        result = start(cluster)
    if result.preempted:
        saved = latest_checkpoint(ckpt_dir)
        print(f"Parallax: the job was preempted ({result.preempted}) and exits with code {result.returncode}; "
              + (f"its last checkpoint is {os.path.join(ckpt_dir, saved)}: the same command resumes "
                 "from it" if saved else "nothing was saved (no CheckPointConfig.ckpt_dir)"),
              file=sys.stderr, flush=True)
    if result.failure is not None:
        sys.stderr.write(f"\n{result.failure}\n")
        sys.stderr.flush()
    return result.returncode


def _launch_info(job: JobPlan, settings, cluster: Cluster, checkpoints: CheckPointConfig | None, seed: int) -> dict:
    """What every launched rank learns of the job (:attr:`~parallax.member.bootstrap.RankContext.job`); ``seed``:
    its random generators' (:mod:`parallax.member.seeds`)."""
    info = {"layout": job.layout, "digest": job.digest(), "gpus": settings.gpus, "staggered": settings.staggered_start,
            "seed": seed}
    if cluster.from_environment:  # the launched processes' environment does not describe the job
        info["allocation"] = {"text": cluster.text, "source": cluster.source}
    if checkpoints is not None:
        info["checkpoints"] = checkpoint_to_text(checkpoints)
    return info


def _elastic_checkpoints(call: _Call, config: Config) -> CheckPointConfig | None:
    """The checkpoints elastic mode adds (:func:`parallax.launch.elastic.elastic_checkpoints`), checked against
    the graph as the program's own are.

    Raises:
        ValueError: the graph has no global step to resume at.
    """
    if call.step_ckpt_dir:  # a tf.function step: its own checkpoints count its steps
        return None
    if tf.compat.v1.train.get_global_step(call.graph) is None:
        raise ValueError("ElasticConfig: a restarted job resumes at the global step of its last checkpoint, and "
                         "this graph has none: create it with tf.compat.v1.train.get_or_create_global_step() and "
                         "pass it to minimize(..., global_step=...)")
    checkpoints = elastic_checkpoints(config.ckpt_config, config.elastic_config, current_program())
    if checkpoints is not None:
        check_checkpoint(checkpoints, call.graph)
    return checkpoints


def _speaks_for_the_job(launched: LaunchedProcess | None, joined: JoinedProcess | None, rerun: bool = False) -> bool:
    """Whether this process reports what replaced the script's settings, once for the whole job: the
    process the user started (not one it launched, nor the script run again by it: ``rerun``), or, in a job a
    cluster manager started, its worker 0."""
    if launched is not None or rerun:
        return False
    return joined is None or joined.task == joined.managed.tasks[0]


#: The handler of each kind of invocation (:attr:`parallax.invocation.Invocation.kind`).
_HANDLERS = {Kind.PLAN: _answer_request, Kind.MANIFEST: _answer_request, Kind.TUNE: _answer_request,
             Kind.LAUNCHED: _run_launched, Kind.MANAGED: _run_managed, Kind.TRIAL: _run_plain, Kind.PLAIN: _run_plain}


def _tuned(call: _Call, cluster: Cluster, launched: bool) -> tuple[Config, int | None, dict | None]:
    """The call's config with the layout ``parallax tune`` stored for this graph and resources
    (:mod:`parallax.tuning.cache`, applied by :func:`parallax.job.in_force.with_tuned`); an exit code when the script
    must run again (a tuned partition count); the tuned choice, for the processes this one starts.

    The process the user started (``launched=False``) says at WARNING which of the script's settings
    the layout replaces, each with the script's value and the tuned one (:func:`parallax.job.overrides.tuned_warning`).
    """
    from parallax.tuning.cache import tuned_choice

    choice, source = tuned_choice(call.graph, cluster.text, call.sync, launched, call.invocation)
    if choice is None:
        return call.config, None, None
    tuned, parts = with_tuned(call.force, choice, search.min_partitions(call.graph), call.invocation)
    if not launched:
        applied = {k: v for k, v in choice.items() if k != "partitions" or parts is not None}
        logger.warning(tuned_warning(tuned.tuned, describe_choice(applied), source, USE_TUNED_ENV))
    if parts is not None:  # the script again: its graph built with the tuned count
        return call.config, search.run_final(parts, choice), choice
    return tuned.config, None, choice


def _write_candidates(call: _Call, request: PlanRequest, cluster: Cluster, analysis) -> int:
    """``parallax tune``'s first step: every layout planned and ordered (:mod:`parallax.tuning.candidates`)."""
    from functools import partial

    from parallax.tuning.cache import tune_key
    from parallax.tuning.candidates import layout_space, plan_candidates

    graph, config, sync = call.graph, call.config, call.sync
    counts = search.partition_counts(graph)
    choices = layout_space(cluster, analysis, counts[:3] if counts else None, request.tune.get("space"),
                           config.communication_config.compression)
    ranked = plan_candidates(cluster, analysis, config, sync, choices, partial(plan_job, invocation=call.invocation))
    with open(request.output, "w", encoding="utf-8") as f:
        json.dump({"key": tune_key(graph, cluster.text, sync), "candidates": [c.to_dict() for c in ranked]}, f,
                  indent=1)
    return 0


def _print_plan(job: JobPlan, output: str | None) -> int:
    """``parallax plan``: print the job plan (and write its variable plan as JSON)."""
    print(job.describe(), flush=True)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            json.dump(job.plan.to_dict(), f, indent=1, sort_keys=True)
    return 0

