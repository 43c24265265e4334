"""keras-io's text classification (tests/tf2/text_programs.py) trained with ``parallax.fit`` as a user moves its
``model.fit`` call: ``python text_script.py --resource_info R --run_option M --out D CASE``; each rank writes its
History, the batches of each epoch, the batches its pipeline's source read and its trained weights to
``D/<case>/rank_<id>``."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402
from tests.tf2.text_programs import EPOCHS, READS, batch_counter, build, datasets  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        model = build()
        train, validation = datasets()
        counter = batch_counter()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        history = parallax.fit(model, train, validation_data=validation, epochs=EPOCHS, callbacks=[counter],
                               verbose=0, resource_info=args.resource_info,
                               parallax_config=parallax.Config(run_option=args.run_option, stall_timeout=30))
        rank = history.worker_id
        with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
            json.dump({"history": history.history, "batches": counter.per_epoch, "reads": READS[0]}, f,
                      default=float)
        np.savez(os.path.join(out, f"rank_{rank}.npz"), **{f"v{i}": v.numpy()
                                                          for i, v in enumerate(model.trainable_variables)})


if __name__ == "__main__":
    main()
