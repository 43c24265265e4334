"""The idiom combinations of tests/tf2/idiom_programs.py moved onto Parallax: ``python idiom_script.py
--resource_info R --run_option M --out D NAME...``; each rank writes every weight of its model and the History's
losses to ``D/<name>/rank_<id>.npz``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.idiom_programs import run  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("names", nargs="+")
    args = p.parse_args()
    for name in args.names:
        job = {"resource_info": args.resource_info,
               "config": parallax.Config(run_option=args.run_option, stall_timeout=60)}
        weights, losses = run(name, job)
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
        np.savez(os.path.join(out, f"rank_{rank}.npz"), losses=np.array(losses, np.float64),
                 **{f"v{i}": w for i, w in enumerate(weights)})


if __name__ == "__main__":
    main()
