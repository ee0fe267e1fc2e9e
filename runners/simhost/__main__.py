"""``python -m runners.simhost``: quick answers from the simulated-host model, and the nvidia-smi shim.

predict
    ``predict --sim-profile FILE [--sim-version X.Y.Z] [--sim-seed N] [--concurrency 1,16,64]
    [--input-len N] [--output-len N] [--num-requests N] [--request-rate R] [--other-used-gib G]
    [SGLang flags] [KEY=VALUE ...]``
    prints :func:`runners.simhost.model.evaluate`'s outcome as one JSON object. ``KEY=VALUE`` words are
    environment variables of the launch (NCCL_ALGO=Ring ...); every other word is an SGLang flag.

install-smi
    ``install-smi --sim-profile FILE --state-dir DIR --bin-dir DIR`` writes the simulated host into the
    state directory and an executable ``DIR/nvidia-smi`` (with its ``nvidia-smi.conf``) that runs
    ``runners.simhost.smi`` on it with this Python, from anywhere. Put ``--bin-dir`` first on ``PATH`` to
    make the simulated host's nvidia-smi the one a tool finds.

Exit codes: 0 when the command did its job (a predicted OOM is an answer, not an error), 1 for a bad
profile or file, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from runners.simhost.launch import DEFAULT_VERSION, emulated_version
from runners.simhost.model import Workload, predict_from_argv
from runners.simhost.profile import ProfileError, checkpoint_json, load_profile
from runners.simhost.state import HostState, write_host

__all__ = ["install_smi", "main"]

_ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
REPO_ROOT = Path(__file__).resolve().parents[2]


def install_smi(profile_path: str | Path, state_dir: Path, bin_dir: Path) -> Path:
    """Write ``host.json`` for the profile's host, and the ``nvidia-smi`` shim (``scripts/nvidia-smi``, shipped
    as a file) with its ``nvidia-smi.conf`` beside it; return the shim's path."""
    profile = load_profile(profile_path)
    state_dir = state_dir.expanduser().resolve()
    settings = [str(state_dir), sys.executable, str(REPO_ROOT)]
    if any("\n" in value for value in settings):
        raise OSError(f"a path of the nvidia-smi shim holds a line break: {settings}")
    write_host(state_dir, HostState.from_spec(profile.host, profile.name, state_dir, profile.power))
    bin_dir = bin_dir.expanduser().resolve()
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "nvidia-smi.conf").write_text("".join(f"{v}\n" for v in settings), encoding="utf-8")
    shim = bin_dir / "nvidia-smi"
    shim.write_bytes(resources.files("runners.simhost").joinpath("scripts", "nvidia-smi").read_bytes())
    shim.chmod(0o755)
    return shim


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from exc
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be positive integers")
    return levels


def _predict(args: argparse.Namespace, rest: Sequence[str]) -> int:
    env = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in rest if _ENV_WORD.match(w)}
    flags = [w for w in rest if not _ENV_WORD.match(w)]
    try:
        version = emulated_version(args.sim_version, os.environ)
        profile = load_profile(args.sim_profile)
    except (ValueError, ProfileError) as exc:
        sys.stderr.write(f"predict: {exc}\n")
        return 1
    workload = Workload(
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=args.concurrency,
        requests_per_level=args.num_requests,
        request_rate=args.request_rate,
    )
    outcome = predict_from_argv(
        profile, flags, env, workload, version=version, seed=args.sim_seed, other_used_gib=args.other_used_gib
    )
    json.dump(outcome.to_json_dict(), sys.stdout, indent=None if args.compact else 2)
    sys.stdout.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runners.simhost",
        allow_abbrev=False,
        description="servetune's simulated SGLang GPU host",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", allow_abbrev=False, help="print the model's outcome for a launch as JSON")
    pr.add_argument("--sim-profile", required=True)
    pr.add_argument("--sim-version", default=None, help=f"emulated SGLang version (default {DEFAULT_VERSION})")
    pr.add_argument("--sim-seed", type=int, default=None, help="add the run-to-run noise of this seed")
    pr.add_argument("--concurrency", type=_levels, default=(1,))
    pr.add_argument("--input-len", type=int, default=256)
    pr.add_argument("--output-len", type=int, default=128)
    pr.add_argument("--num-requests", type=int, default=None, help="requests per level (default 2 x C, >= 4)")
    pr.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="requests per simulated second (default: all at once)",
    )
    pr.add_argument("--other-used-gib", type=float, default=0.0, help="memory other processes hold per GPU")
    pr.add_argument("--compact", action="store_true", help="one line of JSON")
    ins = sub.add_parser("install-smi", allow_abbrev=False, help="write an nvidia-smi shim for a simulated host")
    ins.add_argument("--sim-profile", required=True)
    ins.add_argument("--state-dir", required=True, type=Path)
    ins.add_argument("--bin-dir", required=True, type=Path)
    ck = sub.add_parser("checkpoint", allow_abbrev=False,
                        help="print the checkpoint the profile describes: config.json and weights' size, as JSON")
    ck.add_argument("--sim-profile", required=True)
    ck.add_argument("--model-path", default=None, help="the space's model path (the simulated host reads none)")
    args, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "predict":
        return _predict(args, rest)
    if args.command == "checkpoint" and not rest:
        try:
            print(json.dumps(checkpoint_json(load_profile(args.sim_profile))))
        except ProfileError as exc:
            sys.stderr.write(f"checkpoint: {exc}\n")
            return 1
        return 0
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        shim = install_smi(args.sim_profile, args.state_dir, args.bin_dir)
    except (ProfileError, OSError) as exc:
        sys.stderr.write(f"install-smi: {exc}\n")
        return 1
    print(shim)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
