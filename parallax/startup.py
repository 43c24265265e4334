"""Turn a rewritten graph into a running session in this process.

Imports the rewritten ``MetaGraphDef`` into a fresh graph, binds what the
communication backend needs in this process, starts a
``MonitoredTrainingSession`` (which initializes the variables) and, for
multi-process jobs, makes every worker start from worker 0's variable values.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2

from parallax.errors import LaunchError

__all__ = ["start_session", "start_server", "session_config", "GROUP_LEADER"]

GROUP_LEADER = "/job:worker/replica:0/task:0"



def session_config(user: config_pb2.ConfigProto | None, cpu_devices: int = 0, visible_gpu: int | str | None = None,
                   group_leader: str | None = None, threads: int = 0) -> config_pb2.ConfigProto:
    """A copy of the user's ``sess_config`` with what Parallax needs added.

    ``threads``: when several ranks share a host, each gets its share of the
    cores for TensorFlow's thread pools (unless the user set them).
    """
    proto = config_pb2.ConfigProto()
    if user is not None:
        proto.CopyFrom(user)
    if threads > 0:
        if not proto.intra_op_parallelism_threads:
            proto.intra_op_parallelism_threads = threads
        if not proto.inter_op_parallelism_threads:
            proto.inter_op_parallelism_threads = threads
    proto.allow_soft_placement = True
    if cpu_devices > proto.device_count.get("CPU", 1):
        proto.device_count["CPU"] = cpu_devices
    if visible_gpu is not None:
        proto.gpu_options.visible_device_list = str(visible_gpu)
    if group_leader is not None:
        proto.experimental.collective_group_leader = group_leader
    return proto


def start_server(rank: int, jobs: list[tuple[str, int]], user_config: config_pb2.ConfigProto | None, *,
                 group_leader: str | None = None, cpu_devices: int = 0, attempts: int = 3,
                 port: int | None = None, protocol: str = "grpc", visible_gpus: str | None = None):
    """Start this rank's TensorFlow server in the job's cluster.

    Every rank picks a free port, the ranks exchange ``host:port`` over MPI,
    and each starts its server. A port taken between picking and binding
    makes every rank try again.

    Args:
        rank: this process's MPI rank.
        jobs: ``(job name, task index)`` of every rank, in rank order.
        user_config: the user's ``sess_config``.
        group_leader: the collective group leader, for the collective backend.
        cpu_devices: virtual CPU devices this server must offer.
        attempts: tries before giving up.
        port: this rank's port, when the resource file fixes it (no retry then).
        protocol: the servers' protocol (``PSConfig.protocol``).
        visible_gpus: the GPUs this process may use (``"1"``, ``"0,1"``), which
            then appear as GPU:0... in it; the same list must go to the session.

    Raises:
        LaunchError: no server could be started in ``attempts`` tries.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    host = socket.gethostname()
    last_error = None
    fixed = port
    for _ in range(attempts):
        if fixed is None:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        addresses = comm.allgather(f"{host}:{port}")
        spec: dict[str, list[str]] = {}
        for (job, _index), address in zip(jobs, addresses):
            spec.setdefault(job, []).append(address)
        config = session_config(user_config, cpu_devices=cpu_devices, group_leader=group_leader)
        if visible_gpus is not None:
            config.gpu_options.visible_device_list = visible_gpus
        job, index = jobs[rank]
        try:
            server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index,
                                          config=config, protocol=protocol, start=True)
            ok = True
        except tf.errors.NotFoundError as e:  # no server for this protocol in this TensorFlow build
            available = str(e).rsplit("available server factories are:", 1)[-1].strip()
            raise LaunchError(f"PSConfig.protocol={protocol!r} is not supported by this TensorFlow build "
                              f"(its servers: {available}); use protocol='grpc'") from e
        except (tf.errors.UnknownError, tf.errors.InternalError, RuntimeError) as e:  # port taken
            server, ok, last_error = None, False, e
        if all(comm.allgather(ok)):
            return server
        if any(p is not None for p in comm.allgather(fixed)):
            break  # a port fixed by the resource file is taken: trying again will not help
        time.sleep(0.2)
    raise LaunchError(f"could not start the TensorFlow servers (rank {rank} on {host}: "
                      f"{last_error or 'another rank failed'}); is a port of the resource file in use?")


def start_session(meta: meta_graph_pb2.MetaGraphDef, user_config: config_pb2.ConfigProto | None, *,
                  cpu_devices: int = 0, visible_gpu: int | str | None = None, threads: int = 0, server=None,
                  is_chief: bool = True, device_filters: tuple[str, ...] = (),
                  group_leader: str | None = None, broadcast: bool = False, bind_mpi: bool = False,
                  horovod: bool = False, comm=None, mpi_groups: dict | None = None,
                  saved_names: frozenset[str] = frozenset(), ckpt=None, saves: bool = False, hooks=()):
    """Import ``meta`` into a new graph and start a session on it.

    Args:
        meta: the rewritten graph.
        user_config: the user's ``sess_config``.
        cpu_devices: number of virtual CPU devices the replicas need.
        visible_gpu: the GPU(s) this process uses (an id, or ids joined by commas).
        threads: TensorFlow threads per pool for this process (0: TensorFlow's default).
        server: the TensorFlow server of this process (collective backend, PS).
        is_chief: this worker initializes the variables; the others wait
            for that (polling every 0.2 s, not TensorFlow's 30 s).
        device_filters: the devices this worker's session may see.
        group_leader: the collective group leader (collective backend).
        broadcast: after initialization, copy worker 0's values of the
            variables this worker holds itself (not those on parameter
            servers) to every worker (over MPI).
        bind_mpi: bind the mpi backend's ops to this process's functions.
        horovod: initialize Horovod in this process (on ``comm``).
        comm: the workers' MPI communicator (``COMM_WORLD`` when ``None``).
        mpi_groups: communicators of named worker groups (``{"host": ...}``).
        saved_names: the single-device graph's variable names (what checkpoints hold).
        ckpt: the ``CheckPointConfig``; with a ``ckpt_dir``, this process (when
            ``saves``) restores the latest checkpoint there and saves on its schedule.
        saves: this process is the one that restores and saves checkpoints.
        hooks: ``SessionRunHook`` objects to run with every step.

    Returns:
        ``(MonitoredSession, graph)``.
    """
    if bind_mpi:
        from parallax.comm.mpi import bind_py_functions

        bound = meta_graph_pb2.MetaGraphDef()
        bound.CopyFrom(meta)
        bound.graph_def.CopyFrom(bind_py_functions(meta.graph_def, comm=comm, groups=mpi_groups))
        meta = bound
    if horovod:
        from parallax.comm.horovod import prepare_process

        prepare_process(comm)
    config = session_config(user_config, cpu_devices, visible_gpu, group_leader, threads)
    if device_filters and not config.device_filters:
        config.device_filters.extend(device_filters)
    if server is not None and not config.operation_timeout_in_ms:
        config.operation_timeout_in_ms = OPERATION_TIMEOUT_MS
    master = server.target if server is not None else ""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta, clear_devices=False)
        assigns = _broadcast_ops(graph) if broadcast else None
        all_hooks = list(hooks)
        saver, ckpt_dir = None, None
        if ckpt is not None and ckpt.ckpt_dir and saves:
            from parallax.checkpoint import saver_hook, single_device_saver

            saver = single_device_saver(graph, saved_names)
            ckpt_dir = ckpt.ckpt_dir
            hook = saver_hook(ckpt_dir, ckpt.save_ckpt_steps, ckpt.save_ckpt_secs, saver) if saver else None
            if hook is not None:
                all_hooks.append(hook)
        scaffold = tf.compat.v1.train.Scaffold(saver=saver)
        if is_chief:
            creator = tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold, master=master, config=config,
                                                             checkpoint_dir=ckpt_dir)
        else:
            creator = _WorkerSessionCreator(scaffold, master, config)
        session = tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks)
    if assigns is not None:
        _broadcast(session, assigns, comm)
    return session, graph


OPERATION_TIMEOUT_MS = 10 * 60 * 1000


class _WorkerSessionCreator(tf.compat.v1.train.SessionCreator):
    """A non-chief worker's session: waits for the chief's initialization,
    checking every 0.2 s (TensorFlow's own worker creator checks every 30 s)."""

    def __init__(self, scaffold, master: str, config, max_wait_secs: float = 600) -> None:
        self._scaffold = scaffold
        self._master = master
        self._config = config
        self._max_wait_secs = max_wait_secs

    def create_session(self):
        self._scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self._scaffold.local_init_op, local_init_feed_dict=self._scaffold.local_init_feed_dict,
            ready_op=self._scaffold.ready_op, ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(), recovery_wait_secs=0.2)
        return manager.wait_for_session(self._master, config=self._config, max_wait_secs=self._max_wait_secs)


def _broadcast_ops(graph: tf.Graph):
    variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                 + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES) if "/job:ps" not in v.device]
    ops = []
    with tf.name_scope("parallax_broadcast/"):
        for v in variables:
            ph = tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
            assign = tf.compat.v1.assign(v, ph, validate_shape=False)
            ops.append((v, ph, assign.op if isinstance(assign, tf.Tensor) else assign))
    return ops


def _broadcast(session, assigns, comm=None) -> None:
    from mpi4py import MPI

    comm = comm if comm is not None else MPI.COMM_WORLD
    values = session.run([v for v, _, _ in assigns])
    feeds = {}
    for (_, ph, _), value in zip(assigns, values):
        value = np.array(value, order="C", copy=True)
        if value.dtype == object:
            value = comm.bcast(value, root=0)
        else:
            comm.Bcast(value, root=0)
        feeds[ph] = value
    if comm.rank != 0:
        session.run([op for _, _, op in assigns], feed_dict=feeds)
    comm.Barrier()
