"""Find what Parallax must know about a single-device training graph.

No fork of TensorFlow and no hook into the optimizer is needed: a
``tf.compat.v1.train`` optimizer creates each variable's update ops under
``<optimizer>/update_<variable>/``, and the gradient tensors (or the values and
indices of a sparse one) enter that scope from outside. So for every variable:

1. collect the ops of its update scope;
2. take the tensors that flow into the scope from outside it, dropping
   constants, variables, reads of variables (``<slot>/read`` of ref
   variables) and hyper-parameters (tensors that do not come from the
   gradient computation, e.g. a learning-rate placeholder);
3. what remains is the gradient: one floating tensor (dense), or a floating
   ``values`` tensor plus an integer ``indices`` tensor (sparse, from an
   ``IndexedSlices``).

When ops stand between ``tf.gradients`` and the update (``clip_by_global_norm``,
a scaling), each gradient is also traced back to the raw ``tf.gradients``
output it comes from (:func:`~parallax.analysis.gradients._find_raw_gradients`), so that Parallax can
aggregate the replicas' raw gradients and run those ops once on the result,
exactly as on one device.

The training ops are the ``train_op`` collection when the graph has one, and
otherwise the sinks of the update ops (the op ``apply_gradients`` returns).
A graph without any (inference, evaluation) is analysed as forward only: no
gradients, no training ops; its replicas then run side by side.

The package, one job a module: :mod:`~parallax.analysis.model` (what is found),
:mod:`~parallax.analysis.ops` (the kinds of ops told apart),
:mod:`~parallax.analysis.walks` (where a tensor comes from),
:mod:`~parallax.analysis.scopes` (the update scopes, slots and training ops),
:mod:`~parallax.analysis.gradients` (each variable's gradient),
:mod:`~parallax.analysis.refusals` (the graphs refused, and why),
:mod:`~parallax.analysis.forward` (the forward pass, for pipeline stages) and
:mod:`~parallax.analysis.analyse` (:func:`analyse_graph`, which puts them together).
"""

from parallax.analysis.analyse import analyse_graph
from parallax.analysis.model import ForwardOp, GradientInfo, GraphAnalysis, VariableInfo
from parallax.analysis.model import is_summed as is_summed
from parallax.analysis.ops import VARIABLE_OP_TYPES
from parallax.analysis.scopes import update_scope_owner

__all__ = ["VariableInfo", "GradientInfo", "ForwardOp", "GraphAnalysis", "analyse_graph", "VARIABLE_OP_TYPES",
           "update_scope_owner"]
