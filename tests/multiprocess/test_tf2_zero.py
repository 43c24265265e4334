"""``zero_stage=1`` with Keras 3's optimizers (parallax/rewrite/zero_regions.py): public Keras 3 programs
(tests/tf2/keras_programs.py) moved onto Parallax on 2 MPI processes, each worker updating its half of every
variable with optimizer slots and of the slots, against the same program's ``model.fit``: every epoch's logs,
every trained weight and every optimizer variable (the slots gathered back into the model at each epoch's end),
on both workers. Adam on tables looked up by ids (a Transformer's position embedding, a recommender's several
tables, a BERT classifier), RMSprop on an LSTM, SGD with momentum and weight averaging (``use_ema``), a custom
``compute_loss`` and two optimizers of a GAN."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, ScriptJobs, selected

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "keras_script.py")
PROGRAMS = ("transformer", "seq2seq", "recommender", "bert", "ema", "distiller", "gan")
CORE = ("transformer",)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, request):
    text, run_option = LAYOUTS["MPI-2"][:2]
    return ScriptJobs(tmp_path_factory, SCRIPT, {"zero": (text, ["--run_option", run_option, "--zero_stage", "1"])},
                      [name for name, in selected(request, "name")])  # make test's: the Transformer alone


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.xdist_group("tf2-zero")]
                                               + [pytest.mark.core] * (n in CORE)) for n in PROGRAMS])
def test_a_keras_3_program_with_sharded_optimizer_state_trains_as_its_model_fit(jobs, name):
    from tests.tf2.keras_programs import single_device_state

    out = jobs.case("zero", name)
    history, weights, slots = single_device_state(name)
    for rank in range(2):
        where = f"zero_stage=1 {name} rank {rank}"
        with np.load(os.path.join(out, f"rank_{rank}.npz")) as got:
            logged = json.loads(str(got["history"]))
            for key, values in history.items():
                np.testing.assert_allclose(logged[key], values, rtol=1e-5, err_msg=f"{where}: {key}")
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6, err_msg=f"{where}: weight {i}")
            assert len([k for k in got.files if k.startswith("s")]) == len(slots), where
            for i, value in enumerate(slots):
                np.testing.assert_allclose(got[f"s{i}"], value, rtol=1e-5, atol=1e-7,
                                           err_msg=f"{where}: optimizer variable {i}")
