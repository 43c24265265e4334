"""A member process's TensorFlow server: its session config, and its start in the job's cluster.

:func:`start_server` starts the server of a process mpirun started (the ranks exchange their addresses over
MPI); :func:`make_server` the server at an address a cluster manager gave (:mod:`parallax.member.joined`).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from parallax.errors import LaunchError
from parallax.resources.cluster import usable_cores

if TYPE_CHECKING:
    from parallax.job.plan import ProcessSpec
    from parallax.job.settings import Settings

__all__ = ["start_server", "make_server", "server_config", "session_config", "GROUP_LEADER"]

GROUP_LEADER = "/job:worker/replica:0/task:0"


def session_config(user: config_pb2.ConfigProto | None, cpu_devices: int = 0, visible_gpus: str | None = None,
                   threads: int = 0, waiting_threads: int = 0) -> config_pb2.ConfigProto:
    """A copy of the user's ``sess_config`` with what Parallax needs added.

    ``visible_gpus``: ``gpu_options.visible_device_list``, the process's GPUs as it sees them
    (:attr:`parallax.job.plan.ProcessSpec.visible_device_list`: ``"0"`` in a rank whose
    ``CUDA_VISIBLE_DEVICES`` is the host's GPU 3). ``threads``: when several processes share a
    host, each gets its share of the cores for TensorFlow's thread pools (unless the user set them).
    ``waiting_threads``: threads an op holds while it waits, not computes (an all-reduce overlapping
    the backward pass, :attr:`parallax.plan.model.CommSpec.overlap`, which would otherwise stop the
    pass while it waits for the other workers): the inter-op pool gets that many more than it would
    have (``threads``, else ``TF_NUM_INTEROP_THREADS``, else a thread per core this process may run
    on), unless the user set it.
    """
    proto = config_pb2.ConfigProto()
    if user is not None:
        proto.CopyFrom(user)
    if threads > 0 and not proto.intra_op_parallelism_threads:
        proto.intra_op_parallelism_threads = threads
    if not proto.inter_op_parallelism_threads and (threads > 0 or waiting_threads > 0):
        usual = threads or _positive_int(os.environ.get("TF_NUM_INTEROP_THREADS")) or usable_cores()
        proto.inter_op_parallelism_threads = usual + waiting_threads
    proto.allow_soft_placement = True
    if cpu_devices > proto.device_count.get("CPU", 1):
        proto.device_count["CPU"] = cpu_devices
    if visible_gpus is not None:
        proto.gpu_options.visible_device_list = visible_gpus
    return proto


def _positive_int(text: str | None) -> int:
    """``text`` as an int when it is a positive one, else 0."""
    return int(text) if text and text.strip().isdigit() else 0


def server_config(settings: Settings, process: ProcessSpec, group_leader: str | None = None
                  ) -> config_pb2.ConfigProto:
    """The config of a process's TensorFlow server (its devices, GPUs and collective group leader)."""
    config = session_config(settings.sess_config, process.cpu_devices, process.visible_device_list)
    if group_leader is not None:
        config.experimental.collective_group_leader = group_leader
    return config


def make_server(spec: dict[str, list[str]], job: str, index: int, config: config_pb2.ConfigProto,
                protocol: str) -> tf.distribute.Server:
    """Start the server of task ``index`` of ``job`` in the cluster ``spec``.

    Raises:
        LaunchError: the protocol is not in this TensorFlow build.
        tf.errors.UnknownError, tf.errors.InternalError, RuntimeError: the port could not be bound.
    """
    try:
        return tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index,
                                    config=config, protocol=protocol, start=True)
    except tf.errors.NotFoundError as e:  # no server for this protocol in this TensorFlow build
        available = str(e).rsplit("available server factories are:", 1)[-1].strip()
        raise LaunchError(f"PSConfig.protocol={protocol!r} is not supported by this TensorFlow build "
                          f"(its servers: {available}); use protocol='grpc'") from e


def start_server(rank: int, jobs: list[tuple[str, int]], settings: Settings, process: ProcessSpec, *,
                 group_leader: str | None = None) -> tf.distribute.Server:
    """Start this rank's TensorFlow server in the job's cluster (a process mpirun started).

    Every rank picks a free port (or takes the one the resource file gives),
    the ranks exchange ``host:port`` over MPI, and each starts its server. A
    port taken between picking and binding makes every rank try again, at most
    ``settings.timeouts.server_start_attempts`` times.

    Args:
        rank: this process's MPI rank.
        jobs: ``(job name, task index)`` of every rank, in rank order.
        settings: the run's settings (``sess_config``, the servers' protocol).
        process: this process's part of the job plan (its port, devices and GPUs).
        group_leader: the collective group leader, for backends that need one.

    Raises:
        LaunchError: no server could be started.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    host = socket.gethostname()
    last_error = None
    fixed = port = process.port
    for _ in range(settings.timeouts.server_start_attempts):
        if fixed is None:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        addresses = comm.allgather(f"{host}:{port}")
        spec: dict[str, list[str]] = {}
        for (job, _index), address in zip(jobs, addresses):
            spec.setdefault(job, []).append(address)
        job, index = jobs[rank]
        try:
            server = make_server(spec, job, index, server_config(settings, process, group_leader),
                                 settings.ps.protocol)
            ok = True
        except (tf.errors.UnknownError, tf.errors.InternalError, RuntimeError) as e:  # port taken
            server, ok, last_error = None, False, e
        if all(comm.allgather(ok)):
            return server
        if any(p is not None for p in comm.allgather(fixed)):
            break  # a port fixed by the resource file is taken: trying again will not help
        time.sleep(0.2)
    raise LaunchError(f"could not start the TensorFlow servers (rank {rank} on {host}: "
                      f"{last_error or 'another rank failed'}); is a port of the resource file in use?")
