"""Keras 3's count of the step that finds an epoch's data exhausted, in ``parallax.fit``.

Where the data's length is unknown (a generator, a ``tf.data`` pipeline after ``filter()``), Keras 3's
``model.fit`` draws batches until the data runs out. Its last call of the traced step fails at reading the batch, but
the step's ops that do not wait for the batch have run by then: an optimizer's ``iterations.assign_add(1)`` among them
where nothing before it in the step reads the batch (Adam, SGD, RMSprop, ..., each of a GAN's own optimizers: 15 after
3 epochs of 4 batches, 5 in the first epoch's ``on_epoch_end``), not where it waits for the gradients (a
``LossScaleOptimizer``'s count, in the branch of its check that the gradients are finite; gradient accumulation's,
after the branch that applies them: 12 and 6 there). An optimizer that reads the count (Adam's bias correction, a
learning-rate schedule) sees the extra one from the second epoch on.

``parallax.fit`` counts it as ``model.fit`` does: :func:`exhausted_step` reads, in the traced step, which
optimizers' counts are raised without the batch; their counts are raised on the host at such an epoch's end (after the
job's variables are written back into the model: what the callbacks and a checkpoint see), and the job's own copies at
the next step, which :func:`counting` makes take the steps it is behind as an argument. The step's other writes that
do not wait for the batch (a random layer's seed state: dropout's next draws differ) it does not make, and says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from parallax.logs import log

__all__ = ["ExhaustedStep", "exhausted_step", "warn_uncounted", "counting"]


#: The ops that write a variable, its handle their first input (Keras 3's ``assign_add`` is an ``AssignVariableOp``
#: of the read value plus one).
_WRITES = ("AssignVariableOp", "AssignAddVariableOp")


def _optimizers(model: Any) -> list:
    """The model's compiled optimizer, those its attributes hold (a GAN's two) and their inner ones (a loss scale's)."""
    found: list = []
    todo = [getattr(model, "optimizer", None), *vars(model).values()]
    while todo:
        candidate = todo.pop(0)
        if hasattr(candidate, "apply_gradients") and getattr(candidate, "_iterations", None) is not None \
                and all(candidate is not seen for seen in found):
            found.append(candidate)
            todo.append(getattr(candidate, "inner_optimizer", None))
    return found


def _waiting(graph: Any, arguments: set) -> set:
    """The ops of ``graph`` that run only after one of ``arguments`` (by data or control edges): one pass in the order
    the ops were made, which puts every op after its inputs."""
    waiting = set(arguments)
    for op in graph.get_operations():
        if any(t.op in waiting for t in op.inputs) or any(c in waiting for c in op.control_inputs):
            waiting.add(op)
    return waiting


@dataclasses.dataclass(frozen=True)
class ExhaustedStep:
    """What Keras 3's ``model.fit`` does at the step that finds an epoch's data exhausted, read from the traced step.

    Attributes:
        counted: the optimizer counts (``iterations``) it raises, which ``parallax.fit`` raises too.
        others: the names of the other variables it writes there (a random layer's seed state, which dropout's next
            draws read; a count of an optimizer ``parallax.fit`` cannot find), which ``parallax.fit`` does not write
            (:func:`warn_uncounted`).
    """

    counted: tuple = ()
    others: tuple[str, ...] = ()


def exhausted_step(model: Any, step: Any, counts_exhausted: bool) -> ExhaustedStep:
    """What Keras 3's ``model.fit`` writes at the step that finds an epoch's data exhausted (``counts_exhausted``: the
    data's length is unknown, in Keras 3): the writes of ``step`` (a ``tf.function`` with an input signature) that wait
    for none of its arguments. Nothing where the data's length is known."""
    if not counts_exhausted:
        return ExhaustedStep()
    graph = step.get_concrete_function().graph
    captured = {id(inside): outside for outside, inside in graph.captures}
    waiting = _waiting(graph, {t.op for t in graph.inputs if id(t) not in captured})
    written = {id(captured[id(op.inputs[0])]) for op in graph.get_operations()
               if op.type in _WRITES and id(op.inputs[0]) in captured and op not in waiting}
    counts = {id(o._iterations.handle): o._iterations for o in _optimizers(model)}
    names = {id(v.handle): v.name.split(":")[0] for v in graph.variables}
    names.update((id(v.handle), v.path) for v in getattr(model, "variables", []) if hasattr(v, "path"))
    return ExhaustedStep(counted=tuple(count for h, count in counts.items() if h in written),
                         others=tuple(sorted(names.get(h, "a variable of the step") for h in written - counts.keys())))


def warn_uncounted(exhausted: ExhaustedStep) -> None:
    """Say at WARNING what Keras 3 writes at the step that finds an epoch's data exhausted that ``parallax.fit``
    does not (``exhausted.others``)."""
    if exhausted.others:
        log.warning("parallax.fit: the data's length is unknown (a generator, or a tf.data pipeline of unknown "
                    "cardinality, e.g. after filter()): Keras 3's model.fit then runs, at each epoch's end, the "
                    "writes of the step that do not wait for the batch (its last step fails at reading one, after "
                    "they ran). parallax.fit does so for the optimizers' counts it finds in the model, not for %s "
                    "(a random layer's seed state, which dropout's next draws read; an optimizer's count the model "
                    "does not hold), so training differs from model.fit's from the second epoch on. Give "
                    "steps_per_epoch, or the dataset's length "
                    "(dataset.apply(tf.data.experimental.assert_cardinality(n))), for the same training in both",
                    ", ".join(exhausted.others))


def counting(step: Any, counts: list) -> Any:
    """``step`` (a ``tf.function`` with an input signature) taking one argument more, last: the optimizer steps
    ``model.fit`` counted that the job has not (0; 1 at the first step after an epoch that ran out of data), added
    to each of ``counts`` before ``step`` trains (its reads of a count come after: one resource, in program
    order). A shared variable's write: one replica's counts, as the optimizer's own increment."""

    def counted(*args):
        for count in counts:
            count.assign_add(tf.cast(args[-1], count.dtype))
        return step.python_function(*args[:-1])

    return tf.function(counted, input_signature=[*step.input_signature, tf.TensorSpec([], tf.int64)])
