import pytest

from parallax.errors import ResourceFileError
from parallax.resources.files import Device, parse_resource_file, parse_resource_text


def test_seed_format_with_gpus_comments_and_blank_lines():
    cluster = parse_resource_text("# my cluster\n\n12.34.56.78: 0,1,2,3\n12.34.56.79: 0, 1  # two\n")
    assert [w.host for w in cluster.workers] == ["12.34.56.78", "12.34.56.79"]
    assert cluster.workers[0].devices == tuple(Device("gpu", i) for i in range(4))
    assert cluster.workers[1].devices == (Device("gpu", 0), Device("gpu", 1))
    assert cluster.workers[1].line == 4
    assert not cluster.explicit_roles and cluster.servers == ()


def test_bare_host_leaves_devices_to_the_host():
    cluster = parse_resource_text("localhost\n")
    assert cluster.workers[0].devices is None


def test_cpu_devices():
    cluster = parse_resource_text("localhost: cpu:0,cpu:1\n")
    assert cluster.workers[0].devices == (Device("cpu", 0), Device("cpu", 1))
    assert cluster.workers[0].devices[1].tf_name == "/device:CPU:1"


def test_same_host_on_several_lines_means_several_workers():
    cluster = parse_resource_text("h1: 0\nh1: 1\nh2\n")
    assert len(cluster.workers) == 3
    assert len(cluster.workers_on("h1")) == 2
    assert cluster.hosts == ("h1", "h2")


def test_ipv6_host_in_brackets():
    cluster = parse_resource_text("[::1]: cpu:0\n")
    assert cluster.workers[0].host == "[::1]"


def test_explicit_role_file_like_seed_000():
    text = ("ps,ps1.example.com,1024,\nps,ps2.example.com,1024,\nworker,worker1.example.com,1024,0\n"
            "worker,worker1.example.com,1025,1\nworker,worker2.example.com,1024,0\n")
    cluster = parse_resource_text(text)
    assert cluster.explicit_roles
    assert [(s.host, s.port) for s in cluster.servers] == [("ps1.example.com", 1024), ("ps2.example.com", 1024)]
    assert [(w.host, w.port, w.devices) for w in cluster.workers] == [
        ("worker1.example.com", 1024, (Device("gpu", 0),)),
        ("worker1.example.com", 1025, (Device("gpu", 1),)),
        ("worker2.example.com", 1024, (Device("gpu", 0),))]


def test_explicit_role_worker_without_device_and_cpu_device():
    cluster = parse_resource_text("worker,localhost,2222,\nworker,localhost,2223,cpu:1\n")
    assert cluster.workers[0].devices is None
    assert cluster.workers[1].devices == (Device("cpu", 1),)


@pytest.mark.parametrize("text, line, pattern", [
    ("10.0.0.7: 0,1,x\n", 1, r'has device id "x"; GPU ids must be integers'),
    ("a\nb: 0,,1\n", 2, r"has an empty device id"),
    ("a:\n", 1, r"has an empty device id"),
    ("a: 0,0\n", 1, r"lists gpu:0 twice"),
    ("a: 0\na: 0\n", 2, r"uses gpu:0 of a, already used on line 1"),
    ("bad host: 0\n", 1, r'invalid host name "bad host"'),
    ("a: 0\nworker,b,1,0\n", 2, r"explicit-role line, but the file started in the host-per-line format"),
    ("ps,h,1024,\nh: 0\n", 2, r"has 1 comma-separated fields, not 4"),
    ("ps,h,1024,0\nworker,h,1025,0\n", 1, r'gives a parameter server the device "0"'),
    ("worker,h,abc,0\n", 1, r'has port "abc"'),
    ("worker,h,70000,0\n", 1, r'has port "70000"'),
    ("worker,h,1,0\nworker,h,1,1\n", 2, r"reuses h:1, already on line 1"),
    ("worker,h,1,x\n", 1, r'has device "x"'),
    ("boss,h,1,0\nworker,h,2,0\n", 1, r"has role \"boss\"; roles are ps and worker"),
], ids=["letter-id", "empty-id", "empty-list", "duplicate-id", "device-on-two-lines", "bad-host",
        "mixed-formats", "role-then-seed", "ps-with-device", "port-not-number", "port-range",
        "duplicate-address", "bad-role-device", "unknown-role"])
def test_bad_lines_name_the_file_and_line(text, line, pattern):
    with pytest.raises(ResourceFileError, match=pattern) as info:
        parse_resource_text(text, source="res.txt")
    if line is not None:
        assert str(info.value).startswith(f"res.txt, line {line}: ")
    assert "Expected" in str(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_text("# nothing\n\n")
    with pytest.raises(ResourceFileError, match=rf"^{path}: no hosts found"):
        parse_resource_file(path)


def test_role_file_without_workers():
    with pytest.raises(ResourceFileError, match="has no worker line"):
        parse_resource_text("ps,h,1,\n", source="c")


def test_missing_file(tmp_path):
    with pytest.raises(ResourceFileError, match="resource file not found"):
        parse_resource_file(tmp_path / "nope")


def test_shipped_example_parses():
    import pathlib

    example = pathlib.Path(__file__).resolve().parents[3] / "resource_info.example"
    cluster = parse_resource_file(example)
    assert cluster.workers[0].devices == (Device("cpu", 0), Device("cpu", 1))
