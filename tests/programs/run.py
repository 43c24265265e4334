"""Train public programs (tests/programs) under Parallax, one ``parallel_run`` call each, as a user's script.

``python run.py --resource_info R --run_option MODE --out DIR cifar10:queue ptb:ref ...``: each case
trains into ``DIR/<case>/``: every rank writes its final variables (``rank_<i>.npz``) and what the program
fetched and its hooks logged (``rank_<i>.json``); ptb also saves with its own ``Saver`` (``ckpt/``) and
``ptb:resume`` restores from that of ``ptb:resource``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402
from parallax.runtime.hooks import run_past_hooks  # noqa: E402
from tests.programs import cifar10, cnn_benchmark, ptb  # noqa: E402

STEPS = 6
EPOCHS = 2


def _plain(value):
    """JSON for what a session returned (lists of numpy values, dicts, tuples)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    return None if value is None else np.asarray(value).tolist()


def _write(out: str, worker_id: int, values: dict, record: dict) -> None:
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"rank_{worker_id}.npz"), **{k.replace("/", "__"): v for k, v in values.items()})
    with open(os.path.join(out, f"rank_{worker_id}.json"), "w") as f:
        json.dump(_plain(record), f)


def _values(sess, graph: tf.Graph) -> dict:
    """Every global variable, read past the hooks (replica 0's copy is the variable's own name)."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    reads = [v._as_graph_element().name for v in variables]  # a resource variable's value, not its handle
    return dict(zip([v.op.name for v in variables], run_past_hooks(sess.raw_session, reads)))


def run_cifar10(variant: str, resources: str, config: parallax.Config, out: str) -> None:
    program = cifar10.build(variant, steps=STEPS)
    config.hooks = program.hooks
    with program.graph.as_default():  # graph mode, as a TF1 program runs in TensorFlow 2
        _cifar10(program, resources, config, out)


def _cifar10(program, resources: str, config: parallax.Config, out: str) -> None:
    sess, _, worker_id, _ = parallax.parallel_run(program.graph, resources, parallax_config=config)
    runs = cifar10.train(sess, program)
    _write(out, worker_id, _values(sess, program.graph), {"runs": runs, "logged": program.logger.lines})
    sess.close()


def run_cnn_benchmark(variant: str, resources: str, config: parallax.Config, out: str) -> None:
    program = cnn_benchmark.build(resource=variant == "resource")
    with program.graph.as_default():
        sess, _, worker_id, _ = parallax.parallel_run(program.graph, resources, parallax_config=config)
        fetched = cnn_benchmark.train(sess, program, STEPS)
        _write(out, worker_id, _values(sess, program.graph), {"fetched": fetched})
        sess.close()


def run_ptb(variant: str, resources: str, config: parallax.Config, out: str) -> None:
    """``ref``/``resource``: two epochs, then the program's own Saver saves into ``<out>/ckpt``; ``resume``:
    restores the checkpoint of the ``ptb-resource`` case beside it and trains a third epoch."""
    program = ptb.build(resource=variant != "ref")
    with program.graph.as_default():
        sess, _, worker_id, _ = parallax.parallel_run(program.graph, resources, parallax_config=config)
        if variant == "resume":
            ptb.resume(sess, program, os.path.join(os.path.dirname(out), "ptb-resource", "ckpt"))
            fetched = ptb.train(sess, program, 1, first=EPOCHS)
            saved = None
        else:
            fetched = ptb.train(sess, program, EPOCHS)
            saved = ptb.save(sess, program, os.path.join(out, "ckpt"))
        _write(out, worker_id, _values(sess, program.graph), {"fetched": fetched, "saved": saved})
        sess.close()


PROGRAMS = {"cifar10": run_cifar10, "cnn_benchmark": run_cnn_benchmark, "ptb": run_ptb}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--resource_info", required=True)
    p.add_argument("--run_option", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("cases", nargs="+", help="<program>:<variant>")
    args = p.parse_args()
    for case in args.cases:
        name, _, variant = case.partition(":")
        config = parallax.Config(run_option=args.run_option, stall_timeout=60, average_sparse=True)
        PROGRAMS[name](variant, args.resource_info, config, os.path.join(args.out, case.replace(":", "-")))


if __name__ == "__main__":
    main()
