"""NCCL on the simulated host: which settings NCCL >= 2.24 accepts, and what an all-reduce costs by size.

Legality (NVIDIA/nccl ``env.rst`` and ``src/graph/tuning.cc``; engine-audit items 2-5):

* a bare ``NCCL_ALGO`` list applies to *every* collective and, since 2.24, never falls back to Ring: a
  list without Ring leaves SGLang's TP logits AllGather (``srt/layers/logits_processor.py``) with no
  algorithm, and the first forward dies with ``Error : no algorithm/protocol available for function
  AllGather with datatype ncclBfloat16. NCCL_ALGO was set to Tree.`` The per-collective spelling
  ``allreduce:tree`` (SGLang's own) only touches AllReduce;
* NVLS and NVLSTree run only with the Simple protocol and need ``NCCL_NVLS_ENABLE=1``, which SGLang sets
  to 0 unless ``--enable-nccl-nvls`` (0.5.2 overwrites a user value, 0.5.5+ keeps it); NVLSTree never
  runs on one node; NVLS needs NVLink; PAT has no AllReduce path; ``collnet`` is not a token since 2.14;
* an unknown token fails at communicator init (``Unrecognized element token``).

Cost: one all-reduce of ``S`` bytes over ``n`` ranks takes ``hops * hop_latency[proto] + S * f_algo /
(link_bandwidth * efficiency[proto])`` (ring: ``2(n-1)`` hops and ``2(n-1)/n`` of the data per link;
tree on one node is a chain: fewer bytes per hop but half the bandwidth; NVLS: switch-side reduction).
NCCL's own choice (``auto``) follows its size thresholds, LL for small messages, LL128 (NVLink only)
for medium ones, Simple above, which is close to but not always the fastest; so a forced protocol
helps in the band where NCCL's threshold is off and hurts elsewhere (LL moves half the bandwidth).
On NVLink, and on PCIe with TP <= 2, SGLang's custom all-reduce carries messages up to
``custom_ar_max_bytes`` (decode steps), so NCCL variables only reach the large prefill all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["NcclCost", "NcclEffect", "allreduce_us", "nccl_effect_for"]

Interconnect = Literal["pcie", "nvlink"]

_ALGOS = {
    "ring": "Ring",
    "tree": "Tree",
    "collnetdirect": "CollnetDirect",
    "collnetchain": "CollnetChain",
    "nvls": "NVLS",
    "nvlstree": "NVLSTree",
    "pat": "PAT",
}
_PROTOS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
# Algorithms that have an AllReduce / AllGather path on one node (tuning.cc; CollNet needs a
# SHARP-capable network, PAT is AllGather/ReduceScatter only and only one rank per node).
_ALLREDUCE_ALGOS = {"pcie": {"Ring", "Tree"}, "nvlink": {"Ring", "Tree", "NVLS"}}
_ALLGATHER_ALGOS = {"pcie": {"Ring"}, "nvlink": {"Ring", "NVLS"}}
# NCCL's hop latencies per protocol (us, tuning.cc baseLat + hwLat order of magnitude) and the share
# of the link each protocol moves as payload (LL: 4 of every 8 bytes; LL128: 120 of 128).
_HOP_US = {"LL": 0.6, "LL128": 1.1, "Simple": 4.0}
_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
# NCCL's protocol thresholds for its own pick (bytes per all-reduce).
_AUTO_LL_MAX = 64 * 1024
_AUTO_LL128_MAX = 8 * 1024 * 1024


class NcclEffect(BaseModel):
    """What the NCCL environment does on this host: a start-up error, a first-forward error, or a cost model."""

    model_config = ConfigDict(frozen=True)

    error: str | None = None  # NCCL's "Last error" text (communicator init)
    warn: str | None = None  # the NCCL WARN line body
    allgather_error: str | None = None  # set: the first forward's logits AllGather dies with this
    custom_allreduce_disabled_warning: bool = False
    algo: str = "auto"  # what the variables force for AllReduce ("auto" when unset)
    proto: str = "auto"
    allowed_algos: tuple[str, ...] = ()
    allowed_protos: tuple[str, ...] = ()
    nccl_carries_decode: bool = False  # False: SGLang's custom all-reduce carries decode steps
    nvls_enabled: bool = False  # NCCL may use NVLS by itself
    # NCCL_PROTO forces LL128 where NCCL would not enable it (PCIe): env.rst warns that this "can lead to
    # data corruption". The simulator cannot corrupt anything, so it only reports it; its speed is modelled.
    ll128_unsupported: bool = False
    transport_factor: float = 1.0  # P2P/SHM disabled: data through host memory or sockets


class NcclCost(BaseModel):
    """Per-step all-reduce cost model of a running server (built by the model, used by the engine)."""

    model_config = ConfigDict(frozen=True)

    ranks: int = 1
    interconnect: Interconnect = "pcie"
    link_gb_s: float = 20.0  # bus bandwidth of the ring, GB/s
    hop_latency_scale: float = 1.0  # PCIe hops are slower than NVLink ones
    allreduces_per_token_layer: int = 2
    num_layers: int = 0
    hidden_size: int = 0
    activation_bytes: int = 2
    custom_ar_max_bytes: int = 8 * 1024 * 1024
    effect: NcclEffect = NcclEffect()
    nnodes: int = 1
    inter_node_gb_s: float = 50.0
    inter_node_latency_scale: float = 5.0

    def _cross_node_us(self, nbytes: float) -> float:
        """Extra time of one all-reduce of ``nbytes`` when the ranks span nodes: NCCL's own choice over a ring
        whose slowest link is the inter-node one, against the same on one node's link (which the profile's step
        times include). Custom all-reduce is off across nodes (SGLang's ``custom_all_reduce.py``: "Custom
        allreduce is disabled because this process group spans across nodes."), so every message pays it."""
        if self.nnodes <= 1 or self.ranks <= 1:
            return 0.0
        bw = min(self.link_gb_s, self.inter_node_gb_s)
        lat = max(self.hop_latency_scale, self.inter_node_latency_scale)
        cross = _auto_time(nbytes, self.ranks, self.interconnect, bw, lat, False)
        own = _auto_time(nbytes, self.ranks, self.interconnect, self.link_gb_s, self.hop_latency_scale,
                         self.effect.nvls_enabled)
        return max(cross - own, 0.0)

    def _delta_us(self, nbytes: float, through_nccl: bool) -> float:
        """Extra time of one all-reduce of ``nbytes`` against NCCL left alone (0 with one rank)."""
        if self.ranks <= 1 or not through_nccl:
            return 0.0
        e = self.effect
        if e.algo == "auto" and e.proto == "auto" and e.transport_factor == 1.0:
            return 0.0
        lat, bw = self.hop_latency_scale, self.link_gb_s
        auto = _auto_time(nbytes, self.ranks, self.interconnect, bw, lat, e.nvls_enabled)
        forced = auto
        if e.algo != "auto" or e.proto != "auto":
            forced = _forced_time(nbytes, self.ranks, self.interconnect, bw, lat, e)
        return forced * e.transport_factor - auto

    def decode_delta_ms(self, bs: int) -> float:
        """Change of one decode step's time (ms) from the NCCL variables, batch of ``bs`` requests."""
        nbytes = bs * self.hidden_size * self.activation_bytes
        carried = self.effect.nccl_carries_decode or nbytes > self.custom_ar_max_bytes or self.nnodes > 1
        n = self.allreduces_per_token_layer * self.num_layers
        return n * (self._delta_us(nbytes, carried) + self._cross_node_us(nbytes)) / 1000.0

    def prefill_delta_ms(self, tokens: int) -> float:
        """Change of one prefill batch's time (ms) from the NCCL variables, ``tokens`` new tokens."""
        nbytes = tokens * self.hidden_size * self.activation_bytes
        carried = self.effect.nccl_carries_decode or nbytes > self.custom_ar_max_bytes or self.nnodes > 1
        n = self.allreduces_per_token_layer * self.num_layers
        return n * (self._delta_us(nbytes, carried) + self._cross_node_us(nbytes)) / 1000.0


def allreduce_us(
    nbytes: float, ranks: int, algo: str, proto: str, link_gb_s: float, latency_scale: float = 1.0
) -> float:
    """Time of one all-reduce (us) with a given algorithm and protocol (see the module docstring)."""
    bytes_per_us = link_gb_s * 1e3 * _EFFICIENCY[proto]
    hop = _HOP_US[proto] * latency_scale
    if algo == "Ring":
        hops = 2 * (ranks - 1)
        data = 2 * (ranks - 1) / ranks * nbytes
    elif algo == "Tree":  # one node: a chain, up and down, each link carrying the whole message
        hops = 2 * (ranks - 1)
        data = 2 * nbytes
    elif algo == "NVLS":  # NVSwitch multicast: reduction in the switch
        hops = 2
        data = nbytes / 1.5
        return 5.0 + hops * hop + data / bytes_per_us
    else:
        raise ValueError(f"no AllReduce model for {algo}")
    return hops * hop + data / bytes_per_us


def _pairs(algos: set[str] | tuple[str, ...], protos: set[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for a in sorted(algos):
        for p in sorted(protos):
            if a == "NVLS" and p != "Simple":
                continue
            out.append((a, p))
    return out


def _threshold_proto(nbytes: float, interconnect: Interconnect) -> str:
    """NCCL's own protocol pick by size (LL small, LL128 medium on NVLink, Simple large)."""
    if nbytes <= _AUTO_LL_MAX:
        return "LL"
    if nbytes <= _AUTO_LL128_MAX and interconnect == "nvlink":
        return "LL128"
    return "Simple"


def _forced_time(
    nbytes: float,
    ranks: int,
    interconnect: Interconnect,
    link_gb_s: float,
    latency_scale: float,
    effect: NcclEffect,
) -> float:
    """What NCCL does with the variables set: a forced algorithm still gets the protocol its size
    thresholds pick (if allowed), a forced protocol still runs on Ring (or NVLS); with both forced it
    takes the fastest allowed pair."""
    algos = set(effect.allowed_algos) if effect.algo != "auto" else {"Ring"}
    if effect.algo == "auto" and effect.nvls_enabled and interconnect == "nvlink" and nbytes > _AUTO_LL128_MAX:
        algos.add("NVLS")
    algos &= _ALLREDUCE_ALGOS[interconnect]
    best = math.inf
    for algo in algos:
        if effect.proto != "auto":
            protos = set(effect.allowed_protos)
        else:
            pick = _threshold_proto(nbytes, interconnect)
            protos = {pick} if pick in effect.allowed_protos else set(effect.allowed_protos)
        for a, p in _pairs({algo}, protos):
            best = min(best, allreduce_us(nbytes, ranks, a, p, link_gb_s, latency_scale))
    if best == math.inf:  # e.g. NVLS forced with a protocol chosen by size: NVLS runs Simple
        best = min(allreduce_us(nbytes, ranks, a, p, link_gb_s, latency_scale) for a, p in _pairs(algos, {"Simple"}))
    return best


def _auto_time(
    nbytes: float, ranks: int, interconnect: Interconnect, link_gb_s: float, latency_scale: float, nvls: bool
) -> float:
    """NCCL left alone: Ring (or NVLS where enabled) with the protocol its size thresholds pick."""
    if nvls and interconnect == "nvlink" and nbytes > _AUTO_LL128_MAX:
        return allreduce_us(nbytes, ranks, "NVLS", "Simple", link_gb_s, latency_scale)
    return allreduce_us(nbytes, ranks, "Ring", _threshold_proto(nbytes, interconnect), link_gb_s, latency_scale)


def _parse(value: str, known: Mapping[str, str], func: str) -> tuple[set[str] | None, str | None]:
    """Allowed set for collective ``func`` from an NCCL_ALGO/NCCL_PROTO value (``^`` = exclude, 2.24
    per-function syntax), or ``(None, bad_token)`` if a token is not recognised."""
    default: str | None = None
    for_func: str | None = None
    for part in value.split(";"):
        if ":" in part:
            name, lst = part.split(":", 1)
            if name.strip().lower() == func.lower():
                for_func = lst
        elif part.strip():
            default = part
    picked = for_func if for_func is not None else default
    if picked is None:
        return set(known.values()), None
    lst = picked.strip()
    negate = lst.startswith("^")
    tokens = [t.strip().lower() for t in lst.lstrip("^").split(",") if t.strip()]
    for tok in tokens:
        if tok not in known:
            return None, tok
    chosen = {known[t] for t in tokens}
    return (set(known.values()) - chosen if negate else chosen), None


def _names_only_others(value: str, func: str) -> bool:
    """An NCCL_ALGO value with no bare part that does not name ``func`` (NCCL 2.31 then leaves ``func`` with no
    algorithm wherever a bare NCCL_PROTO forces it)."""
    parts = [part for part in value.split(";") if part.strip()]
    if any(":" not in part for part in parts):
        return False
    return all(part.split(":", 1)[0].strip().lower() != func.lower() for part in parts)


def _bad_tokens(value: str, known: Mapping[str, str]) -> str | None:
    for part in value.split(";"):
        lst = part.split(":", 1)[1] if ":" in part else part
        for tok in lst.strip().lstrip("^").split(","):
            if tok.strip() and tok.strip().lower() not in known:
                return tok.strip()
    return None


NcclVersion = tuple[int, int, int]
#: Since 2.24 a bare NCCL_ALGO list applies to every collective with no fallback to Ring (env.rst).
_NO_RING_FALLBACK: NcclVersion = (2, 24, 0)
#: Since 2.31 NCCL_ALGO re-enables only the collectives it names (src/tuning/cost_model.cc).
_NAMED_ONLY: NcclVersion = (2, 31, 0)


def no_path_text(func: str, datatype: str, algo_env: str | None, proto_env: str | None,
                 nccl: NcclVersion = (2, 27, 3)) -> str:
    """NCCL's WARN body when no algorithm/protocol pair is left for a collective, in release ``nccl``'s words
    (enqueue.cc: "Error : no ..." up to 2.29, "No ..." in 2.30, "... nor symKernelId ..." from 2.31)."""
    if nccl >= _NAMED_ONLY:
        text = f"No algorithm/protocol nor symKernelId available for function {func} with datatype {datatype}."
    elif nccl >= (2, 30, 0):
        text = f"No algorithm/protocol available for function {func} with datatype {datatype}."
    else:
        text = f"Error : no algorithm/protocol available for function {func} with datatype {datatype}."
    if algo_env is not None:
        text += f" NCCL_ALGO was set to {algo_env}."
    if proto_env is not None:
        text += f" NCCL_PROTO was set to {proto_env}."
    return text


def nccl_effect_for(
    env: Mapping[str, str],
    *,
    tp_size: int,
    interconnect: Interconnect,
    version: tuple[int, int, int],
    nccl: NcclVersion = (2, 27, 3),
    enable_nccl_nvls: bool,
    disable_custom_all_reduce: bool,
    p2p_disable_factor: float,
    shm_disable_factor: float,
) -> NcclEffect:
    """Whether the NCCL variables are legal for SGLang's collectives on this interconnect under NCCL ``nccl``
    (``version`` is SGLang's), and what they force."""
    if tp_size <= 1:
        return NcclEffect()
    algo_env, proto_env = env.get("NCCL_ALGO"), env.get("NCCL_PROTO")
    for name, value, known in (("NCCL_ALGO", algo_env, _ALGOS), ("NCCL_PROTO", proto_env, _PROTOS)):
        if value is None:
            continue
        bad = _bad_tokens(value, known)
        if bad is not None:
            reason = f'Unrecognized element token "{bad}" when parsing {name}={value}'
            return NcclEffect(error=reason, warn=reason)
    ar_algos, _ = _parse(algo_env, _ALGOS, "AllReduce") if algo_env else (set(_ALGOS.values()), None)
    ag_algos, _ = _parse(algo_env, _ALGOS, "AllGather") if algo_env else (set(_ALGOS.values()), None)
    ar_protos, _ = _parse(proto_env, _PROTOS, "AllReduce") if proto_env else (set(_PROTOS.values()), None)
    ag_protos, _ = _parse(proto_env, _PROTOS, "AllGather") if proto_env else (set(_PROTOS.values()), None)
    assert ar_algos is not None and ag_algos is not None and ar_protos is not None and ag_protos is not None
    # SGLang sets NCCL_NVLS_ENABLE=0 unless --enable-nccl-nvls; 0.5.2 overwrites a user value, 0.5.5+ keeps it.
    if version < (0, 5, 5) or "NCCL_NVLS_ENABLE" not in env:
        nvls_on = enable_nccl_nvls
    else:
        nvls_on = env["NCCL_NVLS_ENABLE"] in ("1", "2") and interconnect == "nvlink"
    usable = set(_ALLREDUCE_ALGOS[interconnect])
    if not nvls_on:
        usable.discard("NVLS")
    # NVLSTree needs several nodes; CollNet a SHARP network; PAT has no AllReduce.
    ar_usable = ar_algos & usable
    ar_pairs = _pairs(ar_usable, ar_protos)
    if not ar_pairs:
        reason = no_path_text("AllReduce", "ncclBfloat16", algo_env, proto_env, nccl)
        return NcclEffect(error=reason, warn=reason)
    ag_usable = ag_algos & (_ALLGATHER_ALGOS[interconnect] - (set() if nvls_on else {"NVLS"}))
    allgather_error = None
    if nccl < _NO_RING_FALLBACK and not _pairs(ag_usable, ag_protos):
        ag_usable = {"Ring"}  # before 2.24 a collective the list left without an algorithm fell back to Ring
    named_only = nccl >= _NAMED_ONLY and algo_env is not None and _names_only_others(algo_env, "AllGather")
    bare_proto = proto_env is not None and any(":" not in part and part.strip() for part in proto_env.split(";"))
    if not _pairs(ag_usable, ag_protos) or (named_only and bare_proto):
        allgather_error = no_path_text("AllGather", "ncclBfloat16", algo_env, proto_env, nccl)
    p2p_level = env.get("NCCL_P2P_LEVEL", "").upper()
    p2p_off = (
        env.get("NCCL_P2P_DISABLE") == "1"
        or p2p_level in ("LOC", "0")
        or (p2p_level == "NVL" and interconnect == "pcie")
    )
    transport = 1.0
    if p2p_off:
        transport = shm_disable_factor if env.get("NCCL_SHM_DISABLE") == "1" else p2p_disable_factor
    custom_ar_off_warning = interconnect == "pcie" and tp_size > 2 and not disable_custom_all_reduce
    custom_ar = not disable_custom_all_reduce and not p2p_off and (interconnect == "nvlink" or tp_size <= 2)
    forced_algo = "auto" if algo_env is None else "/".join(sorted({a for a, _ in ar_pairs}))
    forced_proto = "auto" if proto_env is None else "/".join(sorted({p for _, p in ar_pairs}))
    return NcclEffect(
        warn=allgather_error,
        allgather_error=allgather_error,
        custom_allreduce_disabled_warning=custom_ar_off_warning,
        algo=forced_algo,
        proto=forced_proto,
        allowed_algos=tuple(sorted({a for a, _ in ar_pairs})),
        allowed_protos=tuple(sorted({p for _, p in ar_pairs})),
        nccl_carries_decode=not custom_ar,
        nvls_enabled=nvls_on,
        ll128_unsupported=interconnect == "pcie" and proto_env is not None and "LL128" in ar_protos,
        transport_factor=transport,
    )
