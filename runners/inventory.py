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
        server_port: 30001       # instead of the space's port (two hosts on one machine)
        python: /opt/sglang/bin/python   # instead of the space's engine.python (a venv elsewhere)

:func:`open_host` turns a spec into a :class:`runners.host.Host` on an SSH transport, or on the local
transport when ``address`` is the literal ``local``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runners.errors import ConfigError, did_you_mean
from runners.host import Host
from runners.ssh import DEFAULT_SSH_CONFIG, SSHTransport
from runners.transport import LocalTransport, Transport

__all__ = ["LOCAL", "HostSpec", "load_inventory", "open_host", "parse_inventory"]

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
    server_port: int | None = Field(
        default=None, ge=1024, le=65535,
        description="port the server binds on this host instead of the space's `port` "
        "(hosts that share one machine need one each)",
    )
    accept_new_host_key: bool = False
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


class _InventoryFile(BaseModel):
    """The schema of an inventory file: a ``hosts:`` list, each name unique."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: list[HostSpec]

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
    def _unique_names(self) -> _InventoryFile:
        seen: set[str] = set()
        for spec in self.hosts:
            if spec.name in seen:
                raise ValueError(f"two hosts are named {spec.name!r}")
            seen.add(spec.name)
        return self


def parse_inventory(data: Any, *, source: str = "inventory") -> list[HostSpec]:
    """The hosts of an already-loaded inventory document (``{"hosts": [...]}``)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with a `hosts:` list")
    return list(_validated(_InventoryFile, data, source).hosts)


def load_inventory(path: str | Path) -> list[HostSpec]:
    """Read an inventory YAML file; any mistake is a one-line :class:`ConfigError`."""
    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read inventory {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    return parse_inventory(data, source=str(path))


def open_host(
    spec: HostSpec, *, ssh_config: str | None = DEFAULT_SSH_CONFIG, connect_timeout: float = 10.0
) -> Host:
    """A :class:`Host` for ``spec``; nothing connects until the first command."""
    transport: Transport
    if spec.is_local:
        transport = LocalTransport(name=spec.name)
    else:
        transport = SSHTransport(
            spec.address,
            name=spec.name,
            port=spec.port,
            user=spec.user,
            key_file=spec.key_file,
            known_hosts=spec.known_hosts,
            ssh_config=ssh_config,
            accept_new_host_key=spec.accept_new_host_key,
            connect_timeout=connect_timeout,
        )
    return Host(transport, runs_root=spec.runs_root, env=spec.env, server_port=spec.server_port,
                python=spec.python, price_per_gpu_hour=spec.price_per_gpu_hour)


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
        owner: type[BaseModel] = HostSpec if len(loc) > 1 else model
        inside = where.rsplit(".", 1)[0] if len(loc) > 1 else ""
        return (
            f"{source}: unknown key {loc[-1]!r}{' in ' + inside if inside else ''}"
            f"{did_you_mean(str(loc[-1]), owner.model_fields)} (allowed: {', '.join(owner.model_fields)})"
        )
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {where}: {msg}" if where else f"{source}: {msg}"
