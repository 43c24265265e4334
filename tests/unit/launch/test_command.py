import os

import pytest

from parallax.errors import LaunchError
from parallax.launch.command import SESSION_DIR_ENV, build_mpirun_command
from parallax.launch.layout import RankSpec, hybrid_ranks, layout_from_json, layout_to_json, ranks_per_device
from parallax.resources.cluster import Role
from parallax.resources.files import Device, parse_resource_text

LOCAL = frozenset({"localhost", "vm"})


def ranks(text):
    return ranks_per_device(parse_resource_text(text))


def test_one_rank_per_device_hosts_kept_together():
    layout = ranks("a: 0,1\nb\na: 2\n")
    assert [(r.host, r.device) for r in layout] == [("a", Device("gpu", 0)), ("a", Device("gpu", 1)),
                                                    ("a", Device("gpu", 2)), ("b", None)]
    assert layout_from_json(layout_to_json(layout)) == layout


def test_roles_travel_as_their_names_and_come_back_as_roles():
    layout = hybrid_ranks(parse_resource_text("a: 0\n"))
    assert '"role": "ps"' in layout_to_json(layout)
    assert [r.role for r in layout_from_json(layout_to_json(layout))] == [Role.WORKER, Role.PS]
    assert all(isinstance(r.role, Role) for r in layout_from_json(layout_to_json(layout)))


def test_local_job_argv():
    cmd = build_mpirun_command("/v/bin/mpirun", "/v/bin/python", ["/x/train.py", "--steps", "3"],
                               ranks("localhost: cpu:0,cpu:1,cpu:2\n"), local_hosts=LOCAL, cpu_count=2,
                               is_root=True, parallax_env={"PARALLAX_LAUNCH": "{}"},
                               environ={"PYTHONPATH": "/p", "HOME": "/root"})
    assert list(cmd.argv) == [
        "/v/bin/mpirun", "-np", "3", "--host", "localhost:3", "--map-by", "slot", "--bind-to", "none",
        "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_tcp_if_include", "lo",
        "-x", "PARALLAX_LAUNCH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL=1",
        "/v/bin/python", "-m", "parallax.member.entry", "/x/train.py", "--steps", "3"]
    assert cmd.env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                       "PARALLAX_LAUNCH": "{}"}


def test_remote_hosts_user_options_and_module_programs():
    cmd = build_mpirun_command("mpirun", "python", ["-m", "pkg.train"], ranks("h1: 0,1\nh2: 0\n"),
                               local_hosts=LOCAL, cpu_count=8, is_root=False,
                               user_options="--mca btl ^openib -x NCCL_DEBUG")
    program = ["python", "-m", "parallax.member.entry", "-m", "pkg.train"]
    assert list(cmd.argv) == [
        "mpirun", "--host", "h1:2,h2:1", "--map-by", "slot", "--bind-to", "none", "-x", "TF_CPP_MIN_LOG_LEVEL=1",
        "--mca", "btl", "^openib", "-x", "NCCL_DEBUG",
        "-np", "1", "env", "CUDA_VISIBLE_DEVICES=0", *program, ":",
        "-np", "1", "env", "CUDA_VISIBLE_DEVICES=1", *program, ":",
        "-np", "1", "env", "CUDA_VISIBLE_DEVICES=0", *program]
    assert cmd.env == {}


def test_the_ranks_run_with_tensorflows_info_lines_off_unless_the_user_chose_a_level():
    def level(environ):
        argv = list(build_mpirun_command("mpirun", "python", ["t.py"], ranks("localhost: cpu:0,cpu:1\n"),
                                         local_hosts=LOCAL, cpu_count=2, is_root=False, environ=environ).argv)
        return [a for a in argv if a.startswith("TF_CPP_MIN_LOG_LEVEL")]

    assert level({}) == ["TF_CPP_MIN_LOG_LEVEL=1"]
    assert level({"TF_CPP_MIN_LOG_LEVEL": "0"}) == ["TF_CPP_MIN_LOG_LEVEL"]  # theirs, forwarded


def job_ranks(text, gpus, run_option):
    """The ranks of the job plan ``parallax-run`` would launch, on hosts with ``gpus`` (fake) GPUs."""
    from parallax.analysis import analyse_graph
    from parallax.config import Config
    from parallax.job.plan import make_job_plan
    from parallax.job.settings import derive
    from tests.models import build_embedding

    cluster = parse_resource_text(text, "res")
    settings = derive(Config(run_option=run_option), True, cluster, gpus=gpus, cpu_count=8)
    return make_job_plan(cluster, settings, analyse_graph(build_embedding("adam").graph)).ranks


def contexts(argv):
    """Each mpirun application context of ``argv``: (its rank count, its CUDA_VISIBLE_DEVICES)."""
    out, i = [], argv.index("-np")
    while i < len(argv):
        assert argv[i + 2] == "env" and argv[i + 3].startswith("CUDA_VISIBLE_DEVICES=")
        out.append((int(argv[i + 1]), argv[i + 3].split("=", 1)[1]))
        i = argv.index(":", i) + 1 if ":" in argv[i:] else len(argv)
    return out


@pytest.mark.parametrize("run_option, expected", [
    ("MPI", [(1, "0"), (1, "1"), (1, "2"), (1, "3"), (1, "0"), (1, "1"), (1, "2"), (1, "3")]),
    ("HYBRID", [(1, "0"), (1, "1"), (1, "2"), (1, "3"), (1, ""), (1, "0"), (1, "1"), (1, "2"), (1, "3"), (1, "")]),
    ("PS", [(1, "0,1,2,3"), (1, ""), (1, "0,1,2,3"), (1, "")]),
], ids=["mpi", "hybrid", "ps"])
def test_each_rank_of_bare_gpu_hosts_is_given_its_own_gpus_before_it_starts(run_option, expected):
    ranks = job_ranks("hostA\nhostB", 4, run_option)
    argv = list(build_mpirun_command("mpirun", "python", ["t.py"], ranks, local_hosts=LOCAL, cpu_count=8,
                                     is_root=False, environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).argv)
    assert contexts(argv) == expected  # a server (PS, HYBRID) sees no GPU
    assert argv[argv.index("--host") + 1] == f"hostA:{len(expected) // 2},hostB:{len(expected) // 2}"
    assert "CUDA_VISIBLE_DEVICES" not in argv  # the launcher's own is not forwarded (-x) as well


def test_consecutive_ranks_with_the_same_gpus_share_one_application_context():
    layout = (RankSpec("a", (Device("gpu", 0),), 1), RankSpec("a", None, 0, "ps"), RankSpec("b", None, 0, "ps"))
    argv = build_mpirun_command("mpirun", "python", ["t.py"], layout, local_hosts=LOCAL, cpu_count=8,
                                is_root=False).argv
    assert contexts(list(argv)) == [(1, "0"), (2, "")]


def test_without_gpus_nothing_is_set_and_the_launchers_variable_is_forwarded():
    argv = build_mpirun_command("mpirun", "python", ["t.py"], job_ranks("hostA\nhostB", 0, "MPI"),
                                local_hosts=LOCAL, cpu_count=8, is_root=False,
                                environ={"CUDA_VISIBLE_DEVICES": ""}).argv
    assert argv[:3] == ("mpirun", "-np", "2") and "env" not in argv and ":" not in argv
    assert argv[argv.index("CUDA_VISIBLE_DEVICES") - 1] == "-x"


def test_gpu_ids_count_within_the_launchers_own_visible_devices():
    layout = ranks("a: 0,1\n")
    argv = build_mpirun_command("mpirun", "python", ["t.py"], layout, local_hosts=LOCAL, cpu_count=8,
                                is_root=False, environ={"CUDA_VISIBLE_DEVICES": "6,7"}).argv
    assert contexts(list(argv)) == [(1, "6"), (1, "7")]
    with pytest.raises(LaunchError, match=r"^rank 1 \(on host a\) is given GPU 1, but CUDA_VISIBLE_DEVICES='6' "
                                          r"here lists 1 GPU\(s\), within which the resource file's GPU ids count"):
        build_mpirun_command("mpirun", "python", ["t.py"], layout, local_hosts=LOCAL, cpu_count=8, is_root=False,
                             environ={"CUDA_VISIBLE_DEVICES": "6"})


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


@pytest.mark.parametrize("tuned", [{"run_option": "MPI", "fusion_bytes": 67108864, "backend": "mpi"}, None])
def test_the_ranks_environment_holds_the_tuned_choice_the_launcher_hands_them(monkeypatch, tuned):
    """mpirun's ``-x NAME`` passes on what mpirun's own environment holds (the launcher's, with the command's
    variables: :func:`parallax.launch.runner.run_job`): a tuned choice only in the list of names reached no rank,
    whose job plan then differed from the launcher's (the tuned MPI layout of tests/trials/test_tune.py)."""
    from parallax.invocation import TUNED_ENV, Invocation
    from parallax.launch.launcher import job_command

    monkeypatch.setenv(TUNED_ENV, '{"run_option": "PS"}')  # the launcher's own (a rank's, say): not handed on
    command, _ = job_command(ranks("localhost: cpu:0,cpu:1\n"), {"layout": "MPI"}, ["/x/train.py"], "", "/j",
                             tuned=tuned)
    argv = list(command.argv)
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert (TUNED_ENV in forwarded) == (tuned is not None)
    if tuned is not None:  # the rank's environment as mpirun starts it
        assert Invocation.from_env({**os.environ, **command.env}).tuned == tuned


@pytest.mark.parametrize("text, cores, expected", [
    ("localhost: cpu:0,cpu:1\n", 2, ["--map-by", "slot:PE=1", "--bind-to", "core"]),  # a core each
    ("localhost: cpu:0,cpu:1\n", 8, ["--map-by", "slot:PE=4", "--bind-to", "core"]),  # its share of the cores
    ("localhost: cpu:0\n", 2, ["--map-by", "slot:PE=2", "--bind-to", "core"]),
    ("localhost: cpu:0,cpu:1,cpu:2\n", 2, ["--map-by", "slot", "--bind-to", "none"]),  # more ranks than cores
    ("h1: 0,1\nh2: 0\n", 8, ["--map-by", "slot", "--bind-to", "none"]),  # other hosts' cores are not known here
], ids=["one-core-each", "shares", "alone", "oversubscribed", "other-hosts"])
def test_ranks_of_a_job_on_this_machine_are_bound_to_their_share_of_its_cores(text, cores, expected):
    argv = list(build_mpirun_command("mpirun", "python", ["t.py"], ranks(text), local_hosts=LOCAL,
                                     cpu_count=cores, is_root=False).argv)
    at = argv.index("--map-by")
    assert argv[at:at + 4] == expected and argv.count("--bind-to") == 1


@pytest.mark.parametrize("options, ours, theirs", [
    ("--bind-to numa", ["--map-by", "slot"], "--bind-to"),
    ("--map-by ppr:1:core", ["--bind-to", "none"], "--map-by"),
    ("-bind-to=socket --report-bindings", ["--map-by", "slot"], "-bind-to=socket"),
])
def test_a_placement_the_user_gives_replaces_ours(options, ours, theirs):
    argv = list(build_mpirun_command("mpirun", "python", ["t.py"], ranks("localhost: cpu:0,cpu:1\n"),
                                     local_hosts=LOCAL, cpu_count=2, is_root=False, user_options=options).argv)
    assert argv[argv.index(ours[0]):argv.index(ours[0]) + 2] == ours
    assert argv.count(ours[0]) == 1 and argv.count(theirs) == 1  # theirs once, as given
