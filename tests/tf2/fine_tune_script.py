"""tests/tf2/fine_tune_programs.py's two stages, each ``parallax.fit`` (a job, then a second job in the same
processes): ``python fine_tune_script.py --resource_info R --run_option M --out D FLAVOR...``; each rank writes its
Histories and trained weights to ``D/<flavor>/rank_<id>.npz``."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.fine_tune_programs import train  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("flavors", nargs="+")
    args = p.parse_args()
    config = parallax.Config(run_option=args.run_option, stall_timeout=60)
    seen = {}

    def fit(model, *arguments, **options):
        history = parallax.fit(model, *arguments, **options, resource_info=args.resource_info, parallax_config=config)
        seen["worker"] = history.worker_id
        return history

    for flavor in args.flavors:
        model, histories = train(flavor, fit)
        out = os.path.join(args.out, flavor)
        os.makedirs(out, exist_ok=True)
        np.savez(os.path.join(out, f"rank_{seen['worker']}.npz"), histories=json.dumps(histories),
                 **{f"v{i}": w.numpy() for i, w in enumerate(model.weights)})


if __name__ == "__main__":
    main()
