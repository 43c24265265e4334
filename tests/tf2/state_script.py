"""A user's TF2 step with state that is not trained (tests/tf2/state_programs.py) trained by Parallax:
``python state_script.py --resource_info R --run_option M --out D --steps N``; each rank writes its losses and
its state (written back into the program's variables) to ``D/rank_<id>.npz``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402
from tests.tf2.state_programs import batches, build, state  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, required=True)
    args = p.parse_args()
    train_step, model, optimizer, metric = build()
    config = parallax.Config(run_option=args.run_option, stall_timeout=60)
    step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                       parallax_config=config)
    parts, mine = num_workers * num_replicas, slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
    losses = [[float(v) for v in step(np.split(x, parts)[mine], np.split(y, parts)[mine])]
              for x, y in batches(args.steps)]
    step.close()
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank_{worker_id}.npz"), losses=np.array(losses),
             **{k.replace("/", "__"): v for k, v in state(model, optimizer, metric).items()})


if __name__ == "__main__":
    main()
