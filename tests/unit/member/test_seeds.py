"""Every rank's random generators start alike (parallax/member/seeds.py): Python's ``random`` at once, NumPy's
and TensorFlow's when the program imports them; the launcher draws the seed once a job and gives it to every
rank, with one ``PYTHONHASHSEED``. What imports NumPy or TensorFlow runs in a fresh ``python -c`` (this process
has them already)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from parallax.invocation import HASH_SEED_ENV, LAUNCH_ENV, Invocation, LaunchIdentity
from parallax.launch.launcher import job_command, launch_env
from parallax.launch.layout import RankSpec
from parallax.member.seeds import job_seed

RANKS = (RankSpec("localhost", None, 0), RankSpec("localhost", None, 1))


def _fresh(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_generators_a_program_imports_after_the_seed_draw_as_if_it_had_seeded_them_after_its_imports():
    seeded = _fresh("""
        import json, random, sys
        from parallax.member.seeds import seed_alike
        assert "numpy" not in sys.modules and "tensorflow" not in sys.modules
        seed_alike(1234)
        python = random.random()
        import numpy as np
        import tensorflow as tf
        ds = tf.data.Dataset.range(20).shuffle(20)  # no seed of its own
        print(json.dumps({"python": python, "numpy": np.random.rand(3).tolist(),
                          "tf": tf.random.uniform([3]).numpy().tolist(), "order": [int(v) for v in ds]}))
    """)
    reference = _fresh("""
        import json, random
        import numpy as np
        import tensorflow as tf
        import keras
        keras.utils.set_random_seed(1234)  # what the program would write to draw alike on every run (after
        # importing Keras, whose import draws from Python's random: a program importing only TensorFlow here)
        python = random.random()
        ds = tf.data.Dataset.range(20).shuffle(20)
        print(json.dumps({"python": python, "numpy": np.random.rand(3).tolist(),
                          "tf": tf.random.uniform([3]).numpy().tolist(), "order": [int(v) for v in ds]}))
    """)
    assert seeded == reference


def test_a_seed_the_program_sets_itself_replaces_the_jobs():
    seeded = _fresh("""
        import json
        from parallax.member.seeds import seed_alike
        seed_alike(1234)
        import numpy as np
        import tensorflow as tf
        tf.random.set_seed(7); np.random.seed(7)
        print(json.dumps({"numpy": np.random.rand(2).tolist(), "tf": tf.random.uniform([2]).numpy().tolist()}))
    """)
    own = _fresh("""
        import json
        import numpy as np
        import tensorflow as tf
        tf.random.set_seed(7); np.random.seed(7)
        print(json.dumps({"numpy": np.random.rand(2).tolist(), "tf": tf.random.uniform([2]).numpy().tolist()}))
    """)
    assert seeded == own


def test_the_launcher_gives_every_rank_the_jobs_seed_and_one_hash_seed():
    assert len({job_seed() for _ in range(8)}) > 1 and all(0 <= job_seed() < 2**31 for _ in range(8))
    job = {"layout": "MPI", "digest": "d", "gpus": 0, "seed": 4321}
    assert Invocation.from_env(launch_env(RANKS, job, "/j")).launch.seed == 4321
    assert LaunchIdentity.from_json(LaunchIdentity("[]").to_json()).seed is None
    command, _ = job_command(RANKS, job, ["prog.py"], "", "/tmp/job", invocation=Invocation.from_env({}))
    assert command.env[HASH_SEED_ENV] == "4321" and f"{HASH_SEED_ENV}" in command.argv
    assert json.loads(command.env[LAUNCH_ENV])["job"]["seed"] == 4321
    own = Invocation.from_env({HASH_SEED_ENV: "0"})  # the user's own: handed to every rank as it is
    assert job_command(RANKS, job, ["prog.py"], "", "/tmp/job", invocation=own)[0].env[HASH_SEED_ENV] == "0"
