"""The engine seam: what differs between SGLang, vLLM and the simulated host, and nothing else.

An :class:`Engine` knows, for one serving engine:

* how to ask a host for its version (which decides flag spellings);
* how to render a launch (knobs, fixed args, environment) into argv and environment for that version;
* how a server of that engine says it is ready (log line and/or ``/health``);
* how to read its log into :class:`~runners.telemetry.Telemetry` and spot fatal lines (a :class:`LogParser`);
* how to classify a death into a :class:`~runners.telemetry.Failure` (OOM, NCCL, rejected flag, crash);
* which HTTP API the load generator should speak (``sglang`` ``/generate`` or ``openai`` ``/v1/completions``);
* what callers ask of it instead of comparing names: whether it is simulated, which memory model fits it,
  and the tensor parallel size its flags ask for.

Adding an engine is one module in this package plus its tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from runners.engines.flags import FlagTable
from runners.telemetry import Failure, Phase, Telemetry

BenchApi = Literal["sglang", "openai"]
"""The HTTP API the load generator speaks to a server (``runners/loadgen.py`` ``--api``)."""
MemoryFamily = Literal["sglang", "vllm"]
"""Whose memory arithmetic a server follows: SGLang's static fraction, or vLLM's utilisation budget."""


@runtime_checkable
class LaunchLike(Protocol):
    """What an engine needs of a launch config (``spaces.launch.LaunchConfig`` satisfies it).

    ``knobs`` use servetune's canonical names (``mem_fraction_static``, ``cuda_graph_max_bs``,
    ``num_continuous_decode_steps``, ``max_running_requests``, ``chunked_prefill_size``, and for vLLM
    ``gpu_memory_utilization``, ``max_num_seqs``, ``max_num_batched_tokens``, ``cuda_graph_sizes``,
    ``max_model_len``, ``enforce_eager``, ``kv_cache_space_gib``); a value of None means "leave the flag out,
    let the engine pick its default". ``env`` holds environment variables that are set (NCCL variables
    left "unset" are absent). ``engine_options`` carries engine-specific settings such as the simulated
    host's profile and speed.
    """

    @property
    def engine(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def model_path(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def knobs(self) -> Mapping[str, Any]: ...
    @property
    def flags(self) -> Mapping[str, Any]:
        """Free engine flags searched, by their own spelling (``--schedule-policy``): None or false leave the flag
        out, true gives a switch alone."""
        ...
    @property
    def fixed_args(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def engine_options(self) -> Mapping[str, Any]: ...


@runtime_checkable
class LogParser(Protocol):
    """Reads one server's log line by line.

    ``phase`` is where the server is; ``ready_line`` is True once the engine's readiness line was seen;
    ``fatal`` is set by the first line that means the server is dying (it is evidence, the exit is proof);
    ``telemetry`` accumulates every memory figure seen.
    """

    telemetry: Telemetry
    phase: Phase
    ready_line: bool
    fatal: Failure | None

    def feed(self, line: str) -> None: ...


@runtime_checkable
class Engine(Protocol):
    name: str
    """``sglang``, ``vllm`` or ``sim``: the registry's name for it (:func:`runners.engines.get_engine`), for
    records and messages. Ask the traits below instead of comparing it."""
    bench_api: BenchApi
    """``sglang`` (POST /generate) or ``openai`` (POST /v1/completions)."""
    simulated: bool
    """Every figure it produces is simulated (the simulated SGLang host): it reads no model and no real GPU."""
    memory_family: MemoryFamily | None
    """Which memory model predicts its start-up (None: none fits)."""
    tp_flags: ClassVar[tuple[str, ...]]
    """The flags that set the tensor parallel size, as the engine's parser accepts them."""
    health_path: str
    needs_ready_line: bool
    """True when ``/health`` 200 alone is not readiness (SGLang: wait for the fired-up line too)."""
    scratch_vars: tuple[str, ...]
    """Environment variables pointed at per-trial scratch directories, removed after the stop
    (e.g. ``TMPDIR``; vLLM adds ``VLLM_CACHE_ROOT``). Leave shared compile caches out of it."""
    info_paths: tuple[str, ...]
    """Server-info endpoints to read after readiness, in the order to try them."""
    knob_flags: ClassVar[Mapping[str, str]]
    """The engine's knob -> flag table (base spelling; :meth:`knob_flag` respells it per version)."""
    env_knobs: ClassVar[Mapping[str, str]]
    """Knobs the engine takes as environment variables -> the variable."""
    owned_flags: ClassVar[frozenset[str]]
    """Flags servetune sets itself (bind address, port, model path, tensor parallel size): a space may not search
    them as free flags."""

    def flag_table(self, version: str | None) -> FlagTable | None:
        """The flag table of the release that answers for ``version`` (None: the newest tabled), or None when
        none ships (:mod:`runners.engines.flags`)."""
        ...

    def tp_flag(self, args: Sequence[str]) -> int | None:
        """The tensor parallel size ``args`` ask for with one of :attr:`tp_flags`; None when they name none."""
        ...

    def tp_size(self, args: Sequence[str]) -> int:
        """The tensor parallel size a server launched with ``args`` runs at (1 when they name none)."""
        ...

    def knob_flag(self, knob: str, version: str) -> str:
        """The flag (or environment variable) that carries ``knob`` in ``version``. Raises ConfigError for a
        knob this engine does not have."""
        ...

    def inert_knobs(self, version: str | None) -> dict[str, str]:
        """Knobs (``nccl.NAME`` for NCCL variables) that have no effect in ``version`` -> why, one line each;
        with ``version`` None (not known yet), those inert in every release the engine's knowledge covers."""
        ...

    def version_command(self, python: str) -> str:
        """Shell command that prints the engine version as its last stdout line."""
        ...

    def nccl_version_command(self, python: str) -> str:
        """Shell command that prints, as its last stdout line, the NCCL version the engine's torch loads
        (``2.27.3``); nothing when it loads none (a CPU build)."""
        ...

    def checkpoint_command(self, python: str, model_path: str) -> str:
        """Shell command that prints, as its last stdout line, the checkpoint's ``config.json`` and weights'
        size as JSON (:func:`runners.checkpoint.parse_checkpoint` reads it); nothing without a config.json."""
        ...

    def argv(self, launch: LaunchLike, version: str) -> list[str]:
        """The full command (python, ``-m``, module, flags) for this engine version."""
        ...

    def rank_argv(self, launch: LaunchLike, version: str, *, nnodes: int, rank: int, head: str,
                  dist_port: int) -> list[str]:
        """The command of rank ``rank`` of a server spanning ``nnodes`` nodes whose head (rank 0) is ``head``
        with its dist-init port ``dist_port`` (:func:`runners.engines.nodes.render_nodes` calls it). Raises
        ConfigError when ``version`` cannot span nodes."""
        ...

    def environment(self, launch: LaunchLike, version: str) -> dict[str, str]:
        """Environment variables to export for the server (NCCL knobs, engine-specific ones)."""
        ...

    def parser(self) -> LogParser: ...

    def classify(self, parser: LogParser, exit_code: int | None, log_tail: str,
                 evidence: Mapping[str, Any] | None = None) -> Failure:
        """Why a server died, from its log, exit code and any host evidence (e.g. cgroup oom_kill)."""
        ...
