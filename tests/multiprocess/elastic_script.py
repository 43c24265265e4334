"""A program written for elastic restarts: it trains up to a global step, each global step on its own union batch
(split over however many replicas the attempt has), and its workers die where told, once each.

Run by tests/multiprocess/test_elastic.py (and tests/cluster/test_elastic_hosts.py); ``--kill 1:3,0:6``: worker 1
kills itself before global step 3, and worker 0 before global step 6 (of whichever attempt reaches it first).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import parallax  # noqa: E402
from tests.models import BUILDERS, DATA  # noqa: E402
from tests.multiprocess.train_script import kill  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--resource_info", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--run_option", default="MPI")
    p.add_argument("--model", default="embedding")
    p.add_argument("--steps", type=int, default=8, help="the global step training ends at")
    p.add_argument("--batch", type=int, default=12, help="the union batch of every global step")
    p.add_argument("--kill", default="", help="worker:step,...: that worker kills itself before that global step")
    p.add_argument("--max_restarts", type=int, default=None, help="ElasticConfig.max_restarts (unset: no config)")
    p.add_argument("--min_workers", type=int, default=1)
    p.add_argument("--save_steps", type=int, default=None,
                   help="CheckPointConfig.save_ckpt_steps with --ckpt_dir, else ElasticConfig.save_ckpt_steps")
    p.add_argument("--step_sleep", type=float, default=0.0, help="seconds each worker sleeps after each step")
    p.add_argument("--stall_timeout", type=float, default=30.0, help="Config.stall_timeout")
    p.add_argument("--stall_shutdown", type=float, default=900.0, help="Config.stall_shutdown")
    p.add_argument("--hang", default="", help="worker:step: that worker hangs (sleeps 600 s) before that global step, "
                                              "once")
    p.add_argument("--ckpt_dir", default=None, help="CheckPointConfig.ckpt_dir (unset: elastic mode's own)")
    return p


def main() -> None:
    args = parser().parse_args()
    model = BUILDERS[args.model]("adam")
    own = args.ckpt_dir is not None
    elastic = parallax.ElasticConfig(max_restarts=args.max_restarts, min_workers=args.min_workers,
                                     save_ckpt_steps=None if own else args.save_steps) \
        if args.max_restarts is not None else None
    ckpt = parallax.CheckPointConfig(ckpt_dir=args.ckpt_dir, save_ckpt_steps=args.save_steps if own else None)
    config = parallax.Config(run_option=args.run_option, average_sparse=True, ckpt_config=ckpt,
                             stall_timeout=args.stall_timeout, stall_shutdown=args.stall_shutdown,
                             **({"elastic_config": elastic} if elastic is not None else {}))
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(model.graph, args.resource_info,
                                                                       parallax_config=config)
    global_step = tf.compat.v1.train.get_global_step(model.graph)
    step = int(sess.run(global_step)[0])
    os.makedirs(args.out, exist_ok=True)
    print(f"worker {worker_id} of {num_workers} starts at global step {step}", flush=True)
    with open(os.path.join(args.out, f"pid_{worker_id}"), "w") as f:  # for tests that signal a worker
        f.write(str(os.getpid()))
    kills = [tuple(int(x) for x in k.split(":")) for k in args.kill.split(",") if k]
    data = DATA[args.model](args.steps, args.batch)
    parts = num_workers * num_replicas
    os.makedirs(args.out, exist_ok=True)
    while step < args.steps:
        for i, (worker, at) in enumerate(kills):
            marker = os.path.join(args.out, f"killed_{i}")
            if worker == worker_id and at == step and not os.path.exists(marker):
                open(marker, "w").close()
                kill(os.getpid(), args.out)
        if args.hang == f"{worker_id}:{step}" and not os.path.exists(os.path.join(args.out, "hung")):
            open(os.path.join(args.out, "hung"), "w").close()
            time.sleep(600)  # the stall check ends the job; elastic mode restarts it
        mine = {model.inputs[k]: np.split(v, parts)[worker_id * num_replicas:(worker_id + 1) * num_replicas]
                for k, v in data[step].items()}
        sess.run(model.step_op(step), feed_dict=mine)
        step = int(sess.run(global_step)[0])
        with open(os.path.join(args.out, f"step_{worker_id}"), "w") as f:  # for tests that act mid-run
            f.write(str(step))
        time.sleep(args.step_sleep)
    variables = model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    values = sess.run(variables)
    np.savez(os.path.join(args.out, f"rank_{worker_id}.npz"),
             **{v.op.name.replace("/", "__"): value[0] for v, value in zip(variables, values)})
    print(f"rank {worker_id} of {num_workers} done at global step {step}", flush=True)
    sess.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    main()
