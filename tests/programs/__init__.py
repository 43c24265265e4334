"""Public TF1 programs, rewritten small (not copied), as their authors wrote them.

Each module builds its single-device graph with ``build()`` and trains it with
``train(sess, program, steps)``, the same loop for a ``MonitoredSession`` on one
device and for the session ``parallel_run`` returns:

* ``cifar10``: TensorFlow's CIFAR-10 tutorial (tensorflow/models, Apache 2.0): an
  input queue (or a ``tf.data`` iterator), weight decay through a ``losses``
  collection, a loss EMA run before the gradients, a decaying learning rate, an
  EMA of the weights after the update, and hooks as the tutorial writes them
  (``StopAtStepHook``, ``NanTensorHook(loss)``, a logger hook returning
  ``SessionRunArgs(loss)``) and a ``should_stop()`` loop;
* ``cnn_benchmark``: tf_cnn_benchmarks as the original Parallax's example runs it
  (Apache 2.0): batch-norm moving statistics in ``UPDATE_OPS``, ``tf.group(apply,
  *update_ops)``, and the training op the program fetches is its own global-step
  increment ``global_step.assign_add(1, use_locking=True)`` under that group's
  control dependency, fetched as a tensor in a dict with the loss;
* ``ptb``: TensorFlow's PTB word language model (tensorflow/models, Apache 2.0): an
  input producer queue, an LSTM unrolled over its steps with its state fed back
  each step, gradients clipped by global norm, and a learning-rate variable the
  program assigns from a placeholder each epoch (``tf.assign(lr, new_lr)``), that
  tensor kept in a graph collection, and the program's own ``Saver`` (as its
  ``Supervisor`` saves: ``saver.save(session, path, global_step=global_step)``), a
  later run restoring from it and training on.

``run.py`` trains one or several of them under Parallax, as a user's script.
"""
