"""What one simulated server holds on its GPUs: which GPUs it runs on, the memory and utilisation it
publishes to the state directory (``procs/<pid>.json``, read by the simulated nvidia-smi), and what other
live simulated processes hold on the same GPUs."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from runners.simhost.engine import Batch, RuntimeSpec
from runners.simhost.launch import SimLaunch
from runners.simhost.profile import SimProfile
from runners.simhost.state import ProcEntry, live_procs, process_start_time, remove_proc, write_proc


def gpu_indices(profile: SimProfile, launch: SimLaunch) -> list[int]:
    """The GPUs a launch runs on: ``CUDA_VISIBLE_DEVICES`` (else every GPU of the host) from ``--base-gpu-id``
    on, one per TP x DP rank of this node."""
    visible_env = launch.env.get("CUDA_VISIBLE_DEVICES")
    if visible_env is not None:
        visible = [int(x) for x in visible_env.split(",") if x.strip().isdigit()]
    else:
        visible = list(range(profile.host.gpu_count))
    visible = [g for g in visible if g < profile.host.gpu_count]
    base = int(launch.args.get("base_gpu_id") or 0)
    return visible[base : base + launch.local_ranks]


class GpuMemory:
    """This process's entry in the state directory. Written at once during start-up; once serving
    (:meth:`publish_in_background`) a thread writes it, since the scheduler must not wait for the file system."""

    def __init__(self, state_dir: Path, gpus: list[int]) -> None:
        self.state_dir = state_dir
        self.gpus = gpus
        self.pid = os.getpid()
        self.start_time = process_start_time(self.pid)
        self.others: dict[int, list[tuple[int, float]]] = {}
        """GPU -> (pid, GiB) of every other live simulated process holding memory on it."""
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._background = False
        self._used_gib = 0.0
        self._transient_gib = 0.0
        self._util = 0

    def note_others(self) -> None:
        """Record the memory other live simulated processes hold on this server's GPUs."""
        for entry in live_procs(self.state_dir):
            if entry.pid == self.pid:
                continue
            for g in self.gpus:
                if entry.used_mib.get(g, 0) > 0:
                    self.others.setdefault(g, []).append((entry.pid, entry.used_mib[g] / 1024))

    def other_used_gib(self) -> list[float]:
        """Per GPU of this server, the GiB other processes hold ([0.0] with no GPU)."""
        return [sum(gib for _, gib in self.others.get(g, [])) for g in self.gpus] or [0.0]

    def set_used(self, gib: float) -> None:
        self._used_gib = gib
        self.publish()

    def set_util(self, percent: int) -> None:
        self._util = percent
        self.publish()

    def note_transient(self, batch: Batch, spec: RuntimeSpec) -> None:
        """The caching allocator keeps the largest working set it has seen: nvidia-smi shows it."""
        if batch.kind == "prefill":
            gib = spec.first_forward_gib + spec.prefill_gib(batch.new_tokens)
        elif not batch.graph:
            gib = spec.first_forward_gib + spec.eager_gib(max(n for n, _, _ in batch.decode_steps))
        else:
            gib = spec.first_forward_gib
        if gib > self._transient_gib + 1 / 1024:
            self._transient_gib = gib
            self.publish()

    def publish_in_background(self) -> None:
        """From now on :meth:`publish` only asks the writer thread (started here) to write soon."""
        self._background = True
        threading.Thread(target=self._writer, name="sim-state", daemon=True).start()

    def publish(self) -> None:
        """Write this process's GPU memory to the state directory now (start-up) or soon (serving)."""
        if self._background:
            self._wanted.set()
            return
        self._write()

    def withdraw(self) -> None:
        """Remove this process's entry: its memory is free (before an exit that is not a death)."""
        remove_proc(self.state_dir, self.pid)

    def _writer(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            self._write()

    def _write(self) -> None:
        if not self.gpus:
            return
        used = round((self._used_gib + self._transient_gib) * 1024)
        with self._lock:
            write_proc(
                self.state_dir,
                ProcEntry(
                    pid=self.pid,
                    start_time=self.start_time,
                    name=sys.executable,
                    kind="sglang-sim",
                    gpus=self.gpus,
                    used_mib={g: used for g in self.gpus},
                    util={g: self._util for g in self.gpus},
                    pgid=os.getpgid(0),
                ),
            )
