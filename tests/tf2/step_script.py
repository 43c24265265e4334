"""A user's TF2 program trained by Parallax: ``python step_script.py --resource_info R --run_option M --out D
CASE...``: each case a parallel_run call of its own; every rank writes the losses it saw and its trained
variables and its optimizer's (written back into the program's own, as ``DistributedStep.close`` does) to
``D/<case>/rank_<id>.npz``."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.programs import batches, build, optimizer_state  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--config", default="{}", help="more parallax.Config fields, as JSON")
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        train_step, variables = build(case)
        config = parallax.Config(run_option=args.run_option, average_sparse=True, stall_timeout=60,
                                 **json.loads(args.config))
        step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                           parallax_config=config)
        parts = num_workers * num_replicas
        losses = []
        for ids, y in batches(args.steps, case):
            mine = slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
            losses.append([float(v) for v in step(np.split(ids, parts)[mine], np.split(y, parts)[mine])])
        step.close()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        np.savez(os.path.join(out, f"rank_{worker_id}.npz"), losses=np.array(losses),
                 **{f"v{i}": v.numpy() for i, v in enumerate(variables())},
                 **{f"o{i}": v for i, v in enumerate(optimizer_state(variables))})


if __name__ == "__main__":
    main()
