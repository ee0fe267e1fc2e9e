"""Which hosts a run uses: ``--host user@name[:port]`` (repeatable), an inventory file, or this machine.

For a ``sim`` space on this machine, the simulated host's ``nvidia-smi`` is installed into the working
directory's ``.servetune/simhost/bin`` and put on PATH for every host command, with its state directory.
On any other host (SSH, or an inventory entry) the preflight installs it on the host itself, under the
host's runs root, with the host's engine python (:func:`install_sim_smi`): no manual set-up.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from runners.errors import ConfigError
from runners.host import ANY_FREE_PORT, DEFAULT_HOST_DIR, Host, HostGroup
from runners.inventory import HostSpec, load_inventory, read_inventory
from runners.placement.registry import open_placements
from runners.transport import LocalTransport
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
               server_port: int | None = None, python: str | None = None,
               host_dir: str = DEFAULT_HOST_DIR, price_per_gpu_hour: float | None = None) -> Host:
    """This machine as a host. The built-in simulated host binds a free loopback port for each launch unless
    ``server_port`` says otherwise: demos and test runs from other folders may be serving on the space's port."""
    sim = space.engine.simulated
    env = sim_env(space, sim_dir) if sim else {}
    if server_port is None and sim:
        server_port = ANY_FREE_PORT
    return Host(LocalTransport(name), runs_root=runs_root, env=env, server_port=server_port, python=python,
                host_dir=host_dir, price_per_gpu_hour=price_per_gpu_hour)


def build_hosts(space: Space, *, host_args: Sequence[str] = (), inventory: Path | None = None,
                runs_root: str, sim_dir: Path, accept_new_host_key: bool = False,
                host_dir: str = DEFAULT_HOST_DIR) -> list[Host]:
    """Hosts from the CLI and/or an inventory file; this machine when neither is given. ``host_dir``: where
    the hosts' leases and claims live, unless an inventory entry names its own."""
    if not host_args and inventory is None:
        if space.objective.needs_price:
            raise ConfigError("the cost_per_mtok objective needs each host's price per GPU-hour: give an inventory "
                              "(--inventory) whose hosts set price_per_gpu_hour (`address: local` for this machine)")
        return [local_host(space, runs_root=runs_root, sim_dir=sim_dir, host_dir=host_dir)]
    specs = list(load_inventory(inventory)) if inventory is not None else []
    specs += [HostSpec.parse(arg) for arg in host_args]
    if accept_new_host_key:  # the flag applies to every host, inventory ones included
        specs = [spec.model_copy(update={"accept_new_host_key": True}) for spec in specs]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"the same host is listed twice: {sorted(n for n in names if names.count(n) > 1)[0]}")
    hosts = []
    for spec in specs:
        if spec.address == "local" and space.engine.simulated and not spec.env and spec.slurm is None:
            hosts.append(local_host(space, runs_root=spec.runs_root, sim_dir=sim_dir, name=spec.name,
                                    server_port=spec.server_port, python=spec.python,
                                    host_dir=spec.host_dir or host_dir,
                                    price_per_gpu_hour=spec.price_per_gpu_hour))
        else:
            hosts.extend(open_placements(spec, host_dir=host_dir))  # a Slurm cluster: one host per job slot
    unpriced = [h.name for h in hosts if h.price_per_gpu_hour is None]
    if space.objective.needs_price and unpriced:
        raise ConfigError(f"the cost_per_mtok objective needs every host's price: set price_per_gpu_hour for "
                          f"{unpriced[0]} in the inventory")
    return hosts




def host_names(host_args: Sequence[str], inventory: Path | None) -> list[str]:
    """The names of the hosts a run would use (``--host`` arguments, an inventory, or this machine), read
    without opening or preparing any of them."""
    if not host_args and inventory is None:
        return ["local (this machine)"]
    specs = list(load_inventory(inventory)) if inventory is not None else []
    specs += [HostSpec.parse(arg) for arg in host_args]
    return [s.name for s in specs]


def build_groups(inventory: Path | None, hosts: Sequence[Host]) -> list[HostGroup]:
    """The inventory's groups (``groups:``) over the opened ``hosts``: the hosts a server spanning nodes takes
    together, head first."""
    if inventory is None:
        return []
    by_name = {h.name: h for h in hosts}
    return [HostGroup(g.name, tuple(by_name[name] for name in g.hosts)) for g in read_inventory(inventory).groups]
