"""A simulated SGLang server: ``python -m runners.simhost.server --sim-profile FILE [SGLang flags]``.

It parses SGLang's ``launch_server`` flags for the emulated version (``--sim-version`` or
``$SERVETUNE_SIM_VERSION``, default 0.5.10), replays the start-up of
:func:`runners.simhost.model.plan_startup` with SGLang's log lines on stderr, then serves SGLang's HTTP
endpoints from a continuous-batching scheduler (:mod:`runners.simhost.engine`) on ``--host``/``--port``
only. Every duration is the model's simulated time divided by ``--sim-speed`` (or
``$SERVETUNE_SIM_SPEED``); everything reported (log timestamps, ``elapsed=`` fields, throughputs) is on
that compressed clock, and ``/get_server_info`` says ``"simulated": true`` and ``"sim_speed"`` so a
client can convert back.

Death is SGLang's: the failing scheduler logs ``Scheduler hit an exception`` with the traceback, the main
process logs the SIGQUIT line (and ``kill_process_tree called`` from 0.5.13) and SIGKILLs itself, so a
shell sees 137. SIGTERM shuts down like uvicorn (exit 0) once HTTP is up and kills the process before;
``--sim-ignore-sigterm`` (or ``SERVETUNE_SIM_IGNORE_SIGTERM=1``) ignores it, holding the simulated GPU
memory until SIGKILL.

The process is this module; its parts are :mod:`runners.simhost.simlog` (what it prints),
:mod:`runners.simhost.scheduler` (continuous batching on the compressed clock), :mod:`runners.simhost.api`
(the HTTP endpoints) and :mod:`runners.simhost.gpumem` (the GPU memory it publishes for nvidia-smi).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from runners.simhost import texts
from runners.simhost.api import dummy_health_server, http_server
from runners.simhost.engine import Batch, OomDetail, RuntimeSpec
from runners.simhost.gpumem import GpuMemory, gpu_indices
from runners.simhost.launch import BadFlag, SimLaunch, build_parser, emulated_version
from runners.simhost.model import (
    WARMUP_MAX_NEW_TOKENS,
    WARMUP_PROMPT,
    Failure,
    ResolvedArgs,
    StartupPlan,
    numerics_of,
    oom_text,
    plan_startup,
)
from runners.simhost.profile import ProfileError, SimProfile, load_profile
from runners.simhost.rendezvous import Rendezvous, RendezvousError
from runners.simhost.scheduler import Scheduler
from runners.simhost.simlog import SG_SOURCE, SimLog, server_args_line, traceback
from runners.simhost.state import (
    HostState,
    default_state_dir,
    write_host,
)

__all__ = ["DEFAULT_DIST_TIMEOUT_S", "SimServer", "main"]

DEFAULT_DIST_TIMEOUT_S = 600
"""torch's default process-group timeout for NCCL (``default_pg_nccl_timeout``, 10 minutes), which SGLang keeps
when ``--dist-timeout`` is not given."""


class SimServer:
    """One simulated SGLang server process (see the module docstring)."""

    def __init__(
        self,
        profile: SimProfile,
        launch: SimLaunch,
        *,
        speed: float,
        seed: int,
        state_dir: Path,
        ignore_sigterm: bool,
    ) -> None:
        self.profile = profile
        self.launch = launch
        self.speed = speed
        self.seed = seed
        self.state_dir = state_dir
        self.ignore_sigterm = ignore_sigterm
        self.v = launch.version_tuple
        self.pid = os.getpid()
        self.gpu_memory = GpuMemory(state_dir, gpu_indices(profile, launch))
        self.log = SimLog(launch.tp_size, launch.log_level, launch.args.get("log_level_http"),
                          first_rank=launch.first_rank, local_ranks=launch.local_ranks)
        self.ranks = range(launch.first_rank, launch.first_rank + launch.local_ranks)
        """This node's TP ranks (all of them on one node)."""
        self.rendezvous: Rendezvous | None = None
        self.world_others_gib = 0.0  # the most memory other processes hold on any GPU of any node (multi-node)
        self.ready = threading.Event()
        self.http_up = False
        self.plan: StartupPlan | None = None
        self.first_forward_failure: Failure | None = None
        self.runtime: RuntimeSpec | None = None
        self.scheduler: Scheduler | None = None
        self.httpd: http.server.ThreadingHTTPServer | None = None
        self._dying = threading.Lock()
        self.context_len = profile.model.context_length
        self.numerics = numerics_of(profile, launch)
        self.served_name = launch.served_model_name or launch.model_path
        self.started_wall = time.time()

    @property
    def gpus(self) -> list[int]:
        return self.gpu_memory.gpus

    def sleep_sim(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.speed)

    # -- signals --------------------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if not self._dying.acquire(blocking=False):
            return
        if self.http_up:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn(f"Finished server process [{self.pid}]")
            if self.v >= (0, 5, 13):
                self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=False, pid={self.pid}")
            self.gpu_memory.withdraw()
            os._exit(0)
        self.gpu_memory.withdraw()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(self.pid, signum)

    # -- dying ----------------------------------------------------------------------------------------------
    def _oom_message(self, phase: str, detail: OomDetail, rank: int) -> str:
        """The traceback a rank logs after ``Scheduler hit an exception: `` for an OOM in ``phase``."""
        local = rank - self.launch.first_rank
        gpu = self.gpus[local] if local < len(self.gpus) else local
        text = oom_text(detail, gpu=local, others=self.gpu_memory.others.get(gpu, []))
        arch = self.profile.model.architecture
        if phase != "cuda_graph":
            return traceback(phase, arch, f"torch.OutOfMemoryError: {text}")
        runner = f"{SG_SOURCE}/model_executor/cuda_graph_runner.py"
        inner = (
            "Traceback (most recent call last):\n"
            f'  File "{runner}", line 649, in __init__\n    self.capture()\n'
            f'  File "{runner}", line 741, in capture\n'
            "    ) = self.capture_one_batch_size(bs, forward, stream_idx)\n"
            f'  File "{runner}", line 880, in capture_one_batch_size\n    run_once()\n'
            f"torch.OutOfMemoryError: {text}"
        )
        outer = traceback("cuda_graph", arch, texts.capture_failed_exception(self.v, text))
        return f"{inner}\n\nDuring handling of the above exception, another exception occurred:\n\n{outer}"

    def _die(self, messages: list[str], running: bool) -> None:
        """Log each rank's scheduler exception, the main process's SIGQUIT handling, then SIGKILL itself."""
        self._dying.acquire(blocking=False)
        for rank, message in zip(self.ranks, messages, strict=False):
            self.log.line(f"Scheduler hit an exception: {message}", rank=rank, level="error")
        self.log.line(texts.sigquit_line(self.v, running=running), level="error")
        if self.v >= (0, 5, 13):
            self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=True, pid={self.pid}")
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.kill(self.pid, signal.SIGKILL)
        time.sleep(60)  # not reached: SIGKILL cannot be caught

    def _die_startup(self, failure: Failure) -> None:
        ranks = self.ranks
        if failure.oom is not None and failure.stage != "prefill_graph":
            messages = [self._oom_message(failure.phase, failure.oom, r) for r in ranks]
        else:
            messages = [traceback(failure.phase, self.profile.model.architecture, failure.message) for _ in ranks]
        self._die(messages, running=False)

    def _nccl_warn(self, plan: StartupPlan) -> None:
        """NCCL's own ``NCCL WARN`` line per rank, printed when ``NCCL_DEBUG`` asks for warnings."""
        if plan.nccl.warn and self.launch.env.get("NCCL_DEBUG", "").upper() in ("WARN", "INFO", "TRACE"):
            host = socket.gethostname()
            for rank in self.ranks:
                self.log.raw(f"{host}:{self.pid}:{self.pid} [{rank}] NCCL WARN {plan.nccl.warn}")

    def die_first_forward(self, failure: Failure) -> None:
        """The first forward (warm-up) dies of ``failure`` in the scheduler, e.g. NCCL's AllGather error."""
        assert self.plan is not None
        self._nccl_warn(self.plan)
        arch = self.profile.model.architecture
        self._die([traceback("warmup", arch, failure.message) for _ in self.ranks], running=True)

    def die_runtime(self, batch: Batch) -> None:
        assert batch.oom is not None
        self._die([self._oom_message(batch.phase, batch.oom, r) for r in self.ranks], running=True)

    # -- start-up -------------------------------------------------------------------------------------------
    def run(self) -> int:
        self._install_signals()
        p, launch = self.profile, self.launch
        write_host(self.state_dir, HostState.from_spec(p.host, p.name, self.state_dir, p.power))
        self.gpu_memory.note_others()
        plan = plan_startup(p, launch, other_used_gib=self.gpu_memory.other_used_gib(), seed=self.seed)
        self.plan = plan
        fail = plan.failure
        r = plan.resolved
        assert r is not None
        self.context_len = r.context_len
        fail = self._start_init(plan, r, fail)
        plan = self.plan  # a server spanning nodes plans again once the nodes met (the world's free memory)
        r = plan.resolved
        assert r is not None
        self._start_weights(plan, fail)
        pool_used = self._start_kv_pool(plan, r, fail)
        self._start_decode_graphs(plan, fail, pool_used)
        self._start_prefill_graphs(plan, fail, pool_used)
        if self.rendezvous is not None:
            self.rendezvous.started()  # the head's start-up collectives need every node
        self._start_summary(plan, r, fail, pool_used)
        if launch.node_rank >= 1:
            return self._serve_worker()
        return self._serve(plan)

    # -- multi-node -----------------------------------------------------------------------------------------
    def _meet(self, plan: StartupPlan) -> StartupPlan:
        """Meet the other nodes at ``--dist-init-addr`` (dying as torch does when one does not come within
        ``--dist-timeout``), watch them from then on, and plan again with the world's free memory."""
        launch = self.launch
        arch = self.profile.model.architecture
        if not launch.dist_init_addr:
            self._die([traceback("init", arch, "AssertionError: please provide --dist-init-addr as host:port of "
                                 "head node") for _ in self.ranks], running=False)
        timeout = launch.dist_timeout if launch.dist_timeout is not None else DEFAULT_DIST_TIMEOUT_S
        assert launch.dist_init_addr is not None
        meeting = Rendezvous(addr=launch.dist_init_addr, nnodes=launch.nnodes, rank=launch.node_rank,
                             ranks_per_node=launch.local_ranks, timeout_s=timeout / self.speed,
                             shown_timeout_s=timeout)
        try:
            world = meeting.join(max(self.gpu_memory.other_used_gib()))
        except RendezvousError as exc:
            self._die([traceback("init", arch, str(exc)) for _ in self.ranks], running=False)
        self.rendezvous = meeting
        self.world_others_gib = world
        meeting.watch(self._peer_lost)
        self.plan = plan_startup(self.profile, launch, other_used_gib=self.gpu_memory.other_used_gib(),
                                 seed=self.seed, world_other_used_gib=world)
        return self.plan

    def _peer_lost(self) -> None:
        """Another node's process died: this node's ranks wait in their next collective until the watchdog
        (``--watchdog-timeout``) gives up, then die of NCCL's remote error."""
        self.sleep_sim(self.launch.watchdog_timeout)
        if self.http_up:
            self.log.line(f"Watchdog timeout (self.watchdog_timeout={self.launch.watchdog_timeout!r})", rank=0,
                          level="error")
        phase = "decode" if self.http_up else "init"
        arch = self.profile.model.architecture
        text = texts.nccl_remote_error(self.profile.host.nccl_version)
        self._die([traceback(phase, arch, text) for _ in self.ranks], running=self.http_up)

    def _serve_worker(self) -> int:
        """A rank >= 1 of a multi-node server: no HTTP server of its own, SGLang's dummy health check on
        ``--host``/``--port`` (a background thread from 0.5.5, sglang#12297), then wait for the schedulers."""
        launch, log = self.launch, self.log
        try:
            self.httpd = dummy_health_server(launch.host, launch.port, ping=self.v >= (0, 5, 5))
        except OSError as exc:
            log.line(f"Dummy health check server failed to start: [Errno {exc.errno}] error while attempting to "
                     f"bind on address ({launch.host!r}, {launch.port}): {(exc.strerror or str(exc)).lower()}",
                     level="error")
            self.gpu_memory.withdraw()
            return 1
        self.gpu_memory.publish_in_background()
        threading.Thread(target=self.httpd.serve_forever, name="sim-health", daemon=True).start()
        if self.v >= (0, 5, 5):
            log.line(f"Dummy health check server started in background thread at {launch.host}:{launch.port}")
        else:
            log.line(f"Starting dummy health check server at {launch.host}:{launch.port}")
        self.ready.set()
        while True:
            time.sleep(1.0)

    def _start_init(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None) -> Failure | None:
        """The server-args line, torch distributed / NCCL init; return the start-up failure (the device
        check can add one)."""
        launch, log, v, mem = self.launch, self.log, self.v, plan.memory
        log.line(f"servetune simulated host: figures are simulated, not measured (sim_speed={self.speed:g})")
        for w in launch.warnings:
            log.line(w, level="warning")
        log.line(server_args_line(v, r.server_args))
        if len(self.gpus) < launch.local_ranks:
            fail = Failure(kind="error", phase="init", message="RuntimeError: CUDA error: invalid device ordinal")
        log.ranks("Init torch distributed begin.")
        if launch.nnodes > 1:
            ordinal = fail if fail is not None and "invalid device ordinal" in fail.message else None
            plan = self._meet(plan)
            fail = ordinal or plan.failure
        self.sleep_sim(plan.durations.get("dist_init", 0.0))
        if fail is not None and fail.phase == "init":
            if fail.kind == "nccl_error":
                self._nccl_warn(plan)
            self._die_startup(fail)
        if launch.nnodes > 1 and plan.resolved is not None and plan.resolved.tp_size > 1:
            log.ranks("Custom allreduce is disabled because this process group spans across nodes.", level="warning")
        elif plan.nccl.custom_allreduce_disabled_warning:
            log.ranks(
                "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
                "To silence this warning, specify disable_custom_all_reduce=True explicitly.",
                level="warning",
            )
        self.gpu_memory.set_used(plan.ctx_gib)
        log.ranks(texts.dist_init_end(v, plan.durations.get("dist_init", 0.0) / self.speed, plan.ctx_gib))
        assert mem.pre_load_avail_gib is not None and mem.weights_gib is not None
        # SGLang warns when the least free memory of any rank (the MIN all-reduce over the world) is under 0.9
        # of this rank's own, never for memory that every GPU lost alike (python/sglang/srt/model_executor/
        # model_runner.py, init_torch_distributed). Here: the freest GPU of this node against the fullest anywhere.
        others = self.gpu_memory.other_used_gib()
        local = mem.pre_load_avail_gib + max(others) - min(others)
        least = mem.pre_load_avail_gib - max(0.0, self.world_others_gib - max(others))
        if least < local * 0.9:
            log.ranks(
                f"The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                f"pre_model_load_memory={least:.2f}, local_gpu_memory={local:.2f}, "
                f"local_gpu_memory * 0.9={local * 0.9:.2f}",
                level="warning",
            )
        return fail

    def _start_weights(self, plan: StartupPlan, fail: Failure | None) -> None:
        p, log, mem = self.profile, self.log, plan.memory
        assert mem.pre_load_avail_gib is not None and mem.weights_gib is not None
        log.ranks(f"Load weight begin. avail mem={mem.pre_load_avail_gib:.2f} GB")
        load_s = plan.durations.get("load_weights", 0.0)
        target = mem.weights_gib
        if fail is not None and fail.phase == "load_weights":
            assert fail.oom is not None
            load_s, target = fail.elapsed_s, fail.oom.allocated_gib
        steps = 8
        for i in range(1, steps + 1):
            self.sleep_sim(load_s / steps)
            self.gpu_memory.set_used(plan.ctx_gib + target * i / steps)
        if fail is not None and fail.phase == "load_weights":
            self._die_startup(fail)
        assert mem.avail_after_weights_gib is not None
        log.ranks(
            texts.load_weight_end(
                self.v,
                elapsed_s=load_s / self.speed,
                arch=p.model.architecture,
                dtype=p.model.dtype,
                avail_gib=mem.avail_after_weights_gib,
                usage_gib=mem.weights_gib,
            )
        )

    def _start_kv_pool(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None) -> float:
        """The KV pool's lines; return the GiB in use once the memory pool is set up."""
        p, log, mem = self.profile, self.log, plan.memory
        self.sleep_sim(plan.durations.get("kv_pool", 0.0))
        if fail is not None and fail.phase == "kv_pool":
            self._die_startup(fail)
        assert mem.kv_tokens is not None and mem.kv_gib is not None and mem.free_after_pool_gib is not None
        assert mem.weights_gib is not None and mem.avail_after_weights_gib is not None
        for w in plan.warnings:
            log.line(w, rank=0, level="warning")
        if p.model.kv_pool == "deepseek_v4":
            assert mem.max_running_requests is not None
            log.ranks(texts.dsv4_pool_line(max_num_reqs=mem.max_running_requests, tokens=mem.kv_tokens))
        else:
            log.ranks(
                texts.kv_allocated(
                    self.v,
                    tokens=mem.kv_tokens,
                    kv_gib=mem.kv_gib,
                    mla=p.model.attention == "mla",
                    dtype=r.kv_torch_dtype,
                )
            )
        pool_used = plan.ctx_gib + mem.weights_gib + (mem.avail_after_weights_gib - mem.free_after_pool_gib)
        self.gpu_memory.set_used(pool_used)
        log.ranks(f"Memory pool end. avail mem={mem.free_after_pool_gib:.2f} GB")
        return pool_used

    def _start_decode_graphs(self, plan: StartupPlan, fail: Failure | None, pool_used: float) -> None:
        log, v, mem = self.log, self.v, plan.memory
        assert mem.free_after_pool_gib is not None
        capture = mem.capture_bs or []
        decode_fail = fail is not None and fail.phase == "cuda_graph" and fail.stage != "prefill_graph"
        if not (capture or decode_fail):
            return
        log.ranks(texts.capture_begin(v, avail_gib=mem.free_after_pool_gib, bs=capture))
        if fail is not None and decode_fail:
            self.sleep_sim(fail.elapsed_s)
            if fail.oom is not None:
                workspace = self.profile.memory.graph_workspace_gib
                self.gpu_memory.set_used(pool_used + fail.oom.private_pool_gib + workspace)
            self._nccl_warn(plan)
            self._die_startup(fail)
        self.sleep_sim(plan.durations.get("cuda_graph", 0.0))
        assert mem.graph_gib is not None
        decode_gib = mem.graph_gib - (mem.prefill_graph_gib or 0.0)
        log.ranks(
            texts.capture_end(
                v,
                elapsed_s=plan.durations.get("cuda_graph", 0.0) / self.speed,
                usage_gib=decode_gib,
                avail_gib=mem.free_after_pool_gib - decode_gib,
                bs=capture,
            )
        )

    def _start_prefill_graphs(self, plan: StartupPlan, fail: Failure | None, pool_used: float) -> None:
        log, v, mem = self.log, self.v, plan.memory
        ptokens = mem.prefill_graph_tokens or []
        if not ptokens:
            return
        assert mem.graph_gib is not None and mem.free_after_pool_gib is not None
        decode_gib = mem.graph_gib - (mem.prefill_graph_gib or 0.0)
        before = mem.free_after_pool_gib - decode_gib
        log.ranks(texts.prefill_capture_begin(v, avail_gib=before, tokens=ptokens))
        if fail is not None and fail.stage == "prefill_graph":
            self.sleep_sim(fail.elapsed_s)
            self.gpu_memory.set_used(pool_used + mem.graph_gib)
            if v < (0, 5, 14):
                log.ranks(f"Piecewise CUDA Graph failed with error: {fail.message.splitlines()[0]}", level="error")
            self._die_startup(fail)
        self.sleep_sim(plan.durations.get("prefill_graph", 0.0))
        log.ranks(
            texts.prefill_capture_end(
                v,
                elapsed_s=plan.durations.get("prefill_graph", 0.0) / self.speed,
                usage_gib=mem.prefill_graph_gib or 0.0,
                avail_gib=before - (mem.prefill_graph_gib or 0.0),
            )
        )

    def _start_summary(self, plan: StartupPlan, r: ResolvedArgs, fail: Failure | None, pool_used: float) -> None:
        mem = plan.memory
        if fail is not None and fail.phase == "warmup":
            self.first_forward_failure = fail  # the warm-up request's first forward dies (scheduler)
        assert mem.graph_gib is not None and mem.free_after_capture_gib is not None
        self.gpu_memory.set_used(pool_used + mem.graph_gib)
        assert mem.max_total_num_tokens is not None and mem.max_running_requests is not None
        if self.launch.node_rank:
            return  # TP rank 0's scheduler prints the summary
        self.log.line(
            texts.pool_summary(
                tokens=mem.max_total_num_tokens,
                chunked=r.chunked_prefill_size,
                max_prefill=r.max_prefill_tokens,
                max_running=mem.max_running_requests,
                context_len=r.context_len,
                avail_gib=mem.free_after_capture_gib,
            ),
            rank=0,
        )

    def _serve(self, plan: StartupPlan) -> int:
        """Bind the HTTP port, start the scheduler and warm-up, then wait; 1 when the port cannot be bound."""
        launch, log = self.launch, self.log
        self.runtime = plan.runtime
        assert self.runtime is not None
        self.sleep_sim(plan.durations.get("server_start", 0.0))
        try:
            self.httpd = http_server(self)
        except OSError as exc:
            log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"({launch.host!r}, {launch.port}): {(exc.strerror or str(exc)).lower()}",
                level="ERROR",
            )
            self.gpu_memory.withdraw()
            return 1
        self.gpu_memory.publish_in_background()
        self.scheduler = Scheduler(self, self.runtime)
        self.scheduler.start()
        log.uvicorn(f"Started server process [{self.pid}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        shown_host = f"[{launch.host}]" if ":" in launch.host else launch.host
        log.uvicorn(f"Uvicorn running on http://{shown_host}:{launch.port} (Press CTRL+C to quit)")
        self.http_up = True
        threading.Thread(target=self.httpd.serve_forever, name="sim-http", daemon=True).start()
        if launch.skip_server_warmup:
            self._ready()
        else:
            threading.Thread(target=self._warmup, name="sim-warmup", daemon=True).start()
        while True:
            time.sleep(1.0)

    def _ready(self) -> None:
        self._flood(float(os.environ.get("SERVETUNE_SIM_LOG_FLOOD_MB") or 0))
        self.ready.set()
        self.log.line("The server is fired up and ready to roll!")

    def _flood(self, megabytes: float) -> None:
        """A test knob (``SERVETUNE_SIM_LOG_FLOOD_MB`` in the server's environment): log this many MB of
        warnings as fast as the disk takes them just before the ready line, as a server with a chatty
        dependency does."""
        if megabytes <= 0:
            return
        line = "WARNING: a chatty dependency says the same thing again (simulated log flood) " + "." * 40 + "\n"
        block = line * (1024 * 1024 // len(line))
        for _ in range(int(megabytes * 1024 * 1024 // len(block))):
            self.log.raw(block)

    def _warmup(self) -> None:
        host = self.launch.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        info_path = "/model_info" if self.v >= (0, 5, 10) else "/get_model_info"
        plan = self.plan
        assert plan is not None
        try:
            conn = http.client.HTTPConnection(host, self.launch.port, timeout=600)
            conn.request("GET", info_path)
            conn.getresponse().read()
            self.sleep_sim(plan.durations.get("warmup", 0.0))
            body = json.dumps(
                {
                    "text": WARMUP_PROMPT,
                    "sampling_params": {"temperature": 0, "max_new_tokens": WARMUP_MAX_NEW_TOKENS},
                    "sim_warmup": True,
                }
            )
            conn.request("POST", "/generate", body=body, headers={"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status != 200:
                raise RuntimeError(f"warm-up /generate returned {resp.status}")
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            self.log.line(f"Initialization failed. warmup error: {exc}", level="error")
            if self.v >= (0, 5, 13):
                self.log.line(f"kill_process_tree called: parent_pid={self.pid}, include_parent=True, pid={self.pid}")
            os.kill(self.pid, signal.SIGKILL)
            return
        self._ready()

    # -- endpoint payloads ----------------------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        plan = self.plan
        assert plan is not None and plan.resolved is not None and self.runtime is not None
        mem = plan.memory
        sched = self.scheduler
        eng = sched.engine if sched else None
        state: dict[str, Any] = {
            "last_gen_throughput": sched.last_gen_throughput if sched else 0.0,
            "memory_usage": {
                "weight": round(mem.weights_gib or 0.0, 2),
                "kvcache": round(mem.kv_gib or 0.0, 2),
                "token_capacity": mem.max_total_num_tokens,
                "graph": round(mem.graph_gib or 0.0, 2),
            },
            "load": (len(eng.running) + len(eng.waiting)) if eng else 0,
        }
        if self.v >= (0, 5, 10):
            state["effective_max_running_requests_per_dp"] = mem.max_running_requests
        tokens = mem.max_total_num_tokens or 0
        return {
            **plan.resolved.server_args,
            "max_total_num_tokens": tokens,
            "max_req_input_len": max(min(self.context_len - 1, tokens - 1), 0),
            "internal_states": [state],
            "version": self.launch.version,
            "simulated": True,
            "sim_speed": self.speed,
            "sim_clock": True,  # streamed chunks carry sim_time_s; requests may declare their level
            "sim": {
                "profile": self.profile.name,
                "seed": self.seed,
                "gpus": self.gpus,
                "capture_bs": mem.capture_bs,
                "max_running_requests": mem.max_running_requests,
                "free_after_capture_gib": mem.free_after_capture_gib,
                "noise_factor": plan.noise_factor,
                "nccl": plan.nccl.model_dump(exclude={"warn"}),
                "startup_durations_s": plan.durations,
                "started_at": self.started_wall,
            },
        }

    def model_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_path": self.launch.model_path,
            "tokenizer_path": self.launch.args.get("tokenizer_path") or self.launch.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
        if self.v >= (0, 5, 10):
            info.update(
                {
                    "has_image_understanding": False,
                    "has_audio_understanding": False,
                    "model_type": self.profile.model.architecture.lower(),
                    "architectures": [self.profile.model.architecture],
                }
            )
        return info

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.served_name,
                    "object": "model",
                    "created": int(self.started_wall),
                    "owned_by": "sglang",
                    "root": self.served_name,
                    "max_model_len": self.context_len,
                }
            ],
        }

    def metrics(self) -> str:
        sched = self.scheduler
        eng = sched.engine if sched else None
        labels = f'engine_type="unified",model_name="{self.served_name}",tp_rank="0"'
        rows = [
            ("sglang:num_running_reqs", "The number of running requests.", len(eng.running) if eng else 0),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                len(eng.waiting) if eng else 0,
            ),
            ("sglang:num_used_tokens", "The number of used tokens.", eng.used_tokens if eng else 0),
            ("sglang:token_usage", "The token usage.", eng.token_usage if eng else 0.0),
            (
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                sched.last_gen_throughput if sched else 0.0,
            ),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                self.runtime.max_total_num_tokens if self.runtime else 0,
            ),
        ]
        out = []
        for name, help_text, value in rows:
            out += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} gauge",
                f"{name}{{{labels}}} {float(value)}",
            ]
        gen = eng.tokens_generated if eng else 0
        out += [
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f'sglang:generation_tokens_total{{model_name="{self.served_name}"}} {float(gen)}',
        ]
        return "\n".join(out) + "\n"



def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-version", default=None)
    known, _ = pre.parse_known_args(args)
    try:
        version = emulated_version(known.sim_version, env)
    except ValueError as exc:
        sys.stderr.write(f"servetune simhost: {exc}\n")
        return 2
    ns = build_parser(version, sim_flags=True).parse_args(args)
    speed = ns.sim_speed if ns.sim_speed is not None else float(env.get("SERVETUNE_SIM_SPEED") or 1.0)
    if not speed > 0:
        sys.stderr.write(f"servetune simhost: --sim-speed must be > 0, got {speed}\n")
        return 2
    ignore = bool(ns.sim_ignore_sigterm) or env.get("SERVETUNE_SIM_IGNORE_SIGTERM", "") in (
        "1",
        "true",
        "yes",
    )
    seed = ns.sim_seed if ns.sim_seed is not None else random.SystemRandom().randrange(1 << 31)
    state_dir = default_state_dir(env, explicit=ns.sim_state_dir)
    try:
        profile = load_profile(ns.sim_profile)
    except ProfileError as exc:
        sys.stderr.write(f"servetune simhost: {exc}\n")
        return 1
    try:
        launch = SimLaunch.from_namespace(ns, env, version)
    except BadFlag as exc:
        sys.stderr.write(exc.text)
        return exc.exit_code
    server = SimServer(profile, launch, speed=speed, seed=seed, state_dir=state_dir, ignore_sigterm=ignore)
    return server.run()


if __name__ == "__main__":
    raise SystemExit(main())

