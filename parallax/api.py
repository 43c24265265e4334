"""``parallel_run``: resources -> analysis -> plan -> rewrite -> session."""

from __future__ import annotations

import logging
import os
import socket

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2

from parallax.analysis import analyse_graph
from parallax.config import Config
from parallax.errors import LaunchError
from parallax.plan import Plan, TaskSpec, build_plan
from parallax.resources import LOCAL_HOSTS, Cluster, Device, WorkerTask, parse_resource_file
from parallax.rewrite.classify import classify
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.rewrite.replicate import shard_op_names
from parallax.session import ParallaxSession

__all__ = ["parallel_run"]

logger = logging.getLogger("parallax")


def parallel_run(single_gpu_graph: tf.Graph | meta_graph_pb2.MetaGraphDef | str,
                 resource_info: str | os.PathLike, sync: bool = True,
                 parallax_config: Config | None = None
                 ) -> tuple[ParallaxSession, int, int, int]:
    """Train ``single_gpu_graph`` data-parallel on the devices of ``resource_info``.

    The graph is analysed (variables, gradients, training op), a plan is made,
    the graph is rewritten so that every listed device holds a replica, and a
    session over the rewritten graph is returned, with the variables
    initialized.

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
        LaunchError: the resources cannot be used from this process.
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
    _warn_unapplied(config)
    graph, meta_graph = _load_graph(single_gpu_graph)
    cluster = parse_resource_file(resource_info)
    worker = _local_worker(cluster)
    devices = _resolve_devices(worker, cluster.source)

    analysis = analyse_graph(graph)
    plan = build_plan(analysis, [(worker.host, devices)], run_option=config.effective_run_option,
                      sync=sync, average_sparse=config.average_sparse)
    logger.info("Parallax plan:\n%s", plan.describe())
    task = TaskSpec(worker_index=0)
    rewritten = rewrite_for_task(meta_graph, plan, task)
    session, dist_graph = _start_session(rewritten, plan, devices, config)
    replicated = _replicated_ops(meta_graph, plan)
    wrapper = ParallaxSession(session, dist_graph, graph, replicated, len(devices))
    return wrapper, plan.num_workers, task.worker_index, len(devices)


# --------------------------------------------------------------------------- #
def _warn_unapplied(config: Config) -> None:
    """Say which accepted settings this version does not act on yet (docs/status.md)."""
    unapplied = []
    if config.ckpt_config.ckpt_dir is not None:
        unapplied.append("ckpt_config")
    if config.profile_config.profile_dir is not None:
        unapplied.append("profile_config")
    if config.redirect_path is not None:
        unapplied.append("redirect_path")
    if config.search_partitions:
        unapplied.append("search_partitions")
    if unapplied:
        logger.warning("Parallax: %s accepted and validated but not applied in this version "
                       "(see docs/status.md)", ", ".join(unapplied))


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


def _is_local(host: str) -> bool:
    if host in LOCAL_HOSTS or host.startswith("127."):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    if host in names:
        return True
    try:
        address = socket.gethostbyname(host.strip("[]"))
    except OSError:
        return False
    if address.startswith("127."):
        return True
    try:
        local = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        local = set()
    return address in local


def _local_worker(cluster: Cluster) -> WorkerTask:
    if len(cluster.workers) > 1 or cluster.servers:
        where = ", ".join(f"{w.host} (line {w.line})" for w in cluster.workers)
        raise LaunchError(
            f"{cluster.source}: describes {len(cluster.workers)} worker processes ({where})"
            f"{' and parameter servers' if cluster.servers else ''}. This version of Parallax runs "
            "one worker process with one replica per listed device of that host; list every device "
            "of the host on one line (e.g. \"localhost: cpu:0,cpu:1\" or \"localhost: 0,1\")")
    worker = cluster.workers[0]
    if not _is_local(worker.host):
        raise LaunchError(
            f"{cluster.source}, line {worker.line}: host {worker.host!r} is not this machine "
            f"({socket.gethostname()}). This version of Parallax runs on the local host only; "
            "use localhost or this machine's name")
    return worker


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


def _session_config(config: Config, devices: tuple[Device, ...]) -> config_pb2.ConfigProto:
    proto = config_pb2.ConfigProto()
    if config.sess_config is not None:
        proto.CopyFrom(config.sess_config)
    proto.allow_soft_placement = True
    cpus = max([d.index + 1 for d in devices if d.kind == "cpu"], default=0)
    if cpus > proto.device_count.get("CPU", 1):
        proto.device_count["CPU"] = cpus
    return proto


def _start_session(meta: meta_graph_pb2.MetaGraphDef, plan: Plan, devices: tuple[Device, ...],
                   config: Config):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta, clear_devices=False)
        scaffold = tf.compat.v1.train.Scaffold()
        session = tf.compat.v1.train.MonitoredTrainingSession(
            is_chief=True, checkpoint_dir=None, scaffold=scaffold, config=_session_config(config, devices),
            save_checkpoint_secs=None, save_summaries_steps=None, save_summaries_secs=None,
            log_step_count_steps=None)
    return session, graph


def _replicated_ops(meta: meta_graph_pb2.MetaGraphDef, plan: Plan) -> frozenset[str]:
    shard_ops = frozenset(n for n in shard_op_names(meta) if n)
    return classify(meta.graph_def, plan, extra_inputs=shard_ops).replicated | shard_ops
