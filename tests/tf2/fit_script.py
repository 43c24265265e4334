"""A user's Keras program trained with ``parallax.fit``, then evaluated and asked for predictions with
``parallax.evaluate`` / ``parallax.predict``: ``python fit_script.py --resource_info R --run_option M --out D
[--zero_stage N] CASE...``; each rank writes its History, trained weights, evaluation and predictions (and
``model.evaluate`` / ``model.predict`` of its own trained model on one device) to ``D/<case>/rank_<id>``."""

from __future__ import annotations

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.fit_programs import (  # noqa: E402
    CASES,
    EPOCHS,
    EVAL_BATCH,
    SHUFFLED,
    SPLIT,
    batch_logs_seen,
    batch_size,
    build,
    data,
    dataset,
    held_out,
    kernel_norms,
    validation_data,
    weights,
    within_epochs,
)
from tests.tf2.fit_programs import (
    callbacks as scheduled,
)
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--zero_stage", type=int, default=0)
    p.add_argument("cases", nargs="+")
    args = p.parse_args()
    for case in args.cases:
        model = build(CASES[case])
        keras = importlib.import_module("tf_keras" if CASES[case].startswith("tf_keras") else "keras")
        x, y, _ = data()
        out = os.path.join(args.out, case)
        os.makedirs(out, exist_ok=True)
        callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "model.weights.h5"), save_weights_only=True)]
        if case == "ordered":  # saves within epochs too (the weights of steps 3, 6, 12) and logs a kernel's norm
            callbacks += [within_epochs(keras, out), kernel_norms(keras)]
        callbacks += scheduled(case)
        config = parallax.Config(run_option=args.run_option, average_sparse=True, stall_timeout=60,
                                 zero_stage=args.zero_stage)
        mapped = tf.Variable(0, dtype=tf.int64)  # the examples this worker's input pipeline mapped
        validated = tf.Variable(0, dtype=tf.int64)  # and its validation data's
        source = dict(x=dataset(case, mapped)) if case.endswith("dataset") else \
            dict(x=x, y=y, batch_size=batch_size(case), shuffle=case in SHUFFLED)
        if case.endswith("weighted"):
            source.update(sample_weight=weights(), validation_split=SPLIT)
        else:
            source.update(validation_data=validation_data(case, validated))
        history = parallax.fit(model, **source, epochs=EPOCHS, callbacks=callbacks, verbose=0,
                               resource_info=args.resource_info, parallax_config=config)
        test_x, test_y = held_out()
        evaluated = parallax.evaluate(model, test_x, test_y, batch_size=EVAL_BATCH, verbose=0, return_dict=True)
        alone = model.evaluate(test_x, test_y, batch_size=EVAL_BATCH, verbose=0, return_dict=True)
        rank = history.worker_id
        with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
            json.dump({"history": history.history, "evaluate": evaluated,
                       "evaluate_alone": {k: float(v) for k, v in alone.items()},
                       "evaluate_list": parallax.evaluate(model, test_x, test_y, batch_size=EVAL_BATCH, verbose=0),
                       "mapped": int(mapped.numpy()), "validated": int(validated.numpy()),
                       "batch_logs": batch_logs_seen(callbacks),
                       "norms": [n for c in callbacks for n in getattr(c, "norms", [])]},
                      f, default=float)
        np.savez(os.path.join(out, f"rank_{rank}.npz"),
                 predict=parallax.predict(model, test_x, batch_size=EVAL_BATCH, verbose=0),
                 predict_alone=model.predict(test_x, batch_size=EVAL_BATCH, verbose=0),
                 **{f"v{i}": v.numpy() for i, v in enumerate(model.trainable_variables)})


if __name__ == "__main__":
    main()
