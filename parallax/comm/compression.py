"""16-bit gradients on the wire (``CommunicationConfig(compression="fp16" | "bf16")``).

Horovod's ``Compression`` semantics: a floating-point tensor (float32, float64) is cast to
16 bits before it leaves the worker and back to its own dtype where it arrives; tensors of
other dtypes (indices, counts, float16 already) travel as they are. The sums of all-reduces are
made in the 16-bit format (each partial sum rounded to it, as Horovod's are); a parameter server
casts each push back before it adds it to its float32 accumulator.

* ``bf16`` (bfloat16: 8 exponent bits, as float32; 7 stored mantissa bits): float32's range,
  so nothing is scaled. Each value, and each partial sum, is rounded to a relative error of at most
  ``2**-8`` (:data:`UNIT_ROUNDOFF`).
* ``fp16`` (IEEE half: 5 exponent bits, 10 stored mantissa bits, largest value 65504): rounded to
  ``2**-11``, in a range too narrow for gradients as they are (a gradient of 1e-8 is zero in
  float16, one of 1e5 is infinite). Unlike Horovod's, Parallax's fp16 is scaled: each tensor is
  multiplied by a power of two before the cast and divided by it after, chosen so that the largest
  value any sum of it can reach is at most ``2**15`` (:data:`FP16_CEILING_EXPONENT`). For an
  all-reduce or all-gather the workers agree on that power: first they all-reduce one small
  float32 vector, each tensor's largest magnitude on each worker, whose sum bounds every partial
  sum (one more call per all-reduce, of 4 bytes per tensor). A push to a server carries its own
  (one float32 per tensor or packed buffer). Powers of two make the scaling itself exact.

The formats' names are :data:`parallax.config.COMPRESSIONS`; with ``auto`` the plan sends 16 bits
when the job spans several hosts (:func:`parallax.plan.policies.resolve_compression`) and
``parallax tune`` measures each format (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from parallax.config import BF16, COMPRESSED_FORMATS, FP16

__all__ = ["WIRE_DTYPES", "UNIT_ROUNDOFF", "FP16_CEILING_EXPONENT", "compressible", "agreed_scales",
           "local_scale", "for_push", "compress", "decompress", "compressed_allreduce", "compressed_allgather"]

#: The dtype each format sends.
WIRE_DTYPES = {FP16: tf.float16, BF16: tf.bfloat16}
assert set(WIRE_DTYPES) == set(COMPRESSED_FORMATS)
#: The largest relative error of one rounding to each format (half its machine epsilon).
UNIT_ROUNDOFF = {FP16: 2.0 ** -11, BF16: 2.0 ** -8}
#: fp16's scaled values and sums stay at or below 2**this (65504 is float16's largest value).
FP16_CEILING_EXPONENT = 15
#: The scale's exponent is kept within +-this (float32 holds 2**+-126).
_LONGEST_EXPONENT = 100.0
_FLOATS = (tf.float32, tf.float64)


def compressible(dtype: tf.DType) -> bool:
    """Whether a tensor of ``dtype`` travels in 16 bits (float32 and float64 do)."""
    return tf.dtypes.as_dtype(dtype).base_dtype in _FLOATS


def _largest_magnitude(tensor: tf.Tensor) -> tf.Tensor:
    """``max |tensor|`` as a float32 scalar (0 for an empty tensor)."""
    return tf.cast(tf.reduce_max(tf.concat([tf.reshape(tf.abs(tensor), [-1]), tf.zeros([1], tensor.dtype)], 0)),
                   tf.float32)


def _scales(bound: tf.Tensor) -> tf.Tensor:
    """``2**(15 - ceil(log2 bound))`` per bound (float32): a value of at most ``bound`` scaled by it is at
    most ``2**15``; 1 where the bound is 0, infinite or NaN (an infinite or NaN gradient stays so)."""
    usable = tf.math.is_finite(bound) & (bound > 0)
    exponent = FP16_CEILING_EXPONENT - tf.math.ceil(tf.math.log(tf.where(usable, bound, 1.0)) / tf.math.log(2.0))
    exponent = tf.clip_by_value(exponent, -_LONGEST_EXPONENT, _LONGEST_EXPONENT)
    return tf.where(usable, tf.pow(2.0, exponent), tf.ones_like(bound))


def agreed_scales(tensors: list[tf.Tensor], allreduce_sum: Callable[[list[tf.Tensor]], list[tf.Tensor]]
                  ) -> tf.Tensor:
    """One fp16 scale per tensor that every worker computes alike: from the sum over the workers of
    each tensor's largest magnitude (one all-reduce of a float32 vector), which bounds every partial
    sum of the tensor's elements."""
    local = tf.stack([_largest_magnitude(t) for t in tensors])
    return _scales(allreduce_sum([local])[0])


def local_scale(tensor: tf.Tensor) -> tf.Tensor:
    """The fp16 scale of one tensor sent alone (a push to a server)."""
    return _scales(_largest_magnitude(tensor))


def for_push(tensor: tf.Tensor, fmt: str) -> tuple[tf.Tensor, tf.Tensor | None]:
    """What a worker sends to a server for ``tensor``: ``(tensor in fmt's 16 bits, its own fp16 scale or
    None)``; ``(tensor, None)`` when it is not :func:`compressible` or ``fmt`` is ``"none"``.
    :func:`decompress` with the same scale, where it arrives, gives it back."""
    if fmt not in WIRE_DTYPES or not compressible(tensor.dtype):
        return tensor, None
    scale = local_scale(tensor) if fmt == FP16 else None
    return compress(tensor, fmt, scale), scale


def compress(tensor: tf.Tensor, fmt: str, scale: tf.Tensor | None = None) -> tf.Tensor:
    """``tensor`` (times ``scale``) in ``fmt``'s 16 bits; a tensor that is not :func:`compressible`
    as it is."""
    if not compressible(tensor.dtype):
        return tensor
    if scale is not None:
        tensor = tensor * tf.cast(scale, tensor.dtype)
    return tf.cast(tensor, WIRE_DTYPES[fmt])


def decompress(tensor: tf.Tensor, dtype: tf.DType, scale: tf.Tensor | None = None) -> tf.Tensor:
    """What :func:`compress` sent, back in ``dtype`` (divided by ``scale``)."""
    if tensor.dtype == dtype:
        return tensor
    out = tf.cast(tensor, dtype)
    return out if scale is None else out / tf.cast(scale, dtype)


def _scales_of(values: list[tf.Tensor], fmt: str, allreduce_sum) -> dict[int, tf.Tensor | None]:
    """For each :func:`compressible` one of ``values`` (by position): its agreed scale (fp16), or ``None``."""
    chosen = [i for i, t in enumerate(values) if compressible(t.dtype)]
    if not chosen or fmt != FP16:
        return dict.fromkeys(chosen)
    scales = agreed_scales([values[i] for i in chosen], allreduce_sum)
    return {i: scales[k] for k, i in enumerate(chosen)}


def compressed_allreduce(tensors: list[tf.Tensor], fmt: str,
                         allreduce_sum: Callable[[list[tf.Tensor]], list[tf.Tensor]]) -> list[tf.Tensor]:
    """``allreduce_sum(tensors)`` with the floating ones sent in ``fmt`` (fp16: scaled, the scales agreed
    first), each output in its input's dtype; ``fmt`` ``"none"``: ``allreduce_sum(tensors)``."""
    if fmt not in WIRE_DTYPES:
        return allreduce_sum(tensors)
    scale_of = _scales_of(tensors, fmt, allreduce_sum)
    sent = [compress(t, fmt, scale_of[i]) if i in scale_of else t for i, t in enumerate(tensors)]
    summed = allreduce_sum(sent)
    return [decompress(s, t.dtype, scale_of.get(i)) for i, (s, t) in enumerate(zip(summed, tensors))]


def compressed_allgather(pairs: list[tuple[tf.Tensor, tf.Tensor]], fmt: str, allgather: Callable[[list], list],
                         allreduce_sum: Callable[[list[tf.Tensor]], list[tf.Tensor]]
                         ) -> list[tuple[tf.Tensor, tf.Tensor]]:
    """``allgather(pairs)`` with floating values sent in ``fmt`` (fp16: scaled alike on every worker, the
    scales agreed first with ``allreduce_sum``); the indices as they are; ``fmt`` ``"none"``: ``allgather(pairs)``."""
    if fmt not in WIRE_DTYPES:
        return allgather(pairs)
    scale_of = _scales_of([values for values, _ in pairs], fmt, allreduce_sum)
    sent = [(compress(v, fmt, scale_of[i]), ix) if i in scale_of else (v, ix) for i, (v, ix) in enumerate(pairs)]
    gathered = allgather(sent)
    return [(decompress(v, pairs[i][0].dtype, scale_of.get(i)), ix) for i, (v, ix) in enumerate(gathered)]
