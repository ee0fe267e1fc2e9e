"""The preflight of a host for a space: the engine, its python and version, the model path, the GPUs.

For a ``sim`` space on a remote host the simulated host's ``nvidia-smi`` is installed on the host itself,
under its runs root, with the host's engine python (:func:`install_sim_smi`): no manual set-up.
"""

from __future__ import annotations

from pathlib import Path

from runners.checkpoint import CheckpointFacts, parse_checkpoint
from runners.engines import Engine
from runners.errors import HostMisconfigured
from runners.host import Host, HostInfo
from search.spaces import engine_of, free_flag_problem
from spaces.nccl import parse_nccl_version
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
    reads none) and tensor parallel size, and that the shared folder of its leases can be made; installs the
    simulated nvidia-smi on the host first for a ``sim`` space."""
    engine = engine or engine_of(space)
    python = host.python or space.engine.python
    if engine.simulated:
        install_sim_smi(host, space, python)
    info = host.preflight(space.engine.kind, python, engine.version_command(python),
                          gpus=space.engine.device == "gpu",
                          model_path=None if engine.simulated else space.model_path,  # the simulator reads none
                          gpus_needed=gpus_per_node(space, engine) if space.engine.device == "gpu" else 0)
    info.nccl_version = host_nccl(host, engine, python)
    info.checkpoint = host_checkpoint(host, engine, python, space.model_path)
    check_nccl_on(host, space, info.nccl_version)
    host.gpu_dir()  # where the host's leases and claim live: a host_dir that cannot be made drops the host
    if not space.engine.version and info.engine_version:
        # The free flags were checked against the newest tabled release; the host's own release decides.
        problem = free_flag_problem(space, engine, info.engine_version)
        if problem is not None:
            raise HostMisconfigured(f"{host.name}: {problem}", host=host.name, fault="engine_flags")
    return info


def gpus_per_node(space: Space, engine: Engine) -> int:
    """The GPUs each host must have: the tensor parallel size over the most nodes the space spans (``--tp`` is
    the total over the nodes)."""
    return -(-engine.tp_size(space.fixed_args) // space.max_nodes)


def host_nccl(host: Host, engine: Engine, python: str) -> str | None:
    """The NCCL version the engine's torch loads on ``host`` (None when it loads none or says nothing usable)."""
    res = host.run(engine.nccl_version_command(python), timeout=60)
    line = res.stdout.strip().splitlines()[-1].strip() if res.ok and res.stdout.strip() else ""
    try:
        parse_nccl_version(line)
    except ValueError:
        return None
    return line


def host_checkpoint(host: Host, engine: Engine, python: str, model_path: str) -> CheckpointFacts | None:
    """What the model's checkpoint on ``host`` says before any launch (its ``config.json`` and weights' size; the
    simulated host's profile answers for it); None when the host gives nothing readable."""
    res = host.run(engine.checkpoint_command(python, model_path), timeout=60)
    return parse_checkpoint(res.stdout) if res.ok else None


def check_nccl_on(host: Host, space: Space, nccl: str | None) -> None:
    """The space's NCCL settings checked against the NCCL ``host`` loads: HostMisconfigured (one line naming the
    version) when they fail there. Without a version the space's own rules stood at load (the newest, or
    ``engine.nccl``)."""
    if nccl is None:
        return
    try:
        space.check_nccl_for(parse_nccl_version(nccl), f"what {host.name}'s torch loads")
    except ValueError as exc:
        raise HostMisconfigured(f"{host.name}: {exc}", host=host.name, fault="nccl_rules") from None
