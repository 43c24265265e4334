"""Every op name the rewriter invents, derived only from the plan and original names.

Every task computes the same names from the same plan, so collectives and
parameter-server ops match across processes.
"""

from __future__ import annotations

__all__ = ["REPLICA_PREFIX", "replica_op_name", "copy_replica", "replica_tensor_name", "aggregate_scope",
           "replica_frame_name", "replica_function_name", "aggregate_outputs", "SYNC_PREFIX", "LOCAL_COPY_PREFIX",
           "sync_scope", "unsynchronised_train_op", "aggregate_step_scope", "variable_sync_scope", "local_copy_scope",
           "is_parallax_op", "packed_reads_scope", "MICRO_PREFIX", "PIPELINE_PREFIX", "micro_op_name",
           "WRITES_SCOPE", "writes_barrier_op", "INITIAL_VALUE_PREFIX", "HOST_WRITES_PREFIX", "replica_seed_ops",
           "EXACT_DRAWS", "REPLICA_INDEX", "REPLICA_COUNT", "PART_MARKS"]

REPLICA_PREFIX = "parallax_replica_"
AGGREGATE_PREFIX = "parallax_aggregate"
SYNC_PREFIX = "parallax_sync"
LOCAL_COPY_PREFIX = "parallax_local"
READS_PREFIX = "parallax_reads"
ZERO_PREFIX = "parallax_zero"
#: The fused optimizer updates (parallax/rewrite/fused_updates.py).
FUSED_PREFIX = "parallax_fused"
MICRO_PREFIX = "parallax_micro_"
PIPELINE_PREFIX = "parallax_pipeline"
#: A traced step's initial values read from the program's eager variables (:mod:`parallax.tf2.trace`): they run
#: in a worker's process, whose Python holds those variables, wherever the variable they initialise lives.
INITIAL_VALUE_PREFIX = "parallax_initial"
#: A traced step's writes of the program's values into the job's variables between steps (a callback's
#: ``beta.assign(...)``, a loop's new learning rate; :mod:`parallax.tf2.trace`): each a placeholder of the
#: variable's shape assigned to it, run alone (under PS, after the chief's, by the writes barrier).
HOST_WRITES_PREFIX = "parallax_host"

#: The collection of the stateless draws (and the ops that key them) whose seeds every replica keeps as one device
#: has them: each takes its part's rows of the union batch's draw (:mod:`parallax.tf2.draws`).
EXACT_DRAWS = "parallax_exact_draws"
#: The names of a traced step's marks of where its part lies in the union batch (int32 scalars): the union's
#: examples, the part's first row in it, the part's rows (:mod:`parallax.tf2.draws`).
PART_MARKS = ("parallax_part/examples", "parallax_part/start", "parallax_part/rows")
#: The collections of the constants a replica's copy sets to its own global index and to the job's replicas (a
#: custom loop's marks of where its part lies in the union batch: :func:`parallax.tf2.draws.mark_replica_parts`).
REPLICA_INDEX, REPLICA_COUNT = "parallax_replica_index", "parallax_replica_count"


def micro_op_name(name: str, micro_batch: int) -> str:
    """The copy of op ``name`` for micro-batch ``micro_batch`` (every micro-batch's copy is renamed:
    the original name then combines them, see :mod:`parallax.rewrite.micro_batches`).

    >>> micro_op_name("dense/MatMul", 1), micro_op_name("while/Enter", 0)
    ('parallax_micro_1/dense/MatMul', 'parallax_micro_0/while/Enter')
    """
    return f"{MICRO_PREFIX}{micro_batch}/{name}"


def replica_op_name(name: str, replica: int) -> str:
    """The name of op ``name``'s copy on local replica ``replica``.

    Replica 0 keeps the original name, so the single-device names keep working
    for it (and for a single replica nothing is renamed at all).

    >>> replica_op_name("dense/MatMul", 0), replica_op_name("dense/MatMul", 2)
    ('dense/MatMul', 'parallax_replica_2/dense/MatMul')
    """
    return name if replica == 0 else f"{REPLICA_PREFIX}{replica}/{name}"


def copy_replica(name: str) -> int:
    """The local replica an op of the rewritten graph was copied for (0 for original names);
    the inverse of :func:`replica_op_name`.

    >>> copy_replica("parallax_replica_2/dense/MatMul"), copy_replica("dense/MatMul")
    (2, 0)
    """
    if name.startswith(REPLICA_PREFIX):
        return int(name[len(REPLICA_PREFIX):].split("/", 1)[0])
    return 0


def replica_tensor_name(tensor: str, replica: int) -> str:
    """``replica_op_name`` for a tensor name ``op:index``."""
    op, _, index = tensor.rpartition(":")
    if not op or not index.isdigit():
        op, index = tensor, "0"
    return f"{replica_op_name(op, replica)}:{index}"


def replica_function_name(function: str, replica: int) -> str:
    """The name of a library function's copy for local replica ``replica`` (a one-shot
    iterator's dataset function, sharded per replica).

    >>> replica_function_name("_make_dataset_abc", 1)
    '_make_dataset_abc_parallax_replica_1'
    """
    return f"{function}_{REPLICA_PREFIX}{replica}"


def replica_frame_name(frame: str, replica: int) -> str:
    """The while-loop frame name of a replica's copy of a v1 loop."""
    return frame if replica == 0 else f"{REPLICA_PREFIX}{replica}/{frame}"


def aggregate_scope(variable: str) -> str:
    """The name scope of the ops that aggregate ``variable``'s gradient.

    >>> aggregate_scope("dense/kernel")
    'parallax_aggregate/dense/kernel/'
    """
    return f"{AGGREGATE_PREFIX}/{variable}/"


def aggregate_outputs(variable: str, sparse: bool, replica: int | None = None) -> tuple[str, ...]:
    """The tensors the aggregation pass leaves for ``variable``: its gradient, or values and
    indices; with ``replica``, that one replica's (scaled) gradient.

    >>> aggregate_outputs("emb", True)
    ('parallax_aggregate/emb/values:0', 'parallax_aggregate/emb/indices:0')
    >>> aggregate_outputs("w", False, replica=1)
    ('parallax_aggregate/w/grad_1:0',)
    """
    scope = aggregate_scope(variable)
    suffix = "" if replica is None else f"_{replica}"
    if sparse:
        return (f"{scope}values{suffix}:0", f"{scope}indices{suffix}:0")
    return (f"{scope}grad{suffix}:0",)


def aggregate_step_scope(what: str) -> str:
    """The name scope of one cross-worker step of the aggregation (``allreduce``, ``allgather``, ``host``).

    >>> aggregate_step_scope("allreduce")
    'parallax_aggregate/allreduce/'
    """
    return f"{AGGREGATE_PREFIX}/{what}/"


def variable_sync_scope(variable: str) -> str:
    """The name scope of the PS protocol ops of one variable (its accumulator, apply and take).

    >>> variable_sync_scope("emb")
    'parallax_sync/emb/'
    """
    return f"{SYNC_PREFIX}/{variable}/"


def local_copy_scope(variable: str, replica: int) -> str:
    """The name of replica ``replica``'s local copy of server variable ``variable``.

    >>> local_copy_scope("dense/kernel", 1)
    'parallax_local/replica_1/dense/kernel'
    """
    return f"{LOCAL_COPY_PREFIX}/replica_{replica}/{variable}"


def packed_reads_scope(group: int) -> str:
    """The name scope of the ``group``-th packed read of server variables (:mod:`parallax.rewrite.packed_reads`).

    >>> packed_reads_scope(0)
    'parallax_reads/0/'
    """
    return f"{READS_PREFIX}/{group}/"


def zero_scope(variable: str) -> str:
    """The name scope of the ops that keep and update this worker's part of ``variable`` (ZeRO).

    >>> zero_scope("dense/kernel")
    'parallax_zero/dense/kernel/'
    """
    return f"{ZERO_PREFIX}/{variable}/"


def is_parallax_op(name: str) -> bool:
    """Whether op ``name`` was made by the aggregation, the PS protocol or the packed reads.

    >>> is_parallax_op("parallax_sync/emb/take"), is_parallax_op("dense/MatMul")
    (True, False)
    """
    return name.startswith((f"{AGGREGATE_PREFIX}/", f"{SYNC_PREFIX}/", f"{READS_PREFIX}/", f"{ZERO_PREFIX}/"))


def sync_scope(train_op: str) -> str:
    """The name scope of the PS protocol ops of one training op (token queues, release, wait).

    >>> sync_scope("model/Adam")
    'parallax_sync/step/model/Adam/'
    """
    return f"{SYNC_PREFIX}/step/{train_op}/"


def unsynchronised_train_op(train_op: str) -> str:
    """The new name of a training op that the PS protocol takes the place of: the
    protocol's op takes the original name, so every op the user built on the
    training op (``tf.group``, ``control_dependencies``) runs the protocol.

    >>> unsynchronised_train_op("Adam")
    'parallax_sync/step/Adam/unsynchronised'
    """
    return f"{sync_scope(train_op)}unsynchronised"


def release_op(train_op: str) -> str:
    """The chief's op that releases the other workers after a step that ran ``train_op``
    (the session runs it once the whole step, EMA and moving statistics included, is done).

    >>> release_op("Adam")
    'parallax_sync/step/Adam/release'
    """
    return f"{sync_scope(train_op)}release"


#: The name scope of the barrier that orders the program's own writes of server variables outside a step.
WRITES_SCOPE = f"{SYNC_PREFIX}/writes/"


def writes_barrier_op(chief: bool) -> str:
    """The op a worker's session runs around a ``run`` that wrote server variables outside a training step
    (:func:`parallax.rewrite.ps_sync.add_ps_sync`): the chief's ``release`` after it, the others' ``wait``
    before it.

    >>> writes_barrier_op(True), writes_barrier_op(False)
    ('parallax_sync/writes/release', 'parallax_sync/writes/wait')
    """
    return f"{WRITES_SCOPE}{'release' if chief else 'wait'}"


def replica_seed_ops(op: str) -> tuple[str, str]:
    """The offset constant and the offset seed a replica's copy ``op`` of a stateless random op takes
    (:mod:`parallax.rewrite.replicate`).

    >>> replica_seed_ops("parallax_replica_1/dropout/StatelessRandomGetKeyCounter")[1]
    'parallax_replica_1/dropout/StatelessRandomGetKeyCounter/parallax_seed'
    """
    return f"{op}/parallax_seed_offset", f"{op}/parallax_seed"

