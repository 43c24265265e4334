"""TensorFlow 2 programs in: a ``tf.function`` training step (:mod:`parallax.tf2.trace`) becomes the same
single-device graph a ``tf.compat.v1`` program builds, which the rest of Parallax takes as it is; the
user gets back a step to call (:mod:`parallax.tf2.step`)."""
