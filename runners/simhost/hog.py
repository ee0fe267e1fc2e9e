"""A foreign process holding GPU memory on the simulated host, until it is killed.

``python -m runners.simhost.hog --mib N [--gpus 0,1] [--state-dir DIR]`` registers itself in the state
directory (so ``smi`` shows it and simulated servers see less free memory), prints one line
``holding N MiB on GPUs 0,1 (pid P)`` once registered, and waits. ``--hidden``: nvidia-smi lists no process for
it (another container's), only its memory. SIGTERM/SIGINT end it cleanly; a
SIGKILL also releases the memory, because entries of dead processes do not count.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from runners.simhost.state import ProcEntry, default_state_dir, process_start_time, remove_proc, write_proc

__all__ = ["HIDDEN", "main"]

HIDDEN = "hidden"
"""The kind of a process nvidia-smi does not list (another container's): only its memory shows."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.simhost.hog", description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, required=True, help="MiB held on each listed GPU")
    parser.add_argument("--gpus", default="0", help="comma-separated GPU indices (default 0)")
    parser.add_argument("--state-dir", default=None, help="default: $SERVETUNE_SIM_STATE or ~/.servetune/simhost")
    parser.add_argument("--util", type=int, default=0, help="utilization.gpu percent to report")
    parser.add_argument("--hidden", action="store_true",
                        help="a process of another container: its memory counts in memory.used, but nvidia-smi "
                        "lists no compute process for it (nvidia-smi in a container sees only its own)")
    args = parser.parse_args(argv)
    try:
        gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--gpus must be comma-separated integers, not {args.gpus!r}")
    state_dir = default_state_dir(explicit=args.state_dir)
    pid = os.getpid()

    def leave(signum: int, frame: FrameType | None) -> None:
        remove_proc(state_dir, pid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    write_proc(
        state_dir,
        ProcEntry(
            pid=pid,
            start_time=process_start_time(pid),
            name=sys.executable,
            kind=HIDDEN if args.hidden else "hog",
            gpus=gpus,
            used_mib={g: args.mib for g in gpus},
            util={g: args.util for g in gpus},
            pgid=os.getpgid(0),
        ),
    )
    print(f"holding {args.mib} MiB on GPUs {','.join(map(str, gpus))} (pid {pid})", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    raise SystemExit(main())
