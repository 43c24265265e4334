"""A user's Keras 3 program trained with ``parallax.fit``: ``python fit_script.py --resource_info R
--run_option M --out D CASE...``; each rank writes its History and trained weights to ``D/<case>/rank_<id>``."""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.fit_programs import BATCH, EPOCHS, build, data, dataset  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--resource_info", required=True)
    p.add_argument("--run_option", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        import keras

        model = build(case)
        x, y, validation = data()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "model.weights.h5"), save_weights_only=True)]
        config = parallax.Config(run_option=args.run_option, average_sparse=True, stall_timeout=60)
        source = dict(x=dataset()) if case == "dataset" else dict(x=x, y=y, batch_size=BATCH,
                                                                  shuffle=case == "shuffled", seed=0)
        history = parallax.fit(model, **source, epochs=EPOCHS, validation_data=validation, callbacks=callbacks,
                               verbose=0, resource_info=args.resource_info, parallax_config=config)
        rank = history.worker_id
        with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
            json.dump({"history": history.history}, f)
        np.savez(os.path.join(out, f"rank_{rank}.npz"), **{f"v{i}": v.numpy() for i, v in
                                                            enumerate(model.trainable_variables)},
                 **{f"o{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)})


if __name__ == "__main__":
    main()
