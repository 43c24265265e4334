"""The programs of tests/tf2/keras_programs.py moved onto Parallax at their one training call:
``python keras_script.py --resource_info R --run_option M --out D [--zero_stage N] PROGRAM...``; each rank writes
its History, trained weights and optimizer variables to ``D/<program>/rank_<id>.npz``."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.keras_programs import CONFIGS, build, data, fit_arguments, optimizer_variables, weights  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--zero_stage", type=int, default=0)
    p.add_argument("programs", nargs="+")
    args = p.parse_args()
    for name in args.programs:
        model = build(name)
        x, y = data(name)
        config = parallax.Config(run_option=args.run_option, stall_timeout=60, zero_stage=args.zero_stage,
                                 **CONFIGS.get(name, {}))
        history = parallax.fit(model, x, y, verbose=0, **fit_arguments(name), resource_info=args.resource_info,
                               parallax_config=config)
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        np.savez(os.path.join(out, f"rank_{history.worker_id}.npz"), history=json.dumps(history.history),
                 **{f"v{i}": v for i, v in enumerate(weights(name, model))},
                 **{f"s{i}": v for i, v in enumerate(optimizer_variables(model))})


if __name__ == "__main__":
    main()
