"""Which hosts servetune may use, and how to open one.

A host is a frozen :class:`HostSpec`, written either as a string (``user@name[:port]``) or as a mapping in
an inventory file::

    hosts:
      - root@gpu-a:2222
      - name: gpu-b              # label: run directories and orphans are kept per label
        address: gpu-b.lan       # host name, address, ~/.ssh/config alias, or `local`
        user: ubuntu
        key_file: ~/.ssh/id_ed25519
        env: {CUDA_HOME: /usr/local/cuda}
        runs_root: ~/.servetune/runs
        host_dir: /var/tmp/servetune   # leases and claim, shared by every user (the default)
        server_port: 30001       # instead of the space's port (two hosts on one machine)
        python: /opt/sglang/bin/python   # instead of the space's engine.python (a venv elsewhere)
    groups:                      # hosts taken together by a server that spans nodes (space: nodes: 2)
      - name: pair
        hosts: [gpu-a:2222, gpu-b]   # rank order: the first is the head
      - name: cluster-a          # a Slurm cluster, reached through its login node
        address: login.cluster-a
        runs_root: /shared/scratch/me/servetune   # on the filesystem the compute nodes share
        slurm: {partition: gpu, account: proj1, time_limit: "02:00:00", max_jobs: 4}

:func:`open_host` turns a spec into a :class:`runners.host.Host` on an SSH transport, or on the local
transport when ``address`` is the literal ``local``. An entry's ``kind:`` (default: ``slurm`` with a ``slurm:``
mapping, else ``process-group``) names its placement; :func:`runners.placement.registry.open_placements` opens
any kind (a Slurm entry as its ``max_jobs`` job slots, :class:`runners.slurm.SlurmHost`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runners.errors import ConfigError, did_you_mean
from runners.host import DEFAULT_HOST_DIR, Host
from runners.slurm import SlurmSpec
from runners.ssh import DEFAULT_SSH_CONFIG, SSHTransport
from runners.transport import LocalTransport, Transport

__all__ = ["LOCAL", "GroupSpec", "HostSpec", "Inventory", "load_inventory", "open_host", "parse_inventory",
           "parse_inventory_file", "read_inventory", "transport_for"]

LOCAL = "local"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class HostSpec(BaseModel):
    """One host: where it is, how to log in, and what to export before every command."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(default="", description="label; defaults to address[:port]")
    address: str = Field(default="", description="host name, address, ~/.ssh/config alias, or `local`")
    port: int | None = Field(default=None, ge=1, le=65535, description="None: from ~/.ssh/config, else 22")
    user: str | None = Field(default=None, description="None: from ~/.ssh/config, else the local user")
    key_file: str | None = None
    known_hosts: str | None = Field(default=None, description="None: ~/.ssh/known_hosts")
    python: str | None = Field(default=None, description="the engine's python on this host, instead of the "
                               "space's engine.python")
    env: dict[str, str] = Field(default_factory=dict, description="exported before every command")
    runs_root: str = "~/.servetune/runs"
    host_dir: str | None = Field(
        default=None, description="where controllers of every user keep their leases and the claim of this "
        "host's GPUs; None: the controller's host_dir setting (/var/tmp/servetune)")
    server_port: int | None = Field(
        default=None, ge=1024, le=65535,
        description="port the server binds on this host instead of the space's `port` "
        "(hosts that share one machine need one each)",
    )
    accept_new_host_key: bool = False
    node_address: str | None = Field(
        default=None, description="the address the other nodes of a group reach this host at (the head's is the "
        "dist-init address); None: `address`, or 127.0.0.1 for `local`")
    kind: str | None = Field(default=None, description="the placement that runs this entry's servers "
                             "(runners.placement.registry): process-group or slurm; None: slurm with a `slurm:` "
                             "mapping, else process-group")
    slurm: SlurmSpec | None = Field(default=None, description="this host is a Slurm cluster reached through "
                                    "this login node: each trial is one batch job (see the Slurm page)")
    price_per_gpu_hour: float | None = Field(
        default=None, gt=0,
        description="what one of this host's GPUs costs per hour (any currency): the `cost_per_mtok` objective",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_name_and_address(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = dict(data)
            name, address = data.get("name") or "", data.get("address") or ""
            if not name and not address:
                raise ValueError("a host needs a name or an address")
            if not address:
                data["address"] = name
            if not name:
                port = data.get("port")
                data["name"] = f"{address}:{port}" if port else address
        return data

    @field_validator("name", "address")
    @classmethod
    def _no_blanks(cls, value: str) -> str:
        if not value.strip() or any(c.isspace() for c in value):
            raise ValueError(f"must be a non-empty word, got {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        # Keys are written unquoted after `export`; values are quoted but for $NAME/${NAME} references
        # (runners.host.shell.env_value), so only a NUL byte, which no environment can hold, is refused here.
        for key, text in value.items():
            if not _IDENTIFIER.fullmatch(key):
                raise ValueError(f"environment variable name {key!r} is not a shell identifier (letters, "
                                 "digits and '_', not starting with a digit)")
            if "\0" in text:
                raise ValueError(f"{key}: a value cannot contain a NUL byte")
        return value

    @property
    def is_local(self) -> bool:
        return self.address == LOCAL

    @classmethod
    def parse(cls, text: str, **fields: Any) -> HostSpec:
        """``user@name[:port]`` (or ``[v6addr]:port``, or ``local``) plus any other fields."""
        text = text.strip()
        user, at, rest = text.rpartition("@")
        if at and not user:
            raise ConfigError(f"bad host {text!r}: empty user before '@'")
        port_text = ""
        if rest.startswith("["):
            host, close, tail = rest[1:].partition("]")
            if not close or (tail and not tail.startswith(":")):
                raise ConfigError(f"bad host {text!r}: expected [address]:port")
            port_text = tail[1:]
        else:
            host, _, port_text = rest.partition(":")
        if not host:
            raise ConfigError(f"bad host {text!r}: expected user@name[:port]")
        data: dict[str, Any] = {"address": host, **fields}
        if user:
            data["user"] = user
        if port_text:
            if not port_text.isdigit():
                raise ConfigError(f"bad host {text!r}: port {port_text!r} is not a number")
            data["port"] = int(port_text)
        data.setdefault("name", f"{host}:{port_text}" if port_text else host)
        return _validated(cls, data, f"host {text!r}")


class GroupSpec(BaseModel):
    """Hosts taken together for a server that spans nodes: leased all or nothing, the first one the head."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="label of the group (the trial's host)")
    hosts: list[str] = Field(min_length=2, description="names of hosts of the inventory, in rank order: the "
                             "first is the head (rank 0), which serves HTTP and the dist-init address")

    @field_validator("name")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if not value.strip() or any(c.isspace() for c in value):
            raise ValueError(f"must be a non-empty word, got {value!r}")
        return value


class Inventory(BaseModel):
    """An inventory file: ``hosts:`` (each name unique) and, for servers that span nodes, ``groups:``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: list[HostSpec]
    groups: list[GroupSpec] = Field(default_factory=list)

    @field_validator("hosts", mode="before")
    @classmethod
    def _strings_are_hosts(cls, value: Any) -> Any:
        if isinstance(value, list):
            try:
                return [HostSpec.parse(v) if isinstance(v, str) else v for v in value]
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> Inventory:
        seen: set[str] = set()
        for spec in self.hosts:
            if spec.name in seen:
                raise ValueError(f"two hosts are named {spec.name!r}")
            seen.add(spec.name)
        grouped: dict[str, str] = {}
        for group in self.groups:
            if group.name in seen:
                raise ValueError(f"group {group.name!r} has the name of a host or another group")
            seen.add(group.name)
            for name in group.hosts:
                if name not in {h.name for h in self.hosts}:
                    raise ValueError(f"group {group.name!r} names {name!r}, which is not a host of the inventory"
                                     f"{did_you_mean(name, [h.name for h in self.hosts])}")
                if name in grouped:
                    raise ValueError(f"host {name!r} is in two groups ({grouped[name]!r} and {group.name!r})")
                grouped[name] = group.name
        return self


def parse_inventory(data: Any, *, source: str = "inventory") -> list[HostSpec]:
    """The hosts of an already-loaded inventory document (``{"hosts": [...]}``)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with a `hosts:` list")
    return list(parse_inventory_file(data, source=source).hosts)


def parse_inventory_file(data: Any, *, source: str = "inventory") -> Inventory:
    """An already-loaded inventory document, hosts and groups."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with a `hosts:` list")
    return _validated(Inventory, data, source)


def load_inventory(path: str | Path) -> list[HostSpec]:
    """Read an inventory YAML file's hosts; any mistake is a one-line :class:`ConfigError`."""
    return list(read_inventory(path).hosts)


def read_inventory(path: str | Path) -> Inventory:
    """Read an inventory YAML file, hosts and groups; any mistake is a one-line :class:`ConfigError`."""
    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read inventory {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    return parse_inventory_file(data, source=str(path))


def open_host(
    spec: HostSpec, *, ssh_config: str | None = DEFAULT_SSH_CONFIG, connect_timeout: float = 10.0,
    host_dir: str = DEFAULT_HOST_DIR,
) -> Host:
    """A process-group :class:`Host` for ``spec``; nothing connects until the first command. ``host_dir`` is
    used unless the spec names its own. Every kind of entry, Slurm's job slots included:
    :func:`runners.placement.registry.open_placements`."""
    if spec.slurm is not None:
        raise ConfigError(f"host {spec.name!r} is a Slurm cluster: open it with "
                          "runners.placement.registry.open_placements")
    transport = transport_for(spec, spec.name, ssh_config, connect_timeout)
    node_address = spec.node_address or ("127.0.0.1" if spec.is_local else spec.address)
    return Host(transport, runs_root=spec.runs_root, env=spec.env, server_port=spec.server_port,
                python=spec.python, host_dir=spec.host_dir or host_dir, node_address=node_address,
                price_per_gpu_hour=spec.price_per_gpu_hour)


def transport_for(spec: HostSpec, name: str, ssh_config: str | None, connect_timeout: float) -> Transport:
    transport: Transport
    if spec.is_local:
        transport = LocalTransport(name=name)
    else:
        transport = SSHTransport(
            spec.address,
            name=name,
            port=spec.port,
            user=spec.user,
            key_file=spec.key_file,
            known_hosts=spec.known_hosts,
            ssh_config=ssh_config,
            accept_new_host_key=spec.accept_new_host_key,
            connect_timeout=connect_timeout,
        )
    return transport


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], data: Mapping[str, Any], source: str) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, model, source)) from None


def _one_line(exc: ValidationError, model: type[BaseModel], source: str) -> str:
    err = exc.errors()[0]
    loc = err["loc"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if err["type"] == "extra_forbidden":
        owner: type[BaseModel] = (GroupSpec if loc[0] == "groups" else HostSpec) if len(loc) > 1 else model
        inside = where.rsplit(".", 1)[0] if len(loc) > 1 else ""
        return (
            f"{source}: unknown key {loc[-1]!r}{' in ' + inside if inside else ''}"
            f"{did_you_mean(str(loc[-1]), owner.model_fields)} (allowed: {', '.join(owner.model_fields)})"
        )
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {where}: {msg}" if where else f"{source}: {msg}"
