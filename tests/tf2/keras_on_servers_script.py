"""A user's ``parallax.fit`` of tests/models.py's averaged Embedding model (Adam), its graph exported: what
tests/multiprocess/test_keras_on_servers.py runs in PS and HYBRID. Every rank writes the model's weights and its
optimizer's variables after training, and its trainable variables' names (``rank_<r>.npz``)."""

from __future__ import annotations

import argparse
import os

import numpy as np


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(4)
    return rng.randint(0, 300, (96, 5)), rng.randint(0, 2, (96, 1)).astype(np.float32)


def trained_values(model) -> list[np.ndarray]:
    return [np.atleast_1d(v) for v in model.weights + model.optimizer.variables]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resource_info", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--run_option", required=True)
    args = parser.parse_args()
    import keras

    import parallax
    from tests.models import averaged_embedding_model

    model = averaged_embedding_model(keras)
    x, y = data()
    history = parallax.fit(model, x, y, batch_size=16, epochs=2, verbose=0, resource_info=args.resource_info,
                           parallax_config=parallax.Config(run_option=args.run_option, stall_timeout=60,
                                                           export_graph_path=os.path.join(args.out, "graphs")))
    np.savez(os.path.join(args.out, f"rank_{history.worker_id}.npz"),
             trainable=[v.path for v in model.trainable_variables],
             **{f"v{i}": v for i, v in enumerate(trained_values(model))})


if __name__ == "__main__":
    main()
