"""The start-up tail every worker process shares: rewrite, bind, start the session, wrap it.

:func:`start_worker` takes what a role set up (:class:`parallax.member.roles.ProcessSetup`)
and the job plan: it rewrites the single-device graph for this worker, writes
it to ``Config.export_graph_path`` when asked, lets each communication backend
the plan uses prepare the graph for this process, imports it into a fresh graph
and starts a ``MonitoredSession`` (which initialises the variables, or waits
for the chief to), makes every worker start from worker 0's values where the
workers hold variables themselves (:mod:`parallax.comm.broadcast`), and returns the :class:`ParallaxSession`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2

from parallax.comm.registry import backends_in_use
from parallax.errors import PeerLost
from parallax.graph.names import release_op, writes_barrier_op
from parallax.job.paths import check_paths
from parallax.logs import log as logger
from parallax.member import preemption
from parallax.member.servers import session_config
from parallax.plan import Plan, TaskSpec
from parallax.rewrite.classify import classify
from parallax.rewrite.fused_updates import fused_graph
from parallax.rewrite.pipeline import rewrite_for_task, wait_points
from parallax.rewrite.ps_sync import PROGRAM_WRITES, UNSYNCHRONISED
from parallax.rewrite.replicate import shard_op_names
from parallax.rewrite.zero import held_in_parts
from parallax.runtime.checkpoint import checkpointing
from parallax.runtime.graph_input import export_graph
from parallax.runtime.hooks import HookAdapter, SessionTranslation, begin_hooks, run_past_hooks
from parallax.runtime.profiling import Profiler
from parallax.runtime.session import ParallaxSession, WritesBarrier
from parallax.runtime.translate import Translator

if TYPE_CHECKING:
    from parallax.job.plan import JobPlan
    from parallax.job.settings import Settings
    from parallax.member.roles import ProcessSetup

__all__ = ["start_worker"]

def start_worker(setup: ProcessSetup, job: JobPlan, settings: Settings, graph: tf.Graph,
                 meta_graph: meta_graph_pb2.MetaGraphDef) -> tuple[ParallaxSession, int, int, int]:
    """Turn a worker's setup into its session (see the module docstring).

    Returns:
        ``(session, num_workers, worker_id, num_replicas_per_worker)``, as ``parallel_run``.
    """
    plan, process = job.plan, setup.process
    task = TaskSpec(worker_index=process.index)
    # on this process's own host (the launcher checked only the hosts it runs on)
    check_paths(settings.ckpt, settings.export_graph_path, saves=setup.saves, exports=True)
    if process.index == 0:
        logger.info("Parallax plan:\n%s", job.describe())
    if begin_hooks(settings.hooks, graph):  # what the hooks built in begin() is part of the graph rewritten
        meta_graph = export_graph(graph)
    rewritten = rewrite_for_task(meta_graph, plan, task)
    if settings.fuse_updates:
        rewritten = fused_graph(rewritten, plan, settings.cache_root, process.host)
    if settings.export_graph_path:
        os.makedirs(settings.export_graph_path, exist_ok=True)
        path = os.path.join(settings.export_graph_path, f"worker-{task.worker_index}_metagraph")
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(rewritten))
        logger.info("Parallax: wrote the graph of worker %d to %s", task.worker_index, path)
    config = session_config(settings.sess_config, process.cpu_devices, process.visible_device_list,
                            settings.threads_per_process(process.sharing_host),
                            waiting_threads=int(plan.overlaps_backward))
    releases = list(setup.on_close)
    graph_def = rewritten.graph_def
    for backend in backends_in_use(plan):
        prepared = backend.prepare(graph_def, setup.comms)
        graph_def = prepared.graph_def
        releases.append(prepared.release)
        backend.configure_session(config, setup.comms)
    if setup.device_filters and not config.device_filters:
        config.device_filters.extend(setup.device_filters)
    if setup.server is not None and not config.operation_timeout_in_ms:
        config.operation_timeout_in_ms = settings.timeouts.operation_ms
    bound = meta_graph_pb2.MetaGraphDef()
    bound.CopyFrom(rewritten)
    bound.graph_def.CopyFrom(graph_def)
    shard_ops = frozenset(n for n in shard_op_names(meta_graph) if n)
    replicated = classify(meta_graph.graph_def, plan, extra_inputs=shard_ops).replicated | shard_ops
    num_replicas = len(plan.workers[task.worker_index].replica_devices)  # a pipeline's stages are one replica

    def translation(dist_graph: tf.Graph) -> SessionTranslation:
        return SessionTranslation(Translator(dist_graph, graph, replicated, num_replicas, held_in_parts(plan)),
                                  chief=task.worker_index == 0)

    job_preemption = preemption.for_this_job()  # this job's, which SIGTERM reaches from now on (None: not taken)
    session, translated, hooks = _start_session(bound, config, setup, settings, plan, translation, job_preemption)
    setup.heartbeat.set("user")
    wrapper = ParallaxSession(session, translated,
                              profiler=Profiler.from_config(settings.profile, task.worker_index),
                              heartbeat=setup.heartbeat,
                              waits=wait_points(plan, task), on_close=tuple(releases),
                              after_steps=_after_steps(plan, translated.translator.graph), hooks=hooks,
                              writes=_writes_barrier(plan, translated.translator.graph, task.worker_index == 0),
                              group=setup.group, preemption=job_preemption)
    return wrapper, setup.num_workers, task.worker_index, num_replicas


def _writes_barrier(plan, graph: tf.Graph, chief: bool) -> WritesBarrier | None:
    """The PS writes barrier of this worker's graph (see rewrite/program_writes.py), or ``None``."""
    writes = frozenset(_names(graph.get_collection(PROGRAM_WRITES)))
    if not writes:
        return None
    return WritesBarrier(writes, frozenset(plan.train_ops), writes_barrier_op(chief), before=not chief,
                         unsynchronised=frozenset(_names(graph.get_collection(UNSYNCHRONISED))))


def _names(values: list) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def _after_steps(plan, graph: tf.Graph) -> dict[str, str]:
    """The PS chief's releases, by training op: what its session runs after a step (see rewrite/ps_sync.py)."""
    names = {t: release_op(t) for t in plan.train_ops}
    return {t: op for t, op in names.items() if op in {o.name for o in graph.get_operations()}}


def _start_session(meta: meta_graph_pb2.MetaGraphDef, config: config_pb2.ConfigProto, setup: ProcessSetup,
                   settings: Settings, plan: Plan, translation: Callable[[tf.Graph], SessionTranslation],
                   job_preemption: preemption.Preemption | None = None) -> tuple[Any, SessionTranslation, bool]:
    """Import ``meta`` into a new graph and start a ``MonitoredSession`` on it: the chief
    initialises (restoring the latest checkpoint of ``ckpt_dir``, which holds the single-device
    graph's variables, :mod:`parallax.runtime.checkpoint`), the others wait for it; the program's hooks
    run through adapters (:mod:`parallax.runtime.hooks`) over ``translation`` of the new graph, and worker 0's
    :class:`~parallax.member.preemption.PreemptionHook` over ``job_preemption``, if any. Then the
    workers take worker 0's values and their parts of restored sharded slots. Returns the session,
    the translation and whether it runs hooks."""
    master = setup.server.target if setup.server is not None else ""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta, clear_devices=False)
        if setup.broadcast is not None:
            setup.broadcast.build(graph)
        translated = translation(graph)
        ckpt = checkpointing(graph, settings.ckpt, plan, setup.process.index, setup.saves, setup.comms.workers)
        all_hooks: list = [HookAdapter(h, translated) for h in settings.hooks] + ckpt.hooks
        if setup.saves and job_preemption is not None:  # a launched worker 0: SIGTERM saves and ends the job
            all_hooks.append(preemption.PreemptionHook(
                job_preemption, ckpt.saver if ckpt.sharded is None else None, settings.ckpt.ckpt_dir,
                "the optimizer slots are sharded over the workers (zero_stage)" if ckpt.sharded is not None else ""))
        scaffold = tf.compat.v1.train.Scaffold(saver=ckpt.saver)
        if setup.is_chief:
            creator = tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold, master=master, config=config,
                                                             checkpoint_dir=ckpt.restore_from)
        else:
            creator = _WorkerSessionCreator(scaffold, master, config, settings.timeouts.session_wait,
                                            settings.timeouts.ready_poll)
        once = setup.broadcast is not None  # the workers hold their variables: a new session would reset them
        in_graph = _InGraph(creator, graph, once, setup.process.index)
        session = tf.compat.v1.train.MonitoredSession(session_creator=in_graph, hooks=all_hooks)
    if setup.broadcast is not None:
        setup.broadcast.run(_PastHooks(session))  # no step of the program's: its hooks must not see it
    if ckpt.sharded is not None:
        ckpt.sharded.scatter(_PastHooks(session))  # every worker's part of the slots the chief restored
    return session, translated, bool(all_hooks)


class _PastHooks:
    """A ``MonitoredSession`` whose ``run`` goes past its hooks (for Parallax's own runs)."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def run(self, fetches: Any, feed_dict: Any = None) -> Any:
        return run_past_hooks(self._session, fetches, feed_dict)


class _InGraph(tf.compat.v1.train.SessionCreator):
    """A session creator that creates in ``graph``: a ``MonitoredSession`` creates its session again
    after a lost peer (an ``AbortedError`` or ``UnavailableError``, inside ``run``, wherever the program is),
    and ``Scaffold.finalize`` builds ops.

    ``once``: the session is not created again, and :class:`~parallax.errors.PeerLost` says why: where the
    workers hold their variables, the new session would initialise them again without worker 0's values, and
    the collectives' executors of the peers, aborted, would fail every op anyway. (A parameter server's job
    goes on: its variables live on the servers, and a restarted worker joins it again.)"""

    def __init__(self, creator, graph: tf.Graph, once: bool = False, worker: int = 0) -> None:
        self._creator = creator
        self._graph = graph
        self._once = once
        self._worker = worker
        self._created = False

    def create_session(self):
        if self._created and self._once:
            raise PeerLost(f"Parallax: a peer of worker {self._worker} ended or started again while they trained "
                           "together (an aborted or unavailable collective): the workers hold the variables "
                           "themselves, so the job cannot go on without all of them")
        self._created = True
        with self._graph.as_default():
            return self._creator.create_session()


class _WorkerSessionCreator(tf.compat.v1.train.SessionCreator):
    """A non-chief worker's session: waits for the chief's initialization, checking every
    ``poll_secs`` (TensorFlow's own worker creator checks every 30 s)."""

    def __init__(self, scaffold, master: str, config, max_wait_secs: float, poll_secs: float) -> None:
        self._scaffold = scaffold
        self._master = master
        self._config = config
        self._max_wait_secs = max_wait_secs
        self._poll_secs = poll_secs

    def create_session(self):
        self._scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op, local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op, ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(), recovery_wait_secs=self._poll_secs)
        return manager.wait_for_session(self._master, config=self._config, max_wait_secs=self._max_wait_secs)
