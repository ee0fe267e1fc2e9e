"""Spaces that cannot hang or lie (issue 23, row 8), through ``servetune validate`` and ``run`` as real
processes:

* a grid step so fine the grid would hold billions of values (``step: 1e-12``; ``1e-6`` made every trial's
  planning take minutes) is refused at once in one line naming the knob, the count and the coarsest step
  allowed; so is a grid of more than ``MAX_GRID`` configurations;
* ``fixed_args`` are matched as argparse matches them: ``--mem-fraction 0.95``, a unique prefix of the
  searched ``--mem-fraction-static``, is refused (it would override the search while the trial records the
  searched value), as is ``--mem_fraction_static=0.9``;
* a workload that cannot finish within the benchmark timeout even at the fastest decode any engine manages is
  a warning from ``validate``; a workload that fits is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from spaces.schema import MAX_GRID, MAX_KNOB_LEVELS, FloatRange, Knobs, load_space
from tests.search.overnight_kit import cli, make_space, trials


@pytest.mark.parametrize("step", [1e-12, 1e-6])
def test_a_grid_step_too_fine_is_one_line_at_once(tmp_path: Path, step: float) -> None:
    space = make_space(tmp_path / "space.yaml", knobs={"mem_fraction_static": {"low": 0.55, "high": 0.9,
                                                                                "step": step}})
    for command in (("validate", str(space)),
                    ("run", str(space), "--study", "fine", "--storage", f"sqlite:///{tmp_path}/s.db", "--no-mlflow",
                     "--no-live")):
        res = cli(*command, cwd=tmp_path, timeout=60)  # a hang fails here
        assert res.returncode == 1
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, res.stderr
        assert "knobs.mem_fraction_static: step" in lines[0] and f"at most {MAX_KNOB_LEVELS} are allowed" in lines[0]
    assert not (tmp_path / "s.db").exists() or trials(f"sqlite:///{tmp_path}/s.db", "fine") == []


def test_grid_limits() -> None:
    assert FloatRange(low=0.55, high=0.9, step=0.01).levels() == 36
    FloatRange(low=0.0, high=1.0, step=1 / (MAX_KNOB_LEVELS - 1))  # exactly the most levels allowed
    with pytest.raises(ValidationError, match="at most 1000 are allowed"):
        FloatRange(low=0.0, high=1.0, step=1 / MAX_KNOB_LEVELS)
    many = {"choices": list(range(1, 1001))}
    with pytest.raises(ValidationError, match=f"at most {MAX_GRID:,} are allowed"):
        Knobs(max_running_requests=many, chunked_prefill_size=many, cuda_graph_max_bs={"choices": [1, 2, 4, 8, 16, 32,
                                                                                                    64, 128, 256, 512,
                                                                                                    1024]})


@pytest.mark.parametrize(("fixed", "flag"), [
    (["--mem-fraction", "0.95"], "--mem-fraction-static"),
    (["--mem-frac=0.95"], "--mem-fraction-static"),
    (["--mem_fraction_static=0.9"], "--mem-fraction-static"),
    (["--cuda-graph-max", "8"], "--cuda-graph-max-bs"),
])
def test_a_fixed_arg_argparse_would_expand_to_a_searched_flag_is_refused(tmp_path: Path, fixed: list[str],
                                                                         flag: str) -> None:
    space = make_space(tmp_path / "space.yaml", fixed_args=fixed)
    res = cli("validate", str(space), cwd=tmp_path, timeout=60)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"servetune: error: {space}: fixed_args: "), res.stderr
    assert flag in lines[0] or "is the flag of knob" in lines[0]


def test_a_fixed_arg_that_is_no_searched_flags_prefix_is_checked_against_the_release(tmp_path: Path) -> None:
    space = make_space(tmp_path / "space.yaml", fixed_args=["--mem-fraction-static-extra", "1"],
                       knobs={"mem_fraction_static": {"low": 0.56, "high": 0.66, "step": 0.01}})
    # Longer than the searched flag, not a prefix of it: not the knob's flag, but no flag of the release either.
    res = cli("validate", str(space), cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--mem-fraction-static-extra is not a flag of sglang" in res.stderr and "abbreviation" not in res.stderr
    good = make_space(tmp_path / "good.yaml", fixed_args=["--trust-remote-code", "--dtype", "bfloat16"],
                      knobs={"mem_fraction_static": {"low": 0.56, "high": 0.66, "step": 0.01}})
    assert cli("validate", str(good), cwd=tmp_path, timeout=60).returncode == 0


def _slow(tmp_path: Path, requests: int, timeout: str) -> Path:
    workload: dict[str, Any] = {"input_len": 64, "output_len": 4096, "concurrency": [1],
                                "requests_per_level": [requests], "warmup_requests": 0}
    return make_space(tmp_path / "space.yaml", workload=workload, budget={"benchmark_timeout": timeout})


def test_validate_warns_when_the_workload_cannot_finish_in_the_benchmark_timeout(tmp_path: Path) -> None:
    # 100,000 rounds of 4096 tokens at 1 ms (the fastest decode), on the simulated host at speed 1000: 410 s.
    space = _slow(tmp_path, 100_000, "10s")
    assert load_space(space).min_benchmark_seconds() == pytest.approx(409.6)
    res = cli("validate", str(space), cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    warning = [line for line in res.stdout.splitlines() if "budget.benchmark_timeout" in line]
    assert len(warning) == 1 and "at least 410 s per trial" in warning[0] and "10 s" in warning[0]

    space = _slow(tmp_path, 1_000, "10s")  # 4 s: fits
    res = cli("validate", str(space), cwd=tmp_path, timeout=60)
    assert res.returncode == 0 and "benchmark_timeout" not in res.stdout
