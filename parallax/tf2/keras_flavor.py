"""What differs between a Keras 3 model and a ``tf_keras`` one, for ``parallax.fit``, ``evaluate`` and ``predict``.

The loops of :mod:`parallax.keras_fit` and :mod:`parallax.tf2.evaluate` are one; a :class:`Flavor` is the
little that each Keras does its own way: its callbacks module, whether a model is compiled, how its
``train_step`` computes the loss and applies the update, its evaluation and prediction of one batch, and the order
of its metrics. Everything else (``compute_metrics``, ``reset_metrics``, ``get_metrics_result``, ``metrics``,
``CallbackList``) both spell alike.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import tensorflow as tf

from parallax.graph.graph_ops import added_to_itself, parse_input
from parallax.tf2.host_edits import metric_state

__all__ = ["Flavor", "flavor_of"]


class Flavor:
    """Keras 3 (``keras``): the step is ``Model.train_step``'s, ``compute_loss(..., training=True)`` then the
    optimizer's ``apply_gradients``."""

    name = "Keras 3"

    def __init__(self, module: Any) -> None:
        self.module = module
        self._made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    #: what a model's ``compile`` makes anew: a function traced before it updates the metrics of the compile before
    COMPILED = ("optimizer", "_compile_loss", "_compile_metrics", "_loss_tracker")

    @property
    def callbacks(self) -> Any:
        return self.module.callbacks

    def made_for(self, model: Any, kind: str, make: Any) -> Any:
        """``make()``, once for ``model`` as it is compiled now. A function traced for it before a later compile
        would update the metrics of the compile before, which the model no longer reads (``parallax.evaluate``
        and ``fit``'s validation after a fine-tuning's second ``compile`` gave 0 until 2026-12-07)."""
        state = tuple(getattr(model, name, None) for name in self.COMPILED)
        held = self._made.get(model)
        if held is None or any(a is not b for a, b in zip(held[0], state)):
            held = self._made[model] = (state, {})
        if kind not in held[1]:
            held[1][kind] = make()
        return held[1][kind]

    def compiled(self, model: Any) -> bool:
        return getattr(model, "optimizer", None) is not None and bool(getattr(model, "compiled", False))

    def takes_targets(self, model: Any) -> bool:
        """Whether the model was compiled with a loss, which takes targets (without, its loss is what its layers
        add, ``add_loss``, and ``fit`` may be given inputs alone)."""
        return getattr(model, "_compile_loss", None) is not None

    def loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any) -> Any:
        """The model's loss as its ``train_step`` computes it: through Keras's own call of ``compute_loss``, which
        passes ``training`` only to an override that takes it (one written before Keras 3.3 does not)."""
        compute = getattr(model, "_compute_loss", None)
        if compute is None:
            return model.compute_loss(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)
        return compute(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)

    @tf.autograph.experimental.do_not_convert  # Python that runs while the step is traced, on the graph made
    def part_loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any, counts: Any) -> Any:
        """:meth:`loss` on one replica's part, whose examples ``counts`` for that many times its share of the batch.
        A model of several outputs keeps a loss metric per output in its compiled loss, which ``model.fit``'s step
        updates with the batch's loss of that output, counted once a step (the batch's size, unknown when the
        step is traced, is no weight there): each replica's part adds ``counts - 1`` times what the compiled loss
        added to a metric's total, so that the replicas' parts add up to one of the batch's loss per replica (an
        add, which the replicas of one process make to one variable without losing either's)."""
        trackers = self._output_losses(model)
        if not trackers or tf.executing_eagerly():
            return self.loss(model, x, y, prediction, sample_weight)
        loss, recount = _traced_loss(lambda: self.loss(model, x, y, prediction, sample_weight))
        for tracker in trackers:
            if not recount(tracker.total, tracker.total.value.handle, counts):
                raise ValueError(f"parallax.fit: the compiled loss's metric {tracker.name!r} is updated in a way this "
                                 f"version of Parallax does not know (Keras {self.module.__version__}); train with "
                                 "a tf.function step and parallel_run")
        return loss

    def _output_losses(self, model: Any) -> list:
        """The loss metric of each output that a compiled loss of several outputs keeps (its ``Mean`` trackers)."""
        return [t for t in getattr(getattr(model, "_compile_loss", None), "metrics", None) or []
                if isinstance(getattr(t, "total", None), self.module.Variable)]

    def scaled(self, model: Any, loss: Any) -> Any:
        """The loss the gradients are taken of: Keras 3's ``train_step`` scales it by the optimizer's loss
        scale (a ``LossScaleOptimizer``, or ``loss_scale_factor``), inside the tape."""
        return model.optimizer.scale_loss(loss)

    def apply(self, model: Any, tape: tf.GradientTape, loss: Any) -> None:
        variables = model.trainable_weights
        model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    def ready(self, model: Any) -> None:
        """Make what the optimizer makes at its first update and the program may set between steps before the step
        is traced, as variables of its own (Keras 3's optimizer holds its learning rate in a variable from the
        start: nothing to make)."""

    def added_per_example(self, model: Any, traced: bool = True) -> list:
        """What the model's layers added with ``add_loss`` as one value per example (a tensor whose first axis is the
        batch's: unknown in the step's trace (``traced``), the batch's rows after an eager call), which Keras 3's
        ``compute_loss`` sums (``_aggregate_additional_loss``): a sum over the batch, as keras-io's CTC layer adds.
        None where the model computes its loss its own way (its ``compute_loss`` or the aggregation overridden)."""
        own = any(getattr(type(model), m, None) is not getattr(self.module.Model, m, None)
                  for m in ("compute_loss", "_aggregate_additional_loss"))
        if own:
            return []
        return [loss for loss in model.losses if loss.shape.rank and (loss.shape[0] is None) == traced]

    def adds_per_example(self, model: Any, x: Any) -> bool:
        """Whether ``model`` called on inputs ``x`` (a batch) adds a loss of one value per example
        (:meth:`added_per_example`): its first rows, called eagerly without training (a model that cannot be called
        on them, one of a fixed batch size, is taken to add none)."""
        rows = min(len(tf.nest.flatten(x)[0]), 2)
        if not rows:
            return False
        try:
            model(tf.nest.map_structure(lambda a: a[:rows], x), training=False)
        except Exception:  # noqa: BLE001 - any model's own error: it is evaluated by parts, as before
            return False
        return any(loss.shape[0] == rows for loss in self.added_per_example(model, traced=False))

    def metric_values(self, model: Any) -> list:
        """The state of the model's metrics, read in the step after their update."""
        return [tf.identity(v.value) for v in model.metrics_variables]

    def update_metrics(self, model: Any, x: Any, y: Any, prediction: Any, weight: Any, loss: Any,
                       share: Any) -> None:
        """Update the model's metrics inside the step, with one replica's part, as its ``train_step`` does: the
        loss tracker with the part's loss counted for ``share`` examples (the batch's over the replicas: a
        padded batch's parts' losses are scaled so that their mean is the batch's), the compiled metrics with
        ``weight`` (the user's weights, or ones; 0 for padding)."""
        tracker = next(m for m in model.metrics if m.name == "loss")
        tracker.update_state(loss, sample_weight=share)
        model.compute_metrics(x, y, prediction, sample_weight=weight)

    def test_batch(self, model: Any, x: Any, y: Any, sample_weight: Any, counts: float = 1.0) -> None:
        """The model's own ``test_step`` on one batch (the metrics updated, not reset), compiled as Keras
        compiles it (``jit_compile`` as the model says), once per model; the batch a worker's part of a global
        batch, of which its examples are ``counts``. ``model.evaluate`` adds each global batch's loss of each
        output to that output's loss metric once (:meth:`part_loss`): a part adds that share of its own."""
        import keras

        step = self.made_for(model, "test", lambda: tf.function(model.test_step, reduce_retracing=True,
                                                                 jit_compile=bool(model.jit_compile)))
        data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)  # as Keras's iterator: (x, y) without weights
        _counted(self._output_losses(model), counts, lambda: step(data))

    def predict_batch(self, model: Any, x: Any) -> Any:
        """The model's predictions of the one batch ``x``."""
        return model.predict_on_batch(x)

    def in_order(self, model: Any, logs: dict) -> Any:
        """``logs`` as ``model.evaluate(..., return_dict=False)`` returns them."""
        return model._flatten_metrics_in_order(logs)


class TfKerasFlavor(Flavor):
    """``tf_keras``: the step is its ``Model.train_step``'s, ``compute_loss`` then ``optimizer.minimize`` (legacy
    and new optimizers alike)."""

    name = "tf_keras"
    COMPILED = ("optimizer", "compiled_loss", "compiled_metrics")

    def compiled(self, model: Any) -> bool:
        return getattr(model, "optimizer", None) is not None and bool(getattr(model, "_is_compiled", False))

    def takes_targets(self, model: Any) -> bool:
        return getattr(getattr(model, "compiled_loss", None), "_user_losses", None) is not None

    def loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any) -> Any:
        return model.compute_loss(x, y, prediction, sample_weight)

    @tf.autograph.experimental.do_not_convert  # Python that runs while the step is traced, on the graph made
    def part_loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any, counts: Any) -> Any:
        """:meth:`loss` on one replica's part, whose examples ``counts`` for that many times its share of the batch.
        tf_keras's compiled loss updates its loss metrics itself, as its ``train_step`` does: each by the loss
        times the part's examples (the batch's on one device), which the replicas' parts add up to. A part of
        padding only (one row, weighed 0) adds nothing. Without targets (a loss its layers add) the loss metric
        counts each batch once, by weight 1: each part then counts ``counts`` times, its examples over its share."""
        if tf.executing_eagerly():
            return self.loss(model, x, y, prediction, sample_weight)
        loss, recount = _traced_loss(lambda: self.loss(model, x, y, prediction, sample_weight))
        times = counts if y is None else tf.cast(counts > 0.0, counts.dtype)
        for tracker in self._loss_trackers(model):
            for state in (tracker.total, tracker.count):  # (one the loss did not update: an output without a loss)
                recount(state, state.handle, times)
        return loss

    @staticmethod
    def _loss_trackers(model: Any) -> list:
        """The compiled loss's metrics: the total's and one per output."""
        return list(getattr(model.compiled_loss, "metrics", None) or [])

    def metric_values(self, model: Any) -> list:
        return [tf.identity(v) for v in metric_state(model)]

    def update_metrics(self, model: Any, x: Any, y: Any, prediction: Any, weight: Any, loss: Any,
                       share: Any) -> None:
        """Update the compiled metrics inside the step, with one replica's part, as its ``train_step`` does (the
        loss metrics were updated with the loss, :meth:`part_loss`)."""
        model.compute_metrics(x, y, prediction, weight)

    def scaled(self, model: Any, loss: Any) -> Any:
        """tf_keras' ``minimize`` scales the loss itself (its ``LossScaleOptimizer``)."""
        return loss

    def apply(self, model: Any, tape: tf.GradientTape, loss: Any) -> None:
        model.optimizer.minimize(loss, model.trainable_variables, tape=tape)

    def ready(self, model: Any) -> None:
        optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        if hasattr(optimizer, "_create_hypers"):  # a legacy optimizer: its hyper-parameters become variables when
            optimizer._create_hypers()  # made, which callbacks then set (the learning rate)

    def added_per_example(self, model: Any, traced: bool = True) -> list:
        """tf_keras adds a loss of one value per example to the compiled loss as it is (no sum Parallax weighs)."""
        return []

    def adds_per_example(self, model: Any, x: Any) -> bool:
        return False

    def test_batch(self, model: Any, x: Any, y: Any, sample_weight: Any, counts: float = 1.0) -> None:
        """``test_on_batch``: its loss metrics weigh each batch by its examples, but for a model without a compiled
        loss (its layers' losses alone), whose loss metric counts each batch once (:meth:`Flavor.test_batch`)."""
        _counted(self._counted_once(model, y), counts, lambda: self._one_step(
            model, "test", lambda: model.test_on_batch(x, y, sample_weight=sample_weight, reset_metrics=False)))

    def predict_batch(self, model: Any, x: Any) -> Any:
        return self._one_step(model, "predict", lambda: model.predict_on_batch(x))

    def _one_step(self, model: Any, kind: str, run: Any) -> Any:
        """``run()`` with a ``{kind}_function`` of one step of the model's (:meth:`made_for`), the model's own back
        after. tf_keras's ``test_on_batch`` and ``predict_on_batch`` use the model's, which is of as many steps as
        ``steps_per_execution`` says when it is made: above 1, it reads that many batches of the one it is given (an
        ``OutOfRangeError``, on one device too), and one made while a data handler holds that count at 1 for an
        epoch's short last execution (a validation within ``parallax.fit``) stays of one step, for the model's own
        ``evaluate`` after."""
        attribute = f"{kind}_function"
        theirs = getattr(model, attribute)

        def make() -> Any:
            held = getattr(model, "_steps_per_execution", None)  # (None: a model not compiled, to predict with)
            size = None if held is None else int(held.numpy())
            if held is not None:
                held.assign(1)
            try:
                return getattr(model, f"make_{kind}_function")(force=True)
            finally:
                if held is not None:
                    held.assign(size)

        ours = self.made_for(model, kind, make)
        setattr(model, attribute, ours)
        try:
            return run()
        finally:
            setattr(model, attribute, theirs)

    @staticmethod
    def _counted_once(model: Any, y: Any) -> list:
        """The loss metric that counts each batch once, whatever its examples: the total's, without targets."""
        return [model.compiled_loss._total_loss_mean] if y is None else []

    def in_order(self, model: Any, logs: dict) -> Any:
        names = model.metrics_names
        results = [logs[n] for n in names if n in logs] + [logs[k] for k in sorted(logs) if k not in names]
        return results[0] if len(results) == 1 else results


def _counted(trackers: list, counts: float, run: Any) -> None:
    """``run()``, after which each of the ``Mean`` ``trackers`` that it updated once (by weight 1, or by the examples
    where Keras knew their number) holds that value counted ``counts`` times instead (a worker's part of a batch)."""
    before = [(t.total.numpy(), t.count.numpy()) for t in trackers]
    run()
    for tracker, (total, count) in zip(trackers, before):
        times = tracker.count.numpy() - count
        if times:
            tracker.total.assign(total + (tracker.total.numpy() - total) / times * counts)
            tracker.count.assign(count + counts)


def _traced_loss(compute: Any) -> tuple[Any, Any]:
    """``compute()`` (a loss that updates metrics, traced in the current graph), and ``recount(state, handle,
    times)``: what the ops ``compute`` made added to the metric variable ``state`` (its resource ``handle``) made to
    count ``times`` times, by adding ``times - 1`` times more; ``False`` where they added nothing to it."""
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    loss = compute()
    made = graph.get_operations()[first:]

    def recount(state: Any, handle: Any, times: Any) -> bool:
        added = _added_to(made, graph.capture(handle).name)
        if added is None:
            return False
        state.assign_add(added * tf.cast(times - 1.0, added.dtype))
        return True

    return loss, recount


def _added_to(made: list, handle: str) -> tf.Tensor | None:
    """What the ops ``made`` add to the variable of ``handle``: an ``assign_add``'s value, or ``x`` of an
    ``assign(v, read(v) + x)`` (how a Keras 3 metric adds to its state, :func:`~parallax.graph.graph_ops.
    added_to_itself`); ``None`` where they add nothing so."""
    nodes = None
    for op in made:
        if not op.inputs or op.inputs[0].name != handle:
            continue
        if op.type == "AssignAddVariableOp":
            return op.inputs[1]
        nodes = nodes or {o.name: o.node_def for o in op.graph.get_operations()}
        added = added_to_itself(op.node_def, nodes)
        if added is not None:
            name, index, _ = parse_input(added)
            return op.graph.get_tensor_by_name(f"{name}:{index}")
    return None


_FLAVORS: dict[str, Flavor] = {}


def flavor_of(model: Any, caller: str, compiled: bool = True) -> Flavor:
    """The :class:`Flavor` of ``model``, which must be ``compiled`` (unless told otherwise).

    Raises:
        TypeError: ``model`` is neither a Keras 3 nor a ``tf_keras`` model.
        ValueError: it is not compiled.
    """
    import keras

    flavor = None
    if isinstance(model, keras.Model):
        flavor = _FLAVORS.setdefault("keras", Flavor(keras))
    elif "tf_keras" in sys.modules and isinstance(model, sys.modules["tf_keras"].Model):
        flavor = _FLAVORS.setdefault("tf_keras", TfKerasFlavor(sys.modules["tf_keras"]))
    if flavor is None:
        raise TypeError(f"{caller}: model must be a Keras 3 model (keras.Model) or a tf_keras one (tf_keras.Model), "
                        f"got {type(model).__name__}; for a custom loop, pass a tf.function step to parallel_run")
    if compiled and not flavor.compiled(model):
        raise ValueError(f"{caller}: the model is not compiled; call model.compile(optimizer=..., loss=..., "
                         f"metrics=...) first, as for model.{caller.rsplit('.', 1)[-1]}")
    return flavor
