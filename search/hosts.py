"""Which hosts a run uses: ``--host user@name[:port]`` (repeatable), an inventory file, or this machine.

For a ``sim`` space on this machine, the simulated host's ``nvidia-smi`` is installed into the working
directory's ``.servetune/simhost/bin`` and put on PATH for every host command, with its state directory.
On any other host (SSH, or an inventory entry) the preflight installs it on the host itself, under the
host's runs root, with the host's engine python (:func:`install_sim_smi`): no manual set-up.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from runners.engines import Engine, get_engine
from runners.errors import ConfigError
from runners.host import ANY_FREE_PORT, Host, HostInfo
from runners.transport import LocalTransport
from spaces.launch import engine_options
from spaces.schema import Space


def sim_env(space: Space, sim_dir: Path) -> dict[str, str]:
    """Install the simulated nvidia-smi for ``space``'s profile; return the env a host needs for it."""
    assert space.engine.sim is not None
    sim_dir = sim_dir.resolve()
    bin_dir = sim_dir / "bin"
    state = sim_dir / "state"
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "runners.simhost", "install-smi", "--sim-profile",
           space.engine.sim.profile, "--state-dir", str(state), "--bin-dir", str(bin_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"cannot set up the simulated host for {space.engine.sim.profile}: {last}")
    return {"PATH": f"{bin_dir}:$PATH", "SERVETUNE_SIM_STATE": str(state)}


def local_host(space: Space, *, runs_root: str, sim_dir: Path, name: str = "local",
               server_port: int | None = None, python: str | None = None) -> Host:
    """This machine as a host. The built-in simulated host binds a free loopback port for each launch unless
    ``server_port`` says otherwise: demos and test runs from other folders may be serving on the space's port."""
    sim = space.engine.kind == "sim"
    env = sim_env(space, sim_dir) if sim else {}
    if server_port is None and sim:
        server_port = ANY_FREE_PORT
    return Host(LocalTransport(name), runs_root=runs_root, env=env, server_port=server_port, python=python)


def build_hosts(space: Space, *, host_args: Sequence[str] = (), inventory: Path | None = None,
                runs_root: str, sim_dir: Path, accept_new_host_key: bool = False) -> list[Host]:
    """Hosts from the CLI and/or an inventory file; this machine when neither is given."""
    if not host_args and inventory is None:
        return [local_host(space, runs_root=runs_root, sim_dir=sim_dir)]
    from runners.inventory import HostSpec, load_inventory, open_host

    specs = list(load_inventory(inventory)) if inventory is not None else []
    specs += [HostSpec.parse(arg) for arg in host_args]
    if accept_new_host_key:  # the flag applies to every host, inventory ones included
        specs = [spec.model_copy(update={"accept_new_host_key": True}) for spec in specs]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same host is listed twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
    hosts = []
    for spec in specs:
        if spec.address == "local" and space.engine.kind == "sim" and not spec.env:
            hosts.append(local_host(space, runs_root=spec.runs_root, sim_dir=sim_dir, name=spec.name,
                                    server_port=spec.server_port, python=spec.python))
        else:
            hosts.append(open_host(spec))
    return hosts


def install_sim_smi(host: Host, space: Space, python: str) -> None:
    """Give ``host`` the simulated host's nvidia-smi for ``space``'s profile, installed on the host under its
    runs root with ``python`` (once: an installed one is kept, as other controllers may be using its state),
    and put it on PATH for every command. Nothing is done for a host whose env already names a simulated
    state, or when the install fails (the preflight then reports what is missing)."""
    assert space.engine.sim is not None
    if "SERVETUNE_SIM_STATE" in host.env:
        return
    profile = Path(space.engine.sim.profile).stem
    base = f"{host.runs_root}/.servetune/simhost/{profile}"
    d = host.shell_path(base)
    py = shlex.quote(python)
    res = host.run(
        f"mkdir -p {d} && cd {d} && {{ [ -x bin/nvidia-smi ] || {py} -m runners.simhost install-smi "
        f"--sim-profile {shlex.quote(space.engine.sim.profile)} --state-dir state --bin-dir bin >&2; }} && pwd",
        timeout=60)
    if not res.ok or not res.stdout.strip():
        return
    where = res.stdout.strip().splitlines()[-1]
    host.env["PATH"] = f"{where}/bin:$PATH"
    host.env["SERVETUNE_SIM_STATE"] = f"{where}/state"


def host_names(host_args: Sequence[str], inventory: Path | None) -> list[str]:
    """The names of the hosts a run would use (``--host`` arguments, an inventory, or this machine), read
    without opening or preparing any of them."""
    if not host_args and inventory is None:
        return ["local (this machine)"]
    from runners.inventory import HostSpec, load_inventory

    specs = list(load_inventory(inventory)) if inventory is not None else []
    specs += [HostSpec.parse(arg) for arg in host_args]
    return [s.name for s in specs]


def tp_flag(args: Sequence[str]) -> int | None:
    """The tensor parallel size ``args`` ask for (``--tp 4``, ``--tp-size=4``, ``--tensor-parallel-size 4``);
    None when they name none."""
    flags = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp")
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            text = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if text.isdigit():
                return int(text)
    return None


def tp_size(args: Sequence[str]) -> int:
    """:func:`tp_flag`, 1 when none."""
    return tp_flag(args) or 1


def preflight(host: Host, space: Space, engine: Engine | None = None) -> HostInfo:
    """:meth:`Host.preflight` for ``space``'s engine (``engine`` when the caller has resolved it) and python, or
    the host's own python (nvidia-smi only for a GPU engine), its model path (not for the simulator, which
    reads none) and tensor parallel size; installs the simulated nvidia-smi on the host first for a ``sim``
    space."""
    engine = engine or get_engine(space.engine.kind, engine_options(space))
    python = host.python or space.engine.python
    if space.engine.kind == "sim":
        install_sim_smi(host, space, python)
    return host.preflight(space.engine.kind, python, engine.version_command(python),
                          gpus=space.engine.device == "gpu",
                          model_path=None if space.engine.kind == "sim" else space.model_path,  # sim reads none
                          gpus_needed=tp_size(space.fixed_args) if space.engine.device == "gpu" else 0)
