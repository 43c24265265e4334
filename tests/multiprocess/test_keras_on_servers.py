"""A parameter server's part of a Keras 3 model, as fast as it can be: in PS and HYBRID jobs on one host the
chief's graph runs each Adam update the servers hold as one ``ParallaxFusedUpdate`` op on the server (which loaded
the op when it started; parallax/rewrite/fused_updates.py), the Embedding's rows are gathered on the server (it
used to send the whole table to every worker every step; parallax/rewrite/placement.py), and training equals
``model.fit`` on one device: every weight and every Adam slot, on every worker (rtol 1e-5)."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, run_script
from tests.tf2.keras_on_servers_script import data, trained_values

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "keras_on_servers_script.py")
SERVER = "/job:ps/replica:0/task:0/device:CPU:0"


def _nodes(graph: str) -> list[str]:
    """The text of each op of ``graph`` (a worker's exported graph)."""
    return re.findall(r"\n  node \{\n(.*?)\n  \}", graph, re.S)


def _fused_on_the_server(graph: str) -> set[str]:
    """The variables whose update ``graph`` (a worker's exported graph) runs as one op on the server."""
    found = set()
    for node in _nodes(graph):
        if 'op: "ParallaxFusedUpdate"' in node and f'device: "{SERVER}"' in node:
            found.add(re.search(r'name: "parallax_fused/(.*)/update"', node).group(1))
    return found


@pytest.mark.parametrize("layout", ["PS-2", "HYBRID-2"])
def test_a_servers_updates_run_fused_and_its_rows_are_gathered_on_it_and_training_is_model_fits(tmp_path, layout):
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
            assert len([k for k in got.files if k.startswith("v")]) == len(expected)
            trained = {str(name) for name in got["trainable"]}  # the script's names (Keras names by what it built)
            for i, value in enumerate(expected):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-7, err_msg=f"{layout} rank {rank}: "
                                           f"{(reference.weights + reference.optimizer.variables)[i].path}")
    with open(os.path.join(run.out_dir, "graphs", "worker-0_metagraph"), encoding="utf-8") as f:
        graph = f.read()
    fused = _fused_on_the_server(graph)
    assert fused == (trained if run_option == "PS" else {n for n in trained if n.endswith("/embeddings")}), fused
    # the Embedding's rows gathered on the server (parallax/rewrite/placement.py), not the whole table sent
    rows = [n for n in _nodes(graph) if re.search(r'name: ".*/parallax_rows"', n)]
    assert len(rows) == 1 and 'op: "GatherV2"' in rows[0] and f'device: "{SERVER}"' in rows[0], rows
