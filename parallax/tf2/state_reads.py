"""A traced step's reads of a variable it has just assigned read the value it assigned.

In a ``tf.function``, a read of a variable the step wrote before waits for that write (automatic control
dependencies): a Keras 3 ``SeedGenerator`` drawn from twice in one step (one ``Dropout`` layer called on two
batches, a GAN's discriminator on the real and the generated images) reads its state, assigns the advanced
state, and reads it again for its second draw. On one device that read gives the value just assigned. Written
as such, it gives the value assigned without waiting for the write (an ``Identity`` of it), so that nothing
the replicas compute waits for a write of shared state: the check of the first step computes gradients without
advancing the state (:mod:`parallax.tf2.first_step`), a parameter server's chief holds the write back until
every worker has read the variable for its step (:mod:`parallax.rewrite.ps_sync`), and every worker's second
draw takes the seed one device takes.

Only a plain ``AssignVariableOp`` of the same handle, the latest write of it the read waits for, that the step
runs in any case (one of the function's own side effects, which its training op waits for) and whose value does
not depend on the step's arguments (a random state advanced by a constant: every replica writes the same), is
read so. Left as they are: an ``assign_add``, a write through another op, a write that runs only because a later
read waits for it (in a conditional's branch), and a write of a value computed from the batch (a metric's total
every replica adds to, a momentum its update assigns and then adds to its variable).
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from parallax.graph.graph_ops import computed_from, format_input, is_variable_write, node_map, parse_input

__all__ = ["read_assigned_values"]


def read_assigned_values(graph_def: graph_pb2.GraphDef, effects: set[str], arguments: set[str]) -> list[str]:
    """Rewrite ``graph_def`` in place (see the module docstring) where the write is one of ``effects`` (the ops the
    step runs in any case, by name) and its value is computed from none of ``arguments`` (the step's argument
    placeholders, by name); the names of the reads made ``Identity``."""
    nodes = node_map(graph_def)
    made = []
    for node in graph_def.node:
        if node.op != "ReadVariableOp" or not node.input:
            continue
        handle = parse_input(node.input[0])[0]
        waited = [parse_input(t)[0] for t in node.input[1:] if t.startswith("^")]
        writes = [w for w in waited if w in nodes and is_variable_write(nodes[w].op) and nodes[w].input
                  and parse_input(nodes[w].input[0])[0] == handle]
        if len(writes) != 1 or writes[0] not in effects or nodes[writes[0]].op != "AssignVariableOp" or \
                len(nodes[writes[0]].input) < 2:
            continue
        value, index, _ = parse_input(nodes[writes[0]].input[1])
        if computed_from(nodes, value, arguments.__contains__):
            continue
        dtype = node.attr["dtype"].type
        del node.input[:]
        node.input.extend([format_input(value, index, False)]
                          + [format_input(w, 0, True) for w in waited if w != writes[0]])
        node.op = "Identity"
        for key in list(node.attr):
            del node.attr[key]
        node.attr["T"].type = dtype
        made.append(node.name)
    return made

