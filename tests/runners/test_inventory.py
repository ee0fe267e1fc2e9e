"""HostSpec parsing, inventory files and open_host."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from runners.errors import ConfigError
from runners.inventory import HostSpec, load_inventory, open_host, parse_inventory, parse_inventory_file
from runners.ssh import SSHTransport
from runners.transport import LocalTransport


@pytest.mark.parametrize(
    ("text", "name", "address", "user", "port"),
    [
        ("root@gpu-a:2222", "gpu-a:2222", "gpu-a", "root", 2222),
        ("gpu-a", "gpu-a", "gpu-a", None, None),
        ("ubuntu@127.0.0.2", "127.0.0.2", "127.0.0.2", "ubuntu", None),
        ("me@[fe-alias]:2200", "fe-alias:2200", "fe-alias", "me", 2200),
        ("local", "local", "local", None, None),
    ],
)
def test_parse_host_strings(text: str, name: str, address: str, user: str | None, port: int | None) -> None:
    spec = HostSpec.parse(text)
    assert (spec.name, spec.address, spec.user, spec.port) == (name, address, user, port)
    assert spec.runs_root == "~/.servetune/runs"
    assert spec.accept_new_host_key is False


@pytest.mark.parametrize("text", ["", "root@", "@gpu", "gpu:port", "gpu:0", "gpu:70000", "[gpu", "two words"])
def test_parse_rejects_bad_strings_with_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        HostSpec.parse(text)
    assert "\n" not in str(info.value)


def test_spec_is_frozen_and_strict() -> None:
    spec = HostSpec.parse("gpu-a")
    with pytest.raises(pydantic.ValidationError):
        spec.port = 22
    with pytest.raises(pydantic.ValidationError):
        HostSpec(name="gpu-a", colour="red")  # type: ignore[call-arg]


def test_load_inventory(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "hosts:\n"
        "  - root@127.0.0.2:2222\n"
        "  - name: gpu-b\n"
        "    address: 127.0.0.3\n"
        "    key_file: ~/.ssh/id_ed25519\n"
        "    python: /opt/venv/bin/python\n"
        "    env: {CUDA_HOME: /usr/local/cuda}\n"
        "    accept_new_host_key: true\n"
        "  - {address: local, runs_root: /tmp/runs}\n"
    )
    hosts = load_inventory(path)
    assert [h.name for h in hosts] == ["127.0.0.2:2222", "gpu-b", "local"]
    b = hosts[1]
    assert (b.address, b.python, b.env, b.accept_new_host_key) == (
        "127.0.0.3", "/opt/venv/bin/python", {"CUDA_HOME": "/usr/local/cuda"}, True
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("hosts:\n  - {name: a, colour: red}\n", "unknown key 'colour' in hosts[0] (allowed: name, address"),
        ("hosts: []\nextra: 1\n", "unknown key 'extra' (allowed: hosts, groups)"),
        ("hosts:\n  - a\n  - a\n", "two hosts are named 'a'"),
        ("hosts:\n  - {name: a, port: 0}\n", "hosts[0].port"),
        ("hosts:\n  - 'a:x'\n", "port 'x' is not a number"),
        ("hosts:\n  - {user: root}\n", "a host needs a name or an address"),
        ("- a\n", "expected a mapping"),
        ("hosts: [a\n", "not valid YAML"),
    ],
)
def test_inventory_mistakes_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read inventory"):
        load_inventory(tmp_path / "nope.yaml")


def test_open_host_picks_the_transport() -> None:
    local = open_host(HostSpec(address="local", runs_root="/tmp/r", env={"A": "1"}, python="/opt/v/bin/python"))
    assert isinstance(local.transport, LocalTransport)
    assert (local.name, local.runs_root, local.env, local.python) == ("local", "/tmp/r", {"A": "1"}, "/opt/v/bin/python")

    spec = HostSpec.parse("root@127.0.0.2:2222", key_file="/k", known_hosts="/kh", accept_new_host_key=True)
    remote = open_host(spec, ssh_config=None)  # nothing connects yet
    t = remote.transport
    assert isinstance(t, SSHTransport)
    assert (t.name, t.address, t.port, t.user, t.key_file, t.known_hosts, t.accept_new_host_key) == (
        "127.0.0.2:2222", "127.0.0.2", 2222, "root", "/k", "/kh", True
    )


def test_parse_inventory_accepts_specs_as_strings() -> None:
    hosts = parse_inventory({"hosts": ["gpu-a", {"name": "gpu-b"}]})
    assert [h.address for h in hosts] == ["gpu-a", "gpu-b"]


def test_a_group_takes_hosts_of_the_inventory_in_rank_order() -> None:
    inv = parse_inventory_file({"hosts": [{"name": "a", "address": "127.0.0.2"},
                                          {"name": "b", "address": "127.0.0.3", "node_address": "127.0.0.4"}],
                                "groups": [{"name": "pair", "hosts": ["a", "b"]}]})
    assert [g.name for g in inv.groups] == ["pair"] and inv.groups[0].hosts == ["a", "b"]
    hosts = [open_host(spec, ssh_config=None) for spec in inv.hosts]
    assert [h.node_address for h in hosts] == ["127.0.0.2", "127.0.0.4"]


@pytest.mark.parametrize(("groups", "needle"), [
    ([{"name": "pair", "hosts": ["a", "c"]}], "group 'pair' names 'c', which is not a host of the inventory"),
    ([{"name": "p", "hosts": ["a", "b"]}, {"name": "q", "hosts": ["b", "a"]}], "host 'b' is in two groups ('p' and 'q')"),
    ([{"name": "pair", "hosts": ["a"]}], "groups[0].hosts: List should have at least 2 items"),
    ([{"name": "a", "hosts": ["a", "b"]}], "group 'a' has the name of a host"),
    ([{"name": "pair", "hosts": ["a", "b"], "head": "a"}], "unknown key 'head' in groups[0] (allowed: name, hosts)"),
])
def test_group_mistakes_are_one_line(groups: list[dict[str, object]], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_inventory_file({"hosts": ["a", "b"], "groups": groups})
    assert needle in str(err.value) and "\n" not in str(err.value)
