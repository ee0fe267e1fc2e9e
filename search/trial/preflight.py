"""The preflight of a host for a space: the engine, its python and version, the model path, the GPUs.

For a ``sim`` space on a remote host the simulated host's ``nvidia-smi`` is installed on the host itself,
under its runs root, with the host's engine python (:func:`install_sim_smi`): no manual set-up.
"""

from __future__ import annotations

from pathlib import Path

from runners.engines import Engine
from runners.host import Host, HostInfo
from search.spaces import engine_of
from spaces.schema import Space


def install_sim_smi(host: Host, space: Space, python: str) -> None:
    """Give ``host`` the simulated host's nvidia-smi for ``space``'s profile, installed on the host under its
    runs root with ``python`` (once: an installed one is kept, as other controllers may be using its state),
    and put it on PATH for every command. Nothing is done for a host whose env already names a simulated
    state, or when the install fails (the preflight then reports what is missing)."""
    assert space.engine.sim is not None
    if "SERVETUNE_SIM_STATE" in host.env:
        return
    profile = Path(space.engine.sim.profile).stem
    res = host.run_script("install_sim_smi.sh", f"{host.runs_root}/.servetune/simhost/{profile}", python,
                          space.engine.sim.profile, timeout=60)
    if not res.ok or not res.stdout.strip():
        return
    where = res.stdout.strip().splitlines()[-1]
    host.env["PATH"] = f"{where}/bin:$PATH"
    host.env["SERVETUNE_SIM_STATE"] = f"{where}/state"


def preflight(host: Host, space: Space, engine: Engine | None = None) -> HostInfo:
    """:meth:`Host.preflight` for ``space``'s engine (``engine`` when the caller has resolved it) and python, or
    the host's own python (nvidia-smi only for a GPU engine), its model path (not for the simulator, which
    reads none) and tensor parallel size; installs the simulated nvidia-smi on the host first for a ``sim``
    space."""
    engine = engine or engine_of(space)
    python = host.python or space.engine.python
    if engine.simulated:
        install_sim_smi(host, space, python)
    return host.preflight(space.engine.kind, python, engine.version_command(python),
                          gpus=space.engine.device == "gpu",
                          model_path=None if engine.simulated else space.model_path,  # the simulator reads none
                          gpus_needed=engine.tp_size(space.fixed_args) if space.engine.device == "gpu" else 0)
