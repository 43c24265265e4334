import ast
import os

import pytest
import tensorflow as tf

import parallax
from tests.package import PACKAGE, package_modules


def test_defaults_follow_the_seed_api():
    cfg = parallax.Config()
    assert cfg.run_option is None  # HYBRID in force (tests/unit/job/test_settings.py)
    assert cfg.average_sparse is None and cfg.sess_config is None and cfg.redirect_path is None
    assert cfg.search_partitions is False
    ps = cfg.communication_config.ps_config
    assert (ps.protocol, ps.replicate_variables, ps.local_aggregation, ps.boundary_among_servers,
            ps.boundary_between_workers_and_servers) == ("grpc", True, True, True, True)
    mpi = cfg.communication_config.mpi_config
    assert (mpi.use_allgatherv, mpi.mpirun_options) == (False, "")
    assert cfg.ckpt_config == parallax.CheckPointConfig()
    assert cfg.profile_config == parallax.ProfileConfig()


def test_parallax_config_is_config():
    assert parallax.ParallaxConfig is parallax.Config


def test_no_shared_mutable_defaults():
    a, b = parallax.Config(), parallax.Config()
    a.communication_config.ps_config.protocol = "grpc+verbs"
    assert b.communication_config.ps_config.protocol == "grpc"
    assert parallax.CommunicationConfig().ps_config is not parallax.CommunicationConfig().ps_config


def test_seed_example_assignments_work():
    ckpt = parallax.CheckPointConfig(ckpt_dir="/tmp/ckpt", save_ckpt_steps=100)
    ps = parallax.PSConfig(replicate_variables=False, protocol="grpc", local_aggregation=True,
                           boundary_among_servers=False, boundary_between_workers_and_servers=True)
    mpi = parallax.MPIConfig(use_allgatherv=True, mpirun_options=["-mca", "btl", "^openib"])
    cfg = parallax.Config()
    cfg.run_option = "ps"
    cfg.average_sparse = False
    cfg.redirect_path = "/tmp/logs"
    cfg.search_partitions = True
    cfg.communication_config = parallax.CommunicationConfig(ps, mpi)
    cfg.ckpt_config = ckpt
    cfg.profile_config = parallax.ProfileConfig(profile_dir="/tmp/profile", profile_steps=[100, 200, 300])
    cfg.sess_config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    cfg.validate()
    assert cfg.run_option == "PS"
    assert cfg.communication_config.mpi_config.mpirun_options == "-mca btl ^openib"


@pytest.mark.parametrize("build, error, pattern", [
    (lambda: parallax.Config(run_option="FOO"), ValueError, r"run_option is 'FOO'; allowed: PS, MPI, HYBRID"),
    (lambda: parallax.Config(run_option=("PS",)), TypeError, r"stray trailing comma"),
    (lambda: parallax.Config(run_option=3), TypeError, r"Config.run_option must be one of"),
    (lambda: parallax.Config(average_sparse="yes"), TypeError, r"Config.average_sparse must be True, False or None"),
    (lambda: parallax.Config(sess_config={}), TypeError, r"Config.sess_config must be a tf.compat.v1.ConfigProto"),
    (lambda: parallax.Config(ckpt_config="dir"), TypeError, r"Config.ckpt_config must be a parallax.CheckPointConfig"),
    (lambda: parallax.CommunicationConfig(ps_config=parallax.MPIConfig()), TypeError,
     r"CommunicationConfig.ps_config must be a parallax.PSConfig"),
    (lambda: parallax.PSConfig(protocol="http"), ValueError, r"PSConfig.protocol is 'http'"),
    (lambda: parallax.PSConfig(num_servers=0), ValueError, r"PSConfig.num_servers must be a positive int or None"),
    (lambda: parallax.PSConfig(num_servers="2"), TypeError, r"PSConfig.num_servers must be a positive int or None"),
    (lambda: parallax.MPIConfig(mpirun_options=5), TypeError, r"MPIConfig.mpirun_options must be a string or a list"),
    (lambda: parallax.CheckPointConfig(save_ckpt_steps=0), ValueError, r"save_ckpt_steps must be a positive int"),
    (lambda: parallax.CheckPointConfig("/d", save_ckpt_steps=10, save_ckpt_secs=5), ValueError,
     r"set save_ckpt_steps or save_ckpt_secs, not both"),
    (lambda: parallax.CheckPointConfig(save_ckpt_steps=10), ValueError, r"need ckpt_dir"),
    (lambda: parallax.ProfileConfig("/p", profile_steps=[1], profile_range=(1, 3)), ValueError,
     r"set profile_steps or profile_range, not both"),
    (lambda: parallax.ProfileConfig("/p", profile_range=(5, 2)), ValueError, r"0 <= start < end"),
    (lambda: parallax.ProfileConfig("/p", profile_steps=[1, -2]), ValueError, r"non-negative ints"),
    (lambda: parallax.ProfileConfig(profile_steps=[1]), ValueError, r"need profile_dir"),
    (lambda: parallax.ProfileConfig(profile_worker=-1), ValueError, r"profile_worker must be a worker id"),
    (lambda: parallax.CommunicationConfig(compression="int8"), ValueError,
     r"CommunicationConfig.compression is str 'int8'; allowed: 'none', 'fp16', 'bf16', 'auto'"),
], ids=["unknown-run-option", "tuple-run-option", "int-run-option", "non-bool", "sess-config-type",
        "ckpt-config-type", "ps-config-type", "protocol", "num-servers-zero", "num-servers-str", "mpirun-options",
        "ckpt-steps-zero",
        "ckpt-both", "ckpt-no-dir", "profile-both", "profile-range-order", "profile-negative-step",
        "profile-no-dir", "profile-worker", "compression"])
def test_invalid_values_raise_naming_the_field(build, error, pattern):
    with pytest.raises(error, match=pattern):
        build()


def test_compression_takes_its_names_parallax_compression_and_horovods_compressors():
    class FP16Compressor:  # the class hvd.Compression.fp16 is
        pass

    class NoneCompressor:
        pass

    assert parallax.CommunicationConfig().compression == "none"
    assert parallax.CommunicationConfig(compression=None).compression == "none"
    assert parallax.CommunicationConfig(compression="BF16").compression == "bf16"
    assert parallax.CommunicationConfig(compression=parallax.Compression.fp16).compression == "fp16"
    assert parallax.CommunicationConfig(compression=FP16Compressor).compression == "fp16"
    assert parallax.CommunicationConfig(compression=NoneCompressor).compression == "none"


def test_assignment_is_checked_at_once():
    cfg = parallax.Config()
    with pytest.raises(ValueError, match="run_option"):
        cfg.run_option = "ALLREDUCE"
    with pytest.raises(AttributeError, match="Config has no field 'run_opton'"):
        cfg.run_opton = "PS"


@pytest.mark.parametrize("run_option", ["MPI", "HYBRID", "AUTO"])
def test_async_needs_ps(run_option):
    with pytest.raises(ValueError, match=r"sync=False needs run_option='PS'"):
        parallax.Config(run_option=run_option).validate(sync=False)
    parallax.Config(run_option="PS").validate(sync=False)


def test_profile_steps_are_sorted_and_unique():
    assert parallax.ProfileConfig("/p", profile_steps=[30, 10, 10]).profile_steps == (10, 30)


def test_to_dict_is_plain_data():
    d = parallax.Config(run_option="MPI").to_dict()
    assert d["run_option"] == "MPI"
    assert d["communication_config"]["ps_config"]["protocol"] == "grpc"


def test_parallax_log_is_the_original_s_logger_and_parallax_logs_through_it():
    import logging

    import parallax
    from parallax.api import logger

    assert parallax.log is logging.getLogger("PARALLAX") and logger is parallax.log
    builds = []  # every module logs through parallax.log: only parallax/logs.py asks logging for a logger
    for path in package_modules("logs.py"):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        builds += [f"{os.path.relpath(path, PACKAGE)}:{n.lineno}" for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and n.attr == "getLogger"]
    assert builds == []


def test_parallax_warnings_show_whatever_level_the_root_logger_is_at(parallax_warnings):
    import logging

    import parallax

    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.ERROR)  # as absl.logging.set_verbosity("error") does
    try:
        parallax.log.warning("still said")
        parallax.log.info("not said")
    finally:
        root.setLevel(before)
    assert parallax_warnings == ["still said"]
