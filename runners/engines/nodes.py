"""A server that spans nodes: one command per rank, from one launch value, the node addresses and a port.

:func:`render_nodes` is the seam every runner that starts a multi-node server uses (two SSH hosts taken together,
a Slurm job's nodes): given the launch config, the nodes' addresses in rank order (rank 0, the head, first) and
the dist-init port picked free on the head, it returns each rank's :class:`~runners.engines.script.RenderedLaunch`.
How an engine spells the ranks is its own (``Engine.node_flags``):

* SGLang: ``--nnodes N --node-rank R --dist-init-addr HEAD:PORT`` on every rank, ``--tp`` the total over the nodes
  (``srt/server_args.py``: ``tp_size must be divisible by number of nodes``); rank 0 serves HTTP, the others
  wait in their schedulers (``srt/entrypoints/engine.py``: ``if server_args.node_rank >= 1``).
* vLLM: ``--nnodes N --node-rank R --master-addr HEAD --master-port PORT``, ``--headless`` on ranks >= 1 (no API
  server there), ``--tensor-parallel-size`` the total.

A one-node launch renders the single-host command unchanged.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from runners.engines.base import Engine, LaunchLike
from runners.engines.common import dist_init_addr, flag_name
from runners.engines.script import RenderedLaunch, comment_text, render, script_text
from runners.errors import ConfigError

__all__ = ["DEFAULT_DIST_PORT", "RANK_FLAGS", "dist_init_addr", "render_node_script", "render_nodes"]

DEFAULT_DIST_PORT = 29500
"""The dist-init port an exported per-node script uses when none is given (torch's usual one)."""
_HEAD = "servetune-head.invalid"  # stands for the head's address while rendering the per-node script


def render_nodes(engine: Engine, launch: LaunchLike, version: str, addresses: Sequence[str], dist_port: int, *,
                 ports: Sequence[int] | None = None, header: Sequence[str] = ()) -> list[RenderedLaunch]:
    """One :class:`RenderedLaunch` per rank (rank order: ``addresses[0]`` is the head).

    ``ports``: the port each rank binds (rank 0 serves HTTP on it; SGLang's ranks >= 1 answer a health check
    there), default the launch's port on every node. Raises ConfigError when the engine release cannot span
    nodes, the tensor parallel size does not divide over them, or the fixed args set a rank flag themselves.
    """
    nnodes = len(addresses)
    if nnodes < 1:
        raise ConfigError("a server needs at least one node")
    if not 1 <= dist_port <= 65535:
        raise ConfigError(f"dist-init port {dist_port} is not a port (1-65535)")
    if ports is not None and len(ports) != nnodes:
        raise ConfigError(f"{len(ports)} ports for {nnodes} nodes")
    if nnodes == 1:
        return [render(engine, launch, version, header=header)]
    tp = engine.tp_size(launch.fixed_args)
    if tp % nnodes:
        raise ConfigError(f"tensor parallel size {tp} does not divide over {nnodes} nodes "
                          f"(--tp is the total over the nodes: {nnodes} x GPUs per node)")
    own = sorted({flag_name(a) for a in launch.fixed_args} & set(RANK_FLAGS))
    if own:
        raise ConfigError(f"fixed_args set {', '.join(own)}, which servetune sets per node; remove them")
    out = []
    for rank in range(nnodes):
        ranked = _Ranked(launch, launch.port if ports is None else ports[rank])
        argv = engine.rank_argv(ranked, version, nnodes=nnodes, rank=rank, head=addresses[0], dist_port=dist_port)
        env = engine.environment(ranked, version)
        lines = [*header, f"rank {rank} of {nnodes} nodes (head {dist_init_addr(addresses[0], dist_port)})"]
        out.append(RenderedLaunch(argv=argv, env=env, script=script_text(argv, env, lines)))
    return out


RANK_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr", "--master-addr", "--master-port",
              "--headless", "-n", "-r")
"""Flags servetune sets per rank, which ``fixed_args`` may not set (SGLang's and vLLM's spellings)."""


class _Ranked:
    """``launch`` with one rank's port (a :class:`LaunchLike`)."""

    def __init__(self, launch: LaunchLike, port: int) -> None:
        self.engine = launch.engine
        self.python = launch.python
        self.model_path = launch.model_path
        self.host = launch.host
        self.port = port
        self.knobs = launch.knobs
        self.flags = launch.flags
        self.fixed_args = launch.fixed_args
        self.env = launch.env
        self.engine_options = launch.engine_options


def render_node_script(engine: Engine, launch: LaunchLike, version: str, nnodes: int, *,
                       header: Sequence[str] = ()) -> str:
    """One bash script for every node of a server spanning ``nnodes`` nodes, the rank an argument:
    ``serve.sh RANK HEAD [DIST_PORT]`` (rank 0 on the head, whose address is HEAD). Rendered by
    :func:`render_nodes` from the same launch value, so each rank runs the command a trial's rank ran."""
    ranks = render_nodes(engine, launch, version, [_HEAD] * nnodes, DEFAULT_DIST_PORT)
    first, last = ranks[0].argv, ranks[-1].argv
    words: list[str] = []
    after = ""
    for arg in first:
        if after in ("--node-rank", "-r"):
            words.append('"$RANK"')
        elif after == "--master-port":
            words.append('"$DIST_PORT"')
        elif arg == dist_init_addr(_HEAD, DEFAULT_DIST_PORT):
            words.append('"$HEAD:$DIST_PORT"')
        elif arg == _HEAD:
            words.append('"$HEAD"')
        else:
            words.append(shlex.quote(arg))
        after = arg
    worker_only = last[len(first):]  # vLLM's --headless on ranks >= 1
    usage = f"usage: $0 RANK HEAD [DIST_PORT]  (RANK 0-{nnodes - 1}, 0 on the head; HEAD: the address of the head)"
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {comment_text(h)}" if h else "#" for h in header]
    lines += [
        f"# One server over {nnodes} nodes: run this script on every node with its rank, the head's address and the",
        f"# same free dist-init port (default {DEFAULT_DIST_PORT}); rank 0 (the head) serves HTTP.",
        "set -euo pipefail",
        f'RANK="${{1:?{usage}}}"',
        f'HEAD="${{2:?{usage}}}"',
        f'DIST_PORT="${{3:-{DEFAULT_DIST_PORT}}}"',
        f'case "$RANK" in {"|".join(str(r) for r in range(nnodes))}) ;; '
        f'*) echo "RANK must be 0-{nnodes - 1}, got $RANK" >&2; exit 2 ;; esac',
    ]
    lines += [f"export {key}={shlex.quote(ranks[0].env[key])}" for key in sorted(ranks[0].env)]
    if worker_only:
        lines.append("WORKER=()")
        lines.append(f'if [ "$RANK" -gt 0 ]; then WORKER=({" ".join(shlex.quote(a) for a in worker_only)}); fi')
        words.append('"${WORKER[@]}"')
    lines.append("exec " + " ".join(words))
    return "\n".join(lines) + "\n"
