"""The elastic launcher's decisions (parallax/launch/elastic.py), with the job's attempts faked: which failures
restart the job, on which resources, what is logged, and what ends it."""

from __future__ import annotations

import signal

import pytest

from parallax.cli import _elastic_options, _parser
from parallax.config import CheckPointConfig, ElasticConfig
from parallax.errors import LaunchError, TaskFailedError
from parallax.launch.elastic import (
    checkpoint_from_text,
    checkpoint_to_text,
    discover_hosts,
    elastic_checkpoints,
    elastic_from_text,
    run_elastic,
    surviving_cluster,
    worker_count,
)
from parallax.launch.runner import JobResult
from parallax.resources.files import parse_resource_text

THREE = parse_resource_text("a: cpu:0\nb: cpu:0\nc: cpu:0\n", source="resource_info")


def failed(rank: int, host: str) -> JobResult:
    return JobResult(137, TaskFailedError(f"Parallax job failed: rank {rank} on host {host} was killed by signal 9",
                                        rank=rank, host=host))


class Attempts:
    """Fakes ``start``: each call returns the next result and records the resources it was given."""

    def __init__(self, *results: JobResult) -> None:
        self.results = list(results)
        self.given = []

    def __call__(self, cluster):
        self.given.append(cluster)
        return self.results.pop(0)


def elastic_run(attempts, answering=("a", "b", "c"), **fields):
    logged = []
    result = run_elastic(THREE, ElasticConfig(**{"max_restarts": 2, **fields}), "/ckpt", attempts, ["train.py"],
                         log=logged.append, answers=lambda hosts, program: set(answering) & set(hosts))
    return result, logged


def test_a_job_that_succeeds_runs_once():
    attempts = Attempts(JobResult(0, None))
    result, logged = elastic_run(attempts)
    assert result.returncode == 0 and len(attempts.given) == 1 and logged == []


def test_a_host_that_no_longer_answers_is_left_out_of_the_restart_and_the_restart_is_logged():
    attempts = Attempts(failed(2, "c"), JobResult(0, None))
    result, logged = elastic_run(attempts, answering=("a", "b"))
    assert result.returncode == 0
    assert [w.host for w in attempts.given[1].workers] == ["a", "b"]
    assert attempts.given[1].from_environment  # the ranks learn the new resources from the launcher
    assert logged[0] == "Parallax elastic: attempt 1 failed: Parallax job failed: rank 2 on host c was killed by " \
                        "signal 9"
    assert logged[1].startswith("Parallax elastic: restart 1 of 2: hosts gone: c; 2 worker(s) (a x1, b x1) "
                                "instead of 3 worker(s) (a x1, b x1, c x1); resuming from the start")


def test_more_failures_than_allowed_end_the_job_naming_every_failure():
    attempts = Attempts(failed(1, "b"), failed(0, "a"), failed(2, "c"))
    result, _ = elastic_run(attempts)
    assert result.returncode == 1  # not the last attempt's 137: a permanent failure, as docs/launching.md says
    text = str(result.failure)
    assert "it failed 3 times and ElasticConfig.max_restarts is 2" in text
    for i, (rank, host) in enumerate([(1, "b"), (0, "a"), (2, "c")], 1):
        assert f"attempt {i}: Parallax job failed: rank {rank} on host {host}" in text


def test_a_job_the_launcher_was_told_to_stop_is_not_restarted():
    attempts = Attempts(JobResult(143, None, signal.SIGTERM, "SIGTERM to the launcher"), JobResult(0, None))
    result, logged = elastic_run(attempts)
    assert result.returncode == 143 and len(attempts.given) == 1 and logged == []


def test_fewer_workers_than_the_minimum_end_the_job():
    attempts = Attempts(failed(2, "c"), JobResult(0, None))
    result, _ = elastic_run(attempts, answering=("a",), min_workers=2)
    assert len(attempts.given) == 1
    assert "1 worker(s) left (b, c gone), fewer than ElasticConfig.min_workers=2" in str(result.failure)


def test_a_job_that_cannot_be_planned_on_what_is_left_ends_with_both_reasons():
    def start(cluster):
        if len(cluster.workers) < 3:
            raise LaunchError("pipeline_stages=3 needs 3 devices")
        return failed(2, "c")

    result = run_elastic(THREE, ElasticConfig(max_restarts=2), None, start, [], log=lambda _: None,
                         answers=lambda hosts, program: {"a", "b"})
    text = str(result.failure)
    assert "the job cannot run on the hosts that are left" in text
    assert "attempt 1: Parallax job failed: rank 2 on host c" in text
    assert "could not start on 2 worker(s) (a x1, b x1): pipeline_stages=3 needs 3 devices" in text


def test_the_resources_left_keep_the_lines_of_the_hosts_that_answer_and_the_caps():
    cluster = parse_resource_text("a: cpu:0,cpu:1\nb\nc: 0,1,2\n")
    assert surviving_cluster(cluster, {"a", "b"}).text == "a: cpu:0,cpu:1\nb\n"
    assert surviving_cluster(cluster, {"a", "b", "c"}, max_workers=4).text == "a: cpu:0,cpu:1\nb\nc: 0\n"
    assert worker_count(cluster) == 6
    explicit = parse_resource_text("ps,a,2222,\nworker,a,2223,cpu:0\nworker,b,2223,cpu:0\n")
    left = surviving_cluster(explicit, {"a"})
    assert [w.host for w in left.workers] == ["a"] and [s.host for s in left.servers] == ["a"]
    moved = surviving_cluster(explicit, set(), [("a", None), ("d", None)])
    assert [w.host for w in moved.workers] == ["a", "d"] and [s.host for s in moved.servers] == ["a", "d"]


def test_discovered_hosts_follow_horovodruns_convention(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho '# spot pool'\necho a:2\necho\necho b\n")
    script.chmod(0o755)
    assert discover_hosts(str(script)) == [("a", 2), ("b", None)]
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho a:2\necho 'b slots=2'\n")
    bad.chmod(0o755)
    with pytest.raises(LaunchError, match=r"line 2: 'b slots=2'; expected 'host' or 'host:slots'"):
        discover_hosts(str(bad))
    failing = tmp_path / "failing.sh"
    failing.write_text("#!/bin/sh\necho no inventory >&2\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(LaunchError, match="exited with code 3: no inventory"):
        discover_hosts(str(failing))


def test_elastic_mode_saves_where_the_program_does_not():
    elastic = ElasticConfig(max_restarts=1)
    own = elastic_checkpoints(CheckPointConfig(ckpt_dir="/mine"), elastic, ["/x/train.py"])
    assert (own.ckpt_dir, own.save_ckpt_secs) == ("/mine", 300.0)
    chosen = elastic_checkpoints(CheckPointConfig(), elastic, ["-m", "pkg.train"], cwd="/runs")
    assert chosen.ckpt_dir == "/runs/parallax_elastic/pkg.train"
    assert checkpoint_from_text(checkpoint_to_text(chosen)) == chosen


def test_parallax_run_options_replace_the_config_and_bad_values_name_the_option():
    args = _parser().parse_args(["-r", "res", "--max-restarts", "3", "--min-np", "2", "train.py"])
    text = _elastic_options(args)
    merged = elastic_from_text(ElasticConfig(max_workers=4), text)
    assert (merged.max_restarts, merged.min_workers, merged.max_workers) == (3, 2, 4)
    assert _elastic_options(_parser().parse_args(["-r", "res", "train.py"])) is None
    with pytest.raises(ValueError, match=r"--max-np \(1\) is below min_workers|max_workers"):
        elastic_from_text(ElasticConfig(), '{"min_workers": 2, "max_workers": 1}')
    with pytest.raises(SystemExit):
        _parser().parse_args(["-r", "res", "--max-restarts", "-1", "train.py"])


def test_the_config_checks_its_fields():
    with pytest.raises(ValueError, match="max_restarts must be an int >= 0"):
        ElasticConfig(max_restarts=-1)
    with pytest.raises(ValueError, match=r"max_workers \(1\) is below min_workers \(2\)"):
        ElasticConfig(min_workers=2, max_workers=1)
    assert not ElasticConfig().enabled and ElasticConfig(max_restarts=1).enabled
