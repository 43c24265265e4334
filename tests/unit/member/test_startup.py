"""The start-up tail and the roles that feed it, in one process (no MPI, no servers)."""

from __future__ import annotations

import numpy as np
import pytest
from tensorflow.core.protobuf import config_pb2

import parallax
from parallax.analysis import analyse_graph
from parallax.errors import LaunchError
from parallax.job.plan import make_job_plan
from parallax.job.settings import derive
from parallax.member.roles import check_local_devices, local_replicas
from parallax.member.servers import session_config
from parallax.member.startup import start_worker
from parallax.resources.files import parse_resource_text
from parallax.runtime.graph_input import load_graph
from tests.models import build_mlp


def test_session_config_adds_what_parallax_needs_to_a_copy_of_the_users():
    user = config_pb2.ConfigProto(intra_op_parallelism_threads=3)
    proto = session_config(user, cpu_devices=4, visible_gpus="1,2", threads=2)
    assert (proto.intra_op_parallelism_threads, proto.inter_op_parallelism_threads) == (3, 2)  # the user's wins
    assert proto.allow_soft_placement and proto.device_count["CPU"] == 4
    assert proto.gpu_options.visible_device_list == "1,2"
    assert user == config_pb2.ConfigProto(intra_op_parallelism_threads=3)
    assert session_config(None) == config_pb2.ConfigProto(allow_soft_placement=True)


def local_job(text, config=None, gpus=0):
    model = build_mlp("gd")
    cluster = parse_resource_text(text, "res")
    settings = derive(config or parallax.Config(run_option="PS"), True, cluster, gpus=gpus)
    return model, cluster, settings, make_job_plan(cluster, settings, analyse_graph(model.graph))


def test_the_tail_turns_a_local_setup_into_a_session_of_in_graph_replicas(tmp_path):
    model, _, settings, job = local_job("localhost: cpu:0,cpu:1",
                                        parallax.Config(run_option="PS", export_graph_path=str(tmp_path)))
    graph, meta = load_graph(model.graph)
    sess, num_workers, worker_id, replicas = start_worker(local_replicas(job, settings), job, settings, graph, meta)
    with sess:
        x = np.ones((2, 4), np.float32)
        sess.run(model.train_op, feed_dict={model.inputs["x"]: [x, x], model.inputs["y"]: [x[:, :1], x[:, :1]]})
        assert (num_workers, worker_id, replicas) == (1, 0, 2)
        assert len(sess.run(model.loss, feed_dict={model.inputs["x"]: [x, x], model.inputs["y"]: [x[:, :1]] * 2})) == 2
        assert sess.raw_session.graph.get_operation_by_name("parallax_replica_1/loss").device.endswith("CPU:1")
    assert "parallax_aggregate" in (tmp_path / "worker-0_metagraph").read_text()


def test_a_gpu_this_machine_lacks_is_refused_naming_the_line():
    _, cluster, settings, job = local_job("localhost: 0,1")
    with pytest.raises(LaunchError, match=r'^res, line 1: lists GPU 0 of localhost, but TensorFlow sees 0 GPU\(s\) '
                                          r'on this machine\. For replicas on the CPU write cpu:<n> ids'):
        check_local_devices(job, settings, cluster.source)


def test_a_launched_process_names_its_gpus_as_it_sees_them_in_its_sessions_and_server():
    """Its CUDA_VISIBLE_DEVICES is the host's GPU 3 (tests/unit/launch/test_command.py), which it sees as GPU 0."""
    from parallax.member.servers import server_config

    _, _, settings, job = local_job("a: 2,3", parallax.Config(run_option="MPI"), gpus=4)
    process = job.process(1)
    assert (process.visible_gpus, process.visible_device_list) == ("3", "0")
    assert server_config(settings, process).gpu_options.visible_device_list == "0"
    assert session_config(None, visible_gpus=process.visible_device_list).gpu_options.visible_device_list == "0"


def test_a_process_that_sees_fewer_gpus_than_it_was_given_is_refused_naming_the_line():
    _, cluster, settings, job = local_job("elsewhere.invalid", parallax.Config(run_option="MPI"), gpus=2)
    with pytest.raises(LaunchError, match=r'^res, line 1: gives worker 1 GPU\(s\) 1 of elsewhere.invalid, but its '
                                          r'process sees 0 of them there\. A bare host line stands for the GPUs of '
                                          r'the machine that starts the job'):
        check_local_devices(job, settings, cluster.source, job.process(1))  # this machine has no GPU
    _, cluster, settings, job = local_job("elsewhere.invalid: cpu:0,cpu:1", parallax.Config(run_option="MPI"))
    check_local_devices(job, settings, cluster.source, job.process(1))  # CPU replicas need no GPU


def test_gpus_of_other_hosts_are_left_to_those_hosts():
    _, cluster, settings, job = local_job("elsewhere.invalid: 0,1\nlocalhost: cpu:0")
    check_local_devices(job, settings, cluster.source)  # no error: elsewhere.invalid checks its own


def test_a_redirected_local_job_tees_its_output_until_its_session_closes(tmp_path):
    _, _, settings, job = local_job("localhost: cpu:0", parallax.Config(run_option="PS", redirect_path=str(tmp_path)))
    setup = local_replicas(job, settings)
    assert len(setup.on_close) == 1 and (tmp_path / "worker_0.stdout").exists()
    setup.on_close[0]()  # what the session's close() does
    setup.on_close[0]()  # a second call does nothing


def test_a_session_created_again_outside_any_graph_is_created_in_its_own():
    """A MonitoredSession creates its session again inside ``run`` after a lost peer, wherever the
    program is; its Scaffold then builds ops (summary_op), which needs the session's graph as default
    (the wrapper does not enter it for each run when there are no hooks)."""
    import tensorflow as tf

    from parallax.member.startup import _InGraph

    graph = tf.Graph()
    with graph.as_default():
        value = tf.compat.v1.Variable(1.0, name="v").read_value()
    scaffold = tf.compat.v1.train.Scaffold()
    with pytest.raises(RuntimeError, match="eager"):  # what TensorFlow does without it
        tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold).create_session()
    creator = _InGraph(tf.compat.v1.train.ChiefSessionCreator(scaffold=tf.compat.v1.train.Scaffold()), graph)
    for _ in range(2):  # created, then created again
        session = creator.create_session()
        assert session.graph is graph and session.run(value) == 1.0
        session.close()


@pytest.mark.parametrize("once", [False, True], ids=["recovers", "once"])
def test_a_lost_peer_ends_a_session_whose_workers_hold_the_variables_and_is_recovered_elsewhere(once):
    """A ``MonitoredSession`` meets an ``UnavailableError`` (a peer gone) in ``run``: TensorFlow creates its
    session again and runs once more, which a parameter server's job survives (its variables live on the
    servers); where the workers hold the variables (``once``) it is refused with ``PeerLost``: a new session
    would start from their first values, and the peers' aborted collectives would fail every op."""
    import tensorflow as tf

    from parallax.errors import PeerLost
    from parallax.member.startup import _InGraph

    created, runs = [], []

    class Flaky:  # a session whose first run meets a lost peer
        def __init__(self, session) -> None:
            self._session, self.graph = session, session.graph

        def run(self, *args, **kwargs):
            runs.append(1)
            if len(runs) == 1:
                raise tf.errors.UnavailableError(None, None, "Collective ops is aborted by: a peer went")
            return self._session.run(*args, **kwargs)

        def close(self) -> None:
            self._session.close()

    class Creator(tf.compat.v1.train.SessionCreator):
        def create_session(self):
            created.append(1)
            chief = tf.compat.v1.train.ChiefSessionCreator(scaffold=tf.compat.v1.train.Scaffold())
            return Flaky(chief.create_session())

    graph = tf.Graph()
    with graph.as_default():
        value = tf.compat.v1.Variable(1.0, name="v").read_value()
        session = tf.compat.v1.train.MonitoredSession(session_creator=_InGraph(Creator(), graph, once=once, worker=1))
    if once:
        with pytest.raises(PeerLost, match="a peer of worker 1 ended or started again"):
            session.run(value)
    else:
        assert session.run(value) == 1.0
    assert (len(created), len(runs)) == ((1, 1) if once else (2, 2))
