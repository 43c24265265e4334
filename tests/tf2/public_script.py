"""The public custom training loops of tests/tf2/public_programs.py as their users run them with Parallax:
``python public_script.py --resource_info R --run_option M --out D --steps N PROGRAM...``; each rank writes
each replica's losses, its correct-prediction counts, its trained weights and ``parallax.predict`` of held-out
examples (with ``model.predict``'s, alone) to ``D/<program>/rank_<id>.npz``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import parallax  # noqa: E402
from tests.tf2.public_programs import WITHOUT_LOSS, arguments, batches, build, correct  # noqa: E402
from tests.tf2.scripts import parser  # noqa: E402


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("programs", nargs="+")
    args = p.parse_args()
    for name in args.programs:
        train_step, model, accuracy = build(name)
        config = parallax.Config(run_option=args.run_option, stall_timeout=60)
        step, num_workers, worker_id, num_replicas = parallax.parallel_run(train_step, args.resource_info,
                                                                           parallax_config=config)
        parts, mine = num_workers * num_replicas, slice(worker_id * num_replicas, (worker_id + 1) * num_replicas)
        losses, right = [], np.zeros(num_replicas, np.int64)
        for x, y in batches(name, args.steps):
            xs, ys = np.split(x, parts)[mine], np.split(y, parts)[mine]
            out = step(*arguments(name, model, xs, ys))
            if name in WITHOUT_LOSS:  # nothing (the quickstart, the VAE), or a dict of one loss per replica each (GAN)
                assert out is None if name != "gan" else sorted(out) == ["disc_loss", "gen_loss"], out
                continue
            if accuracy is None:  # the walkthrough: the loop keeps the accuracy, from the logits the step returns
                out, logits = out
                right += [correct(np.asarray(lg), yp) for lg, yp in zip(logits, ys)]
            losses.append([float(v) for v in out])
        step.close()
        if accuracy is not None:  # the guide: the step's own metric (this worker's first replica's, see the docs)
            right[0] = int(round(float(accuracy.variables[0].numpy())))
        held_out = batches(name, 1)[0][1 if name == "gan" else 0][:11]  # the GAN's model takes noise
        predictor = model.encoder if name == "tf-cvae" else model  # the VAE: a model without a call of its own
        predicted = parallax.predict(predictor, held_out, batch_size=5, verbose=0)  # sharded over the job's workers
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        np.savez(os.path.join(out_dir, f"rank_{worker_id}.npz"), losses=np.array(losses), correct=right,
                 predict=predicted, predict_alone=predictor.predict(held_out, batch_size=5, verbose=0),
                 **{f"v{i}": v.numpy() for i, v in enumerate(model.trainable_variables)})


if __name__ == "__main__":
    main()
