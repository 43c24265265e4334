"""The ``collective`` backend: TensorFlow's own collective ops.

Ops added (under the caller's name scope), all in one group of
``num_workers`` members whose key comes from the plan (:attr:`CommSpec.job_key`,
so that a later job of the same processes, whose collectives differ, never
meets the instances a TensorFlow server remembers from an earlier one), with
instance keys numbered in the order the gradients come (the dense ones in the
order the backward pass makes them ready), identical on every worker:

* ``CollectiveReduceV2`` (merge ``Add``) per dense gradient;
* per sparse gradient: ``CollectiveGatherV2`` of each worker's row count,
  then of the values and indices padded to the largest count, and a mask that
  drops the padding.

``communication_hint`` is ``nccl`` on GPUs and ``ring`` otherwise. The
workers must run TensorFlow servers in one cluster (:attr:`needs_server`: the
process's role starts them) and the session must name a collective group
leader (:meth:`CollectiveBackend.configure_session`).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from parallax.comm.base import Backend, ProcessComms

__all__ = ["CollectiveBackend", "TIMEOUT_SECONDS"]

TIMEOUT_SECONDS = 120.0


class CollectiveBackend(Backend):
    """TF collectives (see the module docstring)."""

    name = "collective"
    needs_server = True
    wire_formats = ("fp16",)  # CollectiveGatherV2 takes no bfloat16

    def __init__(self, spec, num_workers, group: str = ""):
        super().__init__(spec, num_workers, group)
        self._instance = 0
        self._hint = "nccl" if spec.gpu else "ring"

    @classmethod
    def configure_session(cls, config: config_pb2.ConfigProto, comms: ProcessComms) -> None:
        """Collective ops need the group leader's name in the session config."""
        if comms.group_leader is not None:
            config.experimental.collective_group_leader = comms.group_leader

    def _next_key(self) -> tf.Tensor:
        self._instance += 1
        return tf.constant(self._instance, name=f"instance_key_{self._instance}")

    def _common(self):
        return dict(group_size=tf.constant(self.num_workers, name="group_size"),
                    group_key=tf.constant(1 + self.spec.job_key, name="group_key"),
                    instance_key=self._next_key(), ordering_token=[],
                    communication_hint=self._hint, timeout_seconds=TIMEOUT_SECONDS)

    def allreduce_sum(self, tensors):
        return [tf.raw_ops.CollectiveReduceV2(input=t, merge_op="Add", final_op="Id", **self._common())
                for t in tensors]

    def _gather(self, t):
        return tf.raw_ops.CollectiveGatherV2(input=t, **self._common())

    def allgather(self, pairs):
        results = []
        for values, indices in pairs:
            count = tf.shape(indices, out_type=tf.int32)[:1]
            counts = self._gather(count)  # [num_workers]
            longest = tf.reduce_max(counts)
            pad = longest - count[0]
            values_padded = tf.pad(values, tf.concat([[[0, pad]], tf.zeros([tf.rank(values) - 1, 2],
                                                                            tf.int32)], 0))
            indices_padded = tf.pad(indices, [[0, pad]])
            all_values = self._gather(values_padded)
            all_indices = self._gather(indices_padded)
            keep = tf.reshape(tf.sequence_mask(counts, longest), [-1])
            results.append((tf.boolean_mask(all_values, keep), tf.boolean_mask(all_indices, keep)))
        return results
