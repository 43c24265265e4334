"""A user's Keras program that goes on from its last backup: ``python backup_script.py --resource_info R
--run_option M --out D [--zero_stage N] BACKUP_DIR``: ``parallax.fit`` with ``BackupAndRestore(BACKUP_DIR)``
(tests/tf2/backup_programs.py); each rank writes its History, weights and optimizer variables to
``D/rank_<id>.npz``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.backup_programs import build, callback, fit_arguments, state  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--zero_stage", type=int, default=0)
    p.add_argument("backup_dir")
    args = p.parse_args()
    model = build()
    history = parallax.fit(model, **fit_arguments(), callbacks=[callback(args.backup_dir)],
                           resource_info=args.resource_info,
                           parallax_config=parallax.Config(run_option=args.run_option, zero_stage=args.zero_stage,
                                                           stall_timeout=60))
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank_{history.worker_id}.npz"), **state(model, history))


if __name__ == "__main__":
    main()
