"""A user's TF2 program that checkpoints with ``CheckPointConfig(checkpoint=tf.train.Checkpoint(...))`` and
resumes: ``python checkpoint_script.py --resource_info R --run_option M --out D --ckpt_dir C --until N CASE``.
It goes on from the step its optimizer's restored ``iterations`` says, trains up to step ``N`` (of the
union batches of tests/tf2/programs.py) and each rank writes its step range to ``D/<case>/rank_<id>.json``.
``--max_restarts``, ``--kill`` and ``--step_sleep`` serve tests/multiprocess/test_elastic.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.checkpoint_programs import build  # noqa: E402
from tests.tf2.programs import batches  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--ckpt_dir", required=True)
    p.add_argument("--until", type=int, required=True)
    p.add_argument("--max_restarts", type=int, default=0, help="ElasticConfig.max_restarts")
    p.add_argument("--kill", type=int, default=-1, help="worker 1 kills itself before this step, once")
    p.add_argument("--step_sleep", type=float, default=0.0, help="seconds each worker sleeps after each step")
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        train_step, model, optimizer, checkpoint = build(case)
        ckpt = parallax.CheckPointConfig(ckpt_dir=os.path.join(args.ckpt_dir, case), save_ckpt_steps=2,
                                         checkpoint=checkpoint)
        config = parallax.Config(run_option=args.run_option, average_sparse=True, stall_timeout=60, ckpt_config=ckpt,
                                 elastic_config=parallax.ElasticConfig(max_restarts=args.max_restarts))
        step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                           parallax_config=config)
        start = int(optimizer.iterations.numpy())  # the restored checkpoint's step
        parts = num_workers * num_replicas
        mine = slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"pid_{worker_id}"), "w") as f:  # for tests that signal a worker
            f.write(str(os.getpid()))
        for at, (ids, y) in enumerate(batches(args.until)[start:], start):
            marker = os.path.join(args.out, f"killed_{case}")
            if worker_id == 1 and at == args.kill and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            step(np.split(ids, parts)[mine], np.split(y, parts)[mine])
            with open(os.path.join(args.out, f"step_{worker_id}"), "w") as f:
                f.write(str(at + 1))
            time.sleep(args.step_sleep)
        step.close()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank_{worker_id}.json"), "w") as f:
            json.dump({"start": start, "iterations": int(optimizer.iterations.numpy())}, f)


if __name__ == "__main__":
    main()
