"""Issue 16's scale evidence as a test: benchmarks/scale.py on two virtual hosts (bytes, not speed).

At 4 workers (half on each host; make bench-scale adds 2) in PS, MPI, HYBRID and AUTO, the bytes each host sends
inside and between hosts are counted and set beside the plan's traffic model: every target
(HYBRID no worse between hosts than the better of PS and MPI, the model within 10 %, AUTO
within 10 % of the cheapest it weighs) must be met. Bytes do not depend on the speed of the shared cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.multiprocess.harness import ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess, pytest.mark.slow]


# Four jobs of 4 workers on the virtual cluster (2 per host, where host aggregation and HYBRID's saving show; the
# 2-worker jobs of make bench-scale added 2 minutes and nothing the 4-worker ones do not check): about 140 s
# alone. It counts bytes, which the load does not change.
@pytest.mark.timeout(1300)
def test_bytes_between_hosts_match_the_model_and_hybrid_sends_the_fewest(tmp_path, cluster_possible):
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "scale.py"), "--quick", "--ranks", "4",
                             "--steps", "10", "--timeout", "300", "--out_dir", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    try:
        stdout, stderr = proc.communicate(timeout=1200)
    finally:  # out of time (here or pytest's): SIGINT first, so that its virtual cluster is taken down
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    data = json.loads((out / "scale.json").read_text())
    assert {(r["ranks"], r["system"]) for r in data["rows"] if "error" not in r} == \
        {(4, s) for s in ("parallax-ps", "parallax-mpi", "parallax-hybrid", "parallax-auto")}
    assert data["verdicts"] and all(ok for _, ok in data["verdicts"])
    at4 = {r["system"]: r for r in data["rows"] if r["ranks"] == 4}
    assert at4["parallax-hybrid"]["ran_as"] == "HYBRID"
    # the servers save this model less time than their chain costs a step (parallax.plan.cost): AUTO runs as MPI
    assert at4["parallax-auto"]["ran_as"] == "MPI"
    assert at4["parallax-hybrid"]["crossing"] < at4["parallax-ps"]["crossing"]
    assert (out / "scale.png").stat().st_size > 0
