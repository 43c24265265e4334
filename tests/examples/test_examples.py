"""The examples as a user runs them: plain ``python`` and ``parallax-run``, on the shipped resource file."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.multiprocess.harness import ROOT, namespace_prefix

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

RESOURCES = os.path.join(ROOT, "resource_info.example")
PARALLAX_RUN = os.path.join(os.path.dirname(sys.executable), "parallax-run")


def run(*argv: str, timeout: float = 240) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([*namespace_prefix(), *argv], capture_output=True, text=True, errors="replace", env=env,
                          cwd=ROOT, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


def example(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.core  # what `make demo` runs
def test_simple_learns_the_line():
    output = run(sys.executable, "examples/simple/simple_train.py", "--resource_info", RESOURCES)
    assert "worker 1 of 2 ready" in output
    assert "learned W=0.1000 b=0.3000" in output


def test_image_classifier_with_parallax_run_equals_single_device_and_learns(tmp_path):
    steps, batch, compared = 100, 16, 20
    output = run(PARALLAX_RUN, "--resource_info", RESOURCES, "examples/image_classifier/cnn_train.py",
                 "--steps", str(steps), "--batch", str(batch), "--ckpt_dir", str(tmp_path),
                 "--save_steps", str(compared))
    assert "starting 2 processes" in output
    accuracy = float(re.search(r"held-out accuracy ([\d.]+)%", output).group(1))
    assert accuracy > 90, output[-3000:]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"-{steps}")

    # Equality is checked at step 20, from the checkpoint saved then (the saver keeps the last 5).
    # Why not at step 100: the two ranks compute the gradient of 16 images each and average them,
    # one device computes it over the 32 at once, so float32 sums are grouped differently and
    # differ in the last bits (~1e-8 per step). Momentum carries every difference on, so it grows
    # (measured: max abs 9.5e-8 at step 20, 2.4e-6 at 100), and a rare flip of a ReLU or a
    # max-pool choice turns it into a jump (one fresh clone: 3.7e-4 at step 100, 57 of 144
    # values off at rtol 1e-5). Thread counts do not matter here (measured with 1 and with the
    # default). At step 20 rtol 1e-5 / atol 1e-6 holds with a margin of 10x over the measured error.
    cnn = example("examples/image_classifier/cnn_train.py")
    args = cnn.parse_args([])
    images, labels = cnn.make_images(args.train_images, seed=args.seed)
    graph, t = cnn.build_graph(args.learning_rate, seed=args.seed)
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(1, compared + 1):
            rows = cnn.step_rows(step, batch, 2, [0, 1], len(images))
            union = np.concatenate([np.arange(len(images))[r] for r in rows])
            sess.run(t.train_op, {t.images: images[union], t.labels: labels[union]})
        expected = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
    # The job's checkpoint is under the single-device names: read it back variable by variable.
    reader = tf.train.load_checkpoint(os.path.join(str(tmp_path), f"model.ckpt-{compared}"))
    assert set(reader.get_variable_to_shape_map()) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(reader.get_tensor(name), value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sparse_lm_in_hybrid_trains():
    output = run(sys.executable, "examples/sparse_lm/lm_train.py", "--resource_info", RESOURCES,
                 "--run_option", "HYBRID", "--vocab", "5000", "--steps", "60", "--log_every", "30")
    assert "starting 3 processes" in output  # 2 workers and a server for the sparse variables
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", output).groups())
    assert last < first - 1.0, output[-3000:]


@pytest.mark.parametrize("backend", ["dask", "local"])
def test_the_sweep_example_finds_the_best_learning_rate(tmp_path, backend):
    output = run(sys.executable, "examples/sweep/lr_sweep.py", "--resource_info", RESOURCES, "--backend", backend,
                 "--output", str(tmp_path / backend))
    assert output.count(" ok ") == 4, output[-4000:]
    assert "best: learning_rate=0.5," in output, output[-3000:]
    assert (tmp_path / backend / "sweep.png").exists()


@pytest.mark.parametrize("run_option", ["MPI", "HYBRID"])
def test_the_tf_function_custom_loop_learns_and_equals_eager_training_on_one_device(run_option):
    output = run(sys.executable, "examples/tf_function/custom_loop.py", "--resource_info", RESOURCES,
                 "--run_option", run_option)
    for worker in range(2):
        accuracy = float(re.search(rf"worker {worker} of 2: held-out accuracy ([\d.]+)%", output).group(1))
        assert accuracy > 90, output[-3000:]
        worst = float(re.search(rf"worker {worker}: largest difference from eager training on one device "
                                r"([\d.e+-]+)", output).group(1))
        assert worst < 1e-5, output[-3000:]


def test_the_keras_fit_example_learns_and_equals_model_fit_evaluate_and_predict_on_one_device():
    output = run(sys.executable, "examples/keras/fit_embedding.py", "--resource_info", RESOURCES)
    assert "Epoch 4/4" in output  # Keras's progress bar, on worker 0
    for worker in range(2):
        accuracy = float(re.search(rf"worker {worker} of 2: val_accuracy ([\d.]+)%", output).group(1))
        assert accuracy > 80, output[-3000:]
        worst = float(re.search(rf"worker {worker}: largest difference from model.fit on one device ([\d.e+-]+)",
                                output).group(1))
        assert worst < 1e-5, output[-3000:]
        assert re.search(rf"worker {worker}: test accuracy [\d.]+%, 1000 predictions", output), output[-3000:]
        gap = float(re.search(rf"worker {worker}: largest difference of the sharded evaluation and predictions from "
                              r"model.evaluate and model.predict ([\d.e+-]+)", output).group(1))
        assert gap < 1e-6, output[-3000:]
