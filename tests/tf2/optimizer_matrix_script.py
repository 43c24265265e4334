"""Keras 3 optimizers trained by Parallax (tests/tf2/optimizer_matrix.py): ``python optimizer_matrix_script.py
--resource_info R --run_option M --out D CASE...``: each case a parallel_run call of its own, in one job; every
rank writes the losses it saw, its trained variables and its optimizer's to ``D/<case>/rank_<id>.npz``. A case
Parallax refuses writes the refusal (``D/<case>/refused.txt``, by rank 0 or by the launching process) instead and
the job goes on with the next case."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from parallax.errors import AnalysisError  # noqa: E402
from tests.tf2.optimizer_matrix import batches, build, optimizer_state  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--config", default="{}", help="more parallax.Config fields, as JSON")
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        train_step, variables = build(case)
        config = parallax.Config(run_option=args.run_option, stall_timeout=60, **json.loads(args.config))
        try:
            step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                               parallax_config=config)
        except AnalysisError as e:  # every process analyses the same graph: each says the same
            with open(os.path.join(out, "refused.txt"), "w") as f:
                f.write(str(e))
            continue
        parts = num_workers * num_replicas
        losses = []
        for x, y in batches(args.steps):
            mine = slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
            losses.append([float(v) for v in step(np.split(x, parts)[mine], np.split(y, parts)[mine])])
        step.close()
        np.savez(os.path.join(out, f"rank_{worker_id}.npz"), losses=np.array(losses),
                 **{f"v{i}": v.numpy() for i, v in enumerate(variables())},
                 **{f"o{i}": v for i, v in enumerate(optimizer_state(variables))})


if __name__ == "__main__":
    main()
