"""A Keras 3 Embedding's rows gathered on the parameter server (parallax/rewrite/placement.py): in PS and HYBRID
jobs the chief's graph gathers the table's rows on the server (it used to send the whole table to every worker
every step), and training equals ``model.fit`` on one device: every weight and every Adam slot, on every worker
(rtol 1e-5)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, run_script
from tests.tf2.server_gathers_script import data, trained_values

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "server_gathers_script.py")
SERVER = "/job:ps/replica:0/task:0/device:CPU:0"


def _nodes(graph: str) -> list[str]:
    """The text of each op of ``graph`` (a worker's exported graph)."""
    return re.findall(r"\n  node \{\n(.*?)\n  \}", graph, re.S)


@pytest.mark.parametrize("layout", ["PS-2", "HYBRID-2"])
def test_a_keras_embeddings_rows_are_gathered_on_the_server_and_training_is_model_fits(tmp_path, layout):
    import keras

    from tests.models import averaged_embedding_model

    resource, run_option, workers, _ = LAYOUTS[layout]
    run = run_script(tmp_path, resource, "--run_option", run_option, timeout=240, script=SCRIPT)
    assert run.returncode == 0, run.output[-4000:]
    reference = averaged_embedding_model(keras)
    x, y = data()
    reference.fit(x, y, batch_size=16, epochs=2, verbose=0)
    expected = trained_values(reference)
    for rank in range(workers):
        with np.load(os.path.join(run.out_dir, f"rank_{rank}.npz")) as got:
            assert len(got.files) == len(expected)
            for i, value in enumerate(expected):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-7, err_msg=f"{layout} rank {rank}: "
                                           f"{(reference.weights + reference.optimizer.variables)[i].path}")
    with open(os.path.join(run.out_dir, "graphs", "worker-0_metagraph"), encoding="utf-8") as f:
        graph = f.read()
    # the Embedding's rows gathered on the server (parallax/rewrite/placement.py), not the whole table sent
    rows = [n for n in _nodes(graph) if re.search(r'name: ".*/parallax_rows"', n)]
    assert len(rows) == 1 and 'op: "GatherV2"' in rows[0] and f'device: "{SERVER}"' in rows[0], rows
