"""A user's TF2 program that checkpoints with ``CheckPointConfig(checkpoint=tf.train.Checkpoint(...))`` and
resumes: ``python checkpoint_script.py --resource_info R --run_option M --out D --ckpt_dir C --until N CASE``.
It goes on from the step its optimizer's restored ``iterations`` says, trains up to step ``N`` (of the
union batches of tests/tf2/programs.py) and each rank writes its step range to ``D/<case>/rank_<id>.json``."""

from __future__ import annotations

import json
import os
import sys

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
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        train_step, model, optimizer, checkpoint = build(case)
        ckpt = parallax.CheckPointConfig(ckpt_dir=os.path.join(args.ckpt_dir, case), save_ckpt_steps=2,
                                         checkpoint=checkpoint)
        config = parallax.Config(run_option=args.run_option, average_sparse=True, stall_timeout=60, ckpt_config=ckpt)
        step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                           parallax_config=config)
        start = int(optimizer.iterations.numpy())  # the restored checkpoint's step
        parts = num_workers * num_replicas
        mine = slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
        for ids, y in batches(args.until)[start:]:
            step(np.split(ids, parts)[mine], np.split(y, parts)[mine])
        step.close()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank_{worker_id}.json"), "w") as f:
            json.dump({"start": start, "iterations": int(optimizer.iterations.numpy())}, f)


if __name__ == "__main__":
    main()
