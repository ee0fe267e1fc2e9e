"""Which NCCL settings are legal, by NCCL version (env.rst, src/graph/tuning.cc, 2.31's src/tuning/cost_model.cc):
each variable alone, the combinations that fail together, and the ones that run but are unsafe.

The list grammar is NCCL's ``parseList`` (``src/graph/tuning.cc``). From 2.24 a list is ``;``-separated
entries, each ``func:items`` or, for the first entry only, bare ``items`` ("All entries except the first must
have a prefix", ncclInvalidUsage: ``allreduce:tree;ring`` is refused on every NCCL that reads entries). Before
2.24 the whole value is one comma list (``parseList(str, elems, ...)`` of v2.23.4): a ``;`` or ``func:`` token
matches no algorithm and is silently dropped, so the per-collective form leaves nothing enabled there.

Rules that changed with NCCL are keyed by the version: since 2.24 a bare ``NCCL_ALGO`` list applies to every
collective with no fallback to Ring; since 2.31 a list that names only some collectives (``allreduce:tree``)
leaves the others without an algorithm when a bare ``NCCL_PROTO`` forces every collective. The newest rules are
the strictest, so a space legal under them (:data:`NCCL_NEWEST`, assumed when the version is not known) is legal
on every NCCL. A space searches NCCL variables as categoricals whose value :data:`UNSET` leaves the variable out.
"""

from __future__ import annotations

from typing import Any

from runners.errors import did_you_mean

UNSET = "unset"
"""The value of a searched NCCL variable that leaves it out of the environment (NCCL's own default)."""

_PROTOS = {"ll", "ll128", "simple"}
_ALGOS = {"ring", "tree", "collnetchain", "collnetdirect", "nvls", "nvlstree", "pat"}
_FUNCS = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce"}
_NVLS = {"nvls", "nvlstree"}
_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}
SAFE_ALGO = "ring;allreduce:tree"
"""The spelling that forces Tree where it exists (AllReduce) and keeps Ring for every other collective: legal on
every NCCL from 2.24 (vLLM writes it for NCCL 2.31, vllm-project/vllm#58179); before 2.24 the comma form
``tree,ring`` is the one that parses."""

NcclVersion = tuple[int, int, int]
NCCL_NEWEST: NcclVersion = (2, 32, 3)
"""The newest NCCL whose rules servetune knows (its rules are the strictest)."""
#: Since 2.24 NCCL_ALGO/NCCL_PROTO are per-collective entries (``func:items;...``); before, one comma list.
PER_COLLECTIVE: NcclVersion = (2, 24, 0)
#: Since 2.24 a bare NCCL_ALGO list applies to every collective and never falls back to Ring (env.rst).
NO_RING_FALLBACK: NcclVersion = (2, 24, 0)
#: Since 2.31 NCCL_ALGO re-enables only the collectives it names (cost_model.cc, ncclTuningCostModelInit).
NAMED_ONLY: NcclVersion = (2, 31, 0)


def parse_nccl_version(text: str) -> NcclVersion:
    """``"2.27.3"`` (or ``"2.27"``) as a tuple; ValueError (one line) for anything else."""
    parts = str(text).strip().split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"NCCL version {text!r} is not MAJOR.MINOR[.PATCH], e.g. 2.27.3")
    major, minor, *rest = (int(p) for p in parts)
    return major, minor, rest[0] if rest else 0


def version_text(version: NcclVersion) -> str:
    return ".".join(str(p) for p in version)


def _parts(value: str) -> list[tuple[str, str]]:
    """``"ring;allreduce:tree"`` -> ``[("", "ring"), ("allreduce", "tree")]`` (NCCL 2.24 per-collective form:
    a part without ``func:`` applies to every collective)."""
    out = []
    for part in value.split(";"):
        func, _, body = part.rpartition(":")
        out.append((func.strip().lower(), body.strip()))
    return out


def _items(body: str) -> tuple[bool, list[str]]:
    """``"^tree,ring"`` -> ``(True, ["tree", "ring"])``: whether the list excludes, and its lowercased items."""
    negated = body.startswith("^")
    return negated, [p.strip().lower() for p in (body[1:] if negated else body).split(",")]


def allows(value: str, name: str, *, func: str = "") -> bool:
    """Whether the NCCL list ``value`` (of NCCL_ALGO or NCCL_PROTO) lets collective ``func`` ("" = the bare
    default) use ``name``. A part naming ``func`` wins over the bare one; no part at all allows everything."""
    chosen = None
    for part_func, body in _parts(value):
        if part_func == func or (part_func == "" and chosen is None):
            chosen = body
    if chosen is None:
        return True
    negated, items = _items(chosen)
    return (name in items) != negated


def forced(value: str, names: set[str]) -> bool:
    """Whether any part of the list ``value`` names one of ``names`` without excluding it."""
    return any(not neg and names & set(items) for neg, items in (_items(b) for _, b in _parts(value)))


def _check_list(value: str, legal: set[str], what: str) -> None:
    for i, (func, body) in enumerate(_parts(value)):
        if i and not func:
            raise ValueError(f"{what}={value}: every entry after the first needs a collective prefix "
                             f"({', '.join(sorted(_FUNCS))}): NCCL refuses the list (src/graph/tuning.cc "
                             f"parseList, ncclInvalidUsage); put the bare entry first, e.g. {SAFE_ALGO}")
        if func and func not in _FUNCS:
            raise ValueError(f"{what} collective {func!r} is not one of {sorted(_FUNCS)}")
        _negated, items = _items(body)
        if not body.lstrip("^") or any(not p for p in items):
            raise ValueError(f"{what} {value!r} is not a comma list")
        bad = [p for p in items if p not in legal]
        if bad == ["collnet"]:
            raise ValueError(f"{what} 'collnet' is invalid since NCCL 2.14 (CollNetDirect, CollNetChain)")
        if bad:
            raise ValueError(f"{what} value {bad[0]!r} is not one of {sorted(legal)} (optionally ^-prefixed)")


def _check_algo(value: str) -> None:
    _check_list(value, _ALGOS, "NCCL_ALGO")
    if forced(value, {"nvlstree"}):
        raise ValueError("NCCL_ALGO NVLSTree needs more than one node (src/graph/tuning.cc); servetune launches one")


def _int_in(lo: int, hi: int | None) -> Any:
    def check(value: str) -> None:
        if not value.isdigit() or int(value) < lo or (hi is not None and int(value) > hi):
            raise ValueError(f"must be an integer in [{lo}, {hi if hi is not None else 'inf'}]")
    return check


def _one_of(*allowed: str) -> Any:
    def check(value: str) -> None:
        if value not in allowed:
            raise ValueError(f"must be one of {list(allowed)}")
    return check


def _p2p_level(value: str) -> None:
    if value.upper() in _LEVELS or value.isdigit():
        return  # legacy integers: LOC=0 PIX=1 PXB=2 PHB=3 SYS=4, >4 means SYS
    raise ValueError(f"must be one of {sorted(_LEVELS)} or a legacy integer")


def _nthreads(value: str) -> None:
    if value not in {"64", "128", "256", "512"}:
        raise ValueError("must be one of [64, 128, 256, 512]")


NCCL_VARIABLES: dict[str, Any] = {
    "NCCL_PROTO": lambda v: _check_list(v, _PROTOS, "NCCL_PROTO"),
    "NCCL_ALGO": _check_algo,
    "NCCL_P2P_LEVEL": _p2p_level,
    "NCCL_P2P_DISABLE": _one_of("0", "1"),
    "NCCL_P2P_DIRECT_DISABLE": _one_of("0", "1"),
    "NCCL_SHM_DISABLE": _one_of("0", "1"),
    "NCCL_IB_DISABLE": _one_of("0", "1"),
    "NCCL_CUMEM_ENABLE": _one_of("0", "1"),
    "NCCL_CUMEM_HOST_ENABLE": _one_of("0", "1"),
    "NCCL_NVLS_ENABLE": _one_of("0", "1", "2"),
    "NCCL_MIN_NCHANNELS": _int_in(1, 32),
    "NCCL_MAX_NCHANNELS": _int_in(1, None),
    "NCCL_MIN_CTAS": _int_in(1, 32),
    "NCCL_MAX_CTAS": _int_in(1, None),
    "NCCL_BUFFSIZE": _int_in(1, None),
    "NCCL_NTHREADS": _nthreads,
    "NCCL_NET_GDR_LEVEL": _p2p_level,
    "NCCL_LAUNCH_MODE": _one_of("PARALLEL", "GROUP"),
}


def check_nccl(name: str, value: str) -> None:
    """Raise ValueError if ``name=value`` is not a legal NCCL setting."""
    if name not in NCCL_VARIABLES:
        raise ValueError(f"unknown NCCL variable {name!r}{did_you_mean(name, NCCL_VARIABLES)}; allowed: "
                         f"{', '.join(sorted(NCCL_VARIABLES))}")
    NCCL_VARIABLES[name](value)


def nccl_values(name: str, env: dict[str, str], searched: dict[str, list[str]]) -> list[str | None]:
    """The values variable ``name`` can take in a trial: each searched one ("unset" keeps ``env``'s), or
    ``env``'s alone; None for absent."""
    fixed = env.get(name)
    if name not in searched:
        return [fixed]
    return [fixed if v == UNSET else v for v in searched[name]]


def _unnamed(value: str) -> list[str]:
    """The collectives an NCCL_ALGO list leaves to NCCL 2.31's zeroed table: all but those it names, when it has
    no bare part (a bare part re-enables every collective)."""
    parts = _parts(value)
    if any(func == "" for func, _ in parts):
        return []
    named = {func for func, _ in parts}
    return [f for f in ("allgather", "broadcast", "reducescatter", "reduce", "allreduce") if f not in named]


def _check_versioned(env: dict[str, str], searched: dict[str, list[str]], nccl: NcclVersion, where: str) -> None:
    """The rules that changed with NCCL, for version ``nccl`` (``where`` says where the version came from)."""
    algos = [v for v in nccl_values("NCCL_ALGO", env, searched) if v is not None]
    if nccl < PER_COLLECTIVE:
        for name in ("NCCL_ALGO", "NCCL_PROTO"):
            for value in nccl_values(name, env, searched):
                if value is not None and (";" in value or ":" in value):
                    raise ValueError(
                        f"{name}={value} is the per-collective form, which NCCL {version_text(nccl)} does not "
                        f"parse ({where}; new in 2.24: before, the value is one comma list and a 'func:' or ';' "
                        f"token matches nothing and is dropped): write a comma list, e.g. tree,ring")
    if nccl >= NO_RING_FALLBACK:
        for value in algos:
            for func, _body in _parts(value):
                if func != "allreduce" and not allows(value, "ring", func=func):
                    raise ValueError(
                        f"NCCL_ALGO={value} leaves {func or 'every collective'} without Ring, which fails on NCCL "
                        f"{version_text(nccl)} ({where}; no fallback to Ring since 2.24: SGLang's TP AllGather "
                        f"has no algorithm): write {SAFE_ALGO} (or ring;allreduce:<algo>)")
    if nccl < NAMED_ONLY:
        return
    bare_protos = [v for v in nccl_values("NCCL_PROTO", env, searched)
                   if v is not None and any(func == "" for func, _ in _parts(v))]
    for value in algos:
        left = _unnamed(value)
        if left and bare_protos:
            raise ValueError(
                f"NCCL_ALGO={value} with NCCL_PROTO={bare_protos[0]} leaves {', '.join(left[:2])} and the other "
                f"collectives it does not name without an algorithm on NCCL {version_text(nccl)} ({where}; since "
                f"2.31 NCCL_ALGO re-enables only the collectives it names): write ring;{value}")


def check_nccl_combinations(env: dict[str, str], searched: dict[str, list[str]], *, nvls_off: bool,
                            nccl: NcclVersion = NCCL_NEWEST, where: str = "the newest servetune knows") -> None:
    """Raise ValueError (one line) for NCCL settings that are legal alone but fail together on NCCL ``nccl``
    (``where``: how that version was found, named in the line).

    ``nvls_off``: the engine sets ``NCCL_NVLS_ENABLE=0`` unless told otherwise, as SGLang does without
    ``--enable-nccl-nvls`` (:attr:`spaces.schema.EngineSpec.nvls_flag`).
    """
    _check_versioned(env, searched, nccl, where)
    algos = [v for v in nccl_values("NCCL_ALGO", env, searched) if v is not None and forced(v, _NVLS)]
    if not algos:
        return
    for proto in nccl_values("NCCL_PROTO", env, searched):
        if proto is not None and not allows(proto, "simple"):
            raise ValueError(f"NCCL_ALGO={algos[0]} runs only with the Simple protocol (src/graph/tuning.cc), "
                             f"but NCCL_PROTO can be {proto}")
    if nvls_off:
        bad = [v for v in nccl_values("NCCL_NVLS_ENABLE", env, searched) if v != "1"]
        if bad:
            raise ValueError(f"NCCL_ALGO={algos[0]} needs NCCL_NVLS_ENABLE=1: SGLang sets it to 0 unless "
                             "--enable-nccl-nvls (srt/entrypoints/engine.py:1909@v0.5.23); set it in env or "
                             "add --enable-nccl-nvls to fixed_args")


def nccl_warnings(env: dict[str, str], searched: dict[str, list[str]]) -> list[str]:
    """Settings that run but are unsafe: one line each, saying why."""
    protos = [v for v in nccl_values("NCCL_PROTO", env, searched) if v is not None and forced(v, {"ll128"})]
    if not protos:
        return []
    return [f"NCCL_PROTO={protos[0]} forces LL128, which on hardware that does not support it can corrupt data "
            "(NCCL env.rst); servetune measures only throughput, so a corrupted run would look like a win. "
            "Search it only where NCCL enables LL128 by itself."]
