import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.plan import TaskSpec, build_plan
from parallax.resources.files import Device


def export(graph):
    with graph.as_default():
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def plan_for(model, num_replicas, average_sparse=False):
    devices = tuple(Device("cpu", i).tf_name for i in range(num_replicas))
    plan = build_plan(analyse_graph(model.graph), [("localhost", devices, "/device:CPU:0")], run_option="HYBRID",
                      sync=True, average_sparse=average_sparse)
    return plan, TaskSpec(0)


def nodes_of(meta):
    return {n.name: n for n in meta.graph_def.node}
