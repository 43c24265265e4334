from parallax.launch.command import SESSION_DIR_ENV, build_mpirun_command
from parallax.launch.layout import RankSpec, layout_from_json, layout_to_json, ranks_per_device
from parallax.resources import Device, parse_resource_text

LOCAL = frozenset({"localhost", "vm"})


def ranks(text):
    return ranks_per_device(parse_resource_text(text))


def test_one_rank_per_device_hosts_kept_together():
    layout = ranks("a: 0,1\nb\na: 2\n")
    assert [(r.host, r.device) for r in layout] == [("a", Device("gpu", 0)), ("a", Device("gpu", 1)),
                                                    ("a", Device("gpu", 2)), ("b", None)]
    assert layout_from_json(layout_to_json(layout)) == layout


def test_local_job_argv():
    cmd = build_mpirun_command("/v/bin/mpirun", "/v/bin/python", ["/x/train.py", "--steps", "3"],
                               ranks("localhost: cpu:0,cpu:1,cpu:2\n"), local_hosts=LOCAL, cpu_count=2,
                               is_root=True, parallax_env={"PARALLAX_LAUNCH": "{}"},
                               environ={"PYTHONPATH": "/p", "HOME": "/root"})
    assert list(cmd.argv) == [
        "/v/bin/mpirun", "-np", "3", "--host", "localhost:3", "--map-by", "slot", "--bind-to", "none",
        "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_tcp_if_include", "lo",
        "-x", "PARALLAX_LAUNCH", "-x", "PYTHONPATH",
        "/v/bin/python", "-m", "mpi4py", "/x/train.py", "--steps", "3"]
    assert cmd.env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       "PARALLAX_LAUNCH": "{}"}


def test_remote_hosts_user_options_and_module_programs():
    cmd = build_mpirun_command("mpirun", "python", ["-m", "pkg.train"], ranks("h1: 0,1\nh2: 0\n"),
                               local_hosts=LOCAL, cpu_count=8, is_root=False,
                               user_options="--mca btl ^openib -x NCCL_DEBUG")
    assert list(cmd.argv) == [
        "mpirun", "-np", "3", "--host", "h1:2,h2:1", "--map-by", "slot", "--bind-to", "none",
        "--mca", "btl", "^openib", "-x", "NCCL_DEBUG", "python", "-m", "mpi4py", "-m", "pkg.train"]
    assert cmd.env == {}


def test_rank_spec_is_plain_data():
    assert RankSpec("h", None, 3) == RankSpec("h", None, 3, "worker")


def test_as_many_ranks_as_cores_yield_without_oversubscribing():
    def argv(num_ranks):
        text = "localhost: " + ",".join(f"cpu:{i}" for i in range(num_ranks)) + "\n"
        return " ".join(build_mpirun_command("mpirun", "python", ["t.py"], ranks(text), local_hosts=LOCAL,
                                             cpu_count=2, is_root=False).argv)

    assert "yield" not in argv(1) and "oversubscribe" not in argv(1)
    assert "--mca mpi_yield_when_idle 1" in argv(2) and "oversubscribe" not in argv(2)
    assert "--oversubscribe --mca mpi_yield_when_idle 1" in argv(3)


def test_each_job_has_its_own_session_directory_unless_the_user_chose_one():
    def env(**kwargs):
        return build_mpirun_command("mpirun", "python", ["t.py"], ranks("h1: 0\nh2: 0\n"), local_hosts=LOCAL,
                                    cpu_count=8, is_root=False, session_dir="/tmp/parallax_job_x/mpi", **kwargs).env

    assert env() == {SESSION_DIR_ENV: "/tmp/parallax_job_x/mpi"}
    assert env(user_options="--prtemca prte_tmpdir_base /scratch") == {}
    assert env(environ={"PRTE_MCA_prte_tmpdir_base": "/scratch"}) == {}
