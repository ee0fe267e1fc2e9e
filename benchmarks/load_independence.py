"""Do a simulated configuration's figures depend on how busy the machine running the simulated host is?

Two configurations the pure model calls equal (the demo's seed-003 host, DeepSeek-V4-Flash NVFP4 TP4 on
4x RTX PRO 6000: mem-fraction 0.69 and 0.79 with --cuda-graph-max-bs 64; ``predict`` gives both the same
output throughput) are launched as real simulated servers, each ``--launches`` times with the same seeds,
and measured by ``runners/loadgen.py`` (the file servetune copies to a host) with the demo's workload. The
objective (output tok/s at C=64) is printed per launch and as a spread, ``(max - min) / median`` over both
configurations' launches, beside the profile's run-to-run noise:

* idle, and with one CPU-bound process per core (started here, stopped by PID);
* on the server's own simulated clock (what servetune measures: the load generator reads the ``sim_time_s``
  of each streamed chunk and declares its level) and, for comparison, on the wall clock times the speed
  (``--time-scale SPEED``, how figures were taken before).

Target: on the simulated clock the loaded spread is within the profile's noise + 1%. Every figure is
simulated (the host is a simulator); the timings of this machine are only what is being ruled out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml
from _common import PROFILES, ROOT, metadata

PROFILE = PROFILES / "dsv4-flash-nvfp4-tp4-rtxpro6000.yaml"
FLAGS = ("--model-path", "/models/DeepSeek-V4-Flash-NVFP4", "--tp", "4", "--trust-remote-code",
         "--moe-runner-backend", "triton", "--cuda-graph-max-bs", "64")
CONFIGS = {"mem-fraction 0.69": "0.69", "mem-fraction 0.79": "0.79"}
READY = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def predicted(mfs: str, seed: int | None) -> float:
    """The pure model's output tok/s at C=64 (``predict``), with a seed's noise or without."""
    cmd = [sys.executable, "-m", "runners.simhost", "predict", "--sim-profile", str(PROFILE), *FLAGS,
           "--mem-fraction-static", mfs, "--concurrency", "64", "--input-len", "256", "--output-len", "96",
           "--num-requests", "64"]
    if seed is not None:
        cmd += ["--sim-seed", str(seed)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)["levels"][0]["output_throughput"])


def launch(mfs: str, seed: int, speed: float, clock: str, tmp: Path) -> float:
    """Start one simulated server, run the demo's sweep with the load generator, stop the server by its
    process group; the output tok/s at C=64."""
    port = free_port()
    log = tmp / f"server-{mfs}-{seed}-{clock}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVETUNE_SIM", "NCCL_"))}
    env.update(PYTHONPATH=str(ROOT), SERVETUNE_SIM_STATE=str(tmp / "state"))
    with log.open("wb") as fh:
        server = subprocess.Popen(
            [sys.executable, "-m", "runners.simhost.server", "--sim-profile", str(PROFILE), *FLAGS,
             "--mem-fraction-static", mfs, "--host", "127.0.0.1", "--port", str(port), "--sim-speed", str(speed),
             "--sim-seed", str(seed)],
            cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while READY not in log.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {log.read_text(errors='replace')[-500:]}")
            time.sleep(0.05)
        scale = ["--time-scale", "auto"] if clock == "simulated" else ["--time-scale", str(speed)]
        out = subprocess.run(
            [sys.executable, str(ROOT / "runners" / "loadgen.py"), "--base-url", f"http://127.0.0.1:{port}",
             "--levels", "1,16,64", "--requests", "2,16,64", "--input-len", "256", "--output-len", "96",
             "--warmup", "1", "--timeout", "600", *scale],
            capture_output=True, text=True, check=True).stdout
        records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        top = records[-1]
        if top["max_concurrency"] != 64 or top["completed"] != 64 or top["clock"] != clock:
            raise RuntimeError(f"unexpected record: {top}")
        return float(top["output_throughput"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@contextlib.contextmanager
def hogs(n: int) -> Iterator[list[int]]:
    """``n`` CPU-bound processes (one per core), stopped by the PIDs recorded here."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=3, help="launches per configuration and condition")
    parser.add_argument("--speed", type=float, default=100.0, help="--sim-speed (the demo's: 100)")
    parser.add_argument("--clocks", default="simulated,wall", help="which clocks to measure on")
    args = parser.parse_args()
    noise = float(yaml.safe_load(PROFILE.read_text())["timing"]["noise_pct"])
    seeds = list(range(1, args.launches + 1))
    model = {name: predicted(mfs, None) for name, mfs in CONFIGS.items()}
    model_seeded = [predicted(mfs, s) for mfs in CONFIGS.values() for s in seeds]
    print(json.dumps(metadata()))
    print(f"profile {PROFILE.name}: noise {noise:g}% per launch (simulated); demo workload, C=64, "
          f"--sim-speed {args.speed:g}")
    print("pure model (predict), output tok/s at C=64: "
          + ", ".join(f"{name} {v:.2f}" for name, v in model.items())
          + f"; with seeds {seeds}: spread {spread(model_seeded) * 100:.1f}% (the noise alone)")
    tmp = Path(tempfile.mkdtemp(prefix="servetune-bench-load-"))
    for clock in args.clocks.split(","):
        for condition in ("idle", "loaded"):
            cm = hogs(os.cpu_count() or 1) if condition == "loaded" else contextlib.nullcontext([])
            with cm as pids:
                figures = {name: [launch(mfs, s, args.speed, clock, tmp) for s in seeds]
                           for name, mfs in CONFIGS.items()}
            every = [v for vs in figures.values() for v in vs]
            off = max(abs(v / m - 1) for v, m in zip(every, model_seeded, strict=True))
            per = "; ".join(f"{name}: " + " ".join(f"{v:.2f}" for v in vs) for name, vs in figures.items())
            hog_note = f" ({len(pids)} CPU hogs, PIDs {pids})" if pids else ""
            print(f"{clock} clock, {condition}{hog_note}: spread {spread(every) * 100:.1f}% "
                  f"(target <= noise spread + 1% = {(spread(model_seeded) + 0.01) * 100:.1f}%), "
                  f"median {statistics.median(every):.2f} tok/s (model with the same seeds "
                  f"{statistics.median(model_seeded):.2f}), furthest launch from its seed's model "
                  f"{off * 100:.1f}%; {per}")


if __name__ == "__main__":
    main()
