"""Workload shapes and open-loop arrivals of the load generator (runners/loadgen.py)."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from runners import loadgen
from tests.runners.test_loadgen import FakeServer, common, run_main

SHAREGPT = Path(__file__).resolve().parents[2] / "spaces" / "data" / "sharegpt-mini.json"


def args_for(**over: Any) -> Any:
    argv = ["--base-url", "http://127.0.0.1:9", "--levels", "1", "--requests", "1"]
    for key, value in over.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    return loadgen.parse_args(argv)


# ---- arrivals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.5, 4.0, 250.0])
def test_poisson_arrivals_have_the_asked_rate(rate: float) -> None:
    offsets = loadgen.arrival_offsets(random.Random(7), 20_000, rate)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1.0 / rate, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean (coefficient of variation 1).
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


def test_burstiness_keeps_the_rate_and_changes_the_spread() -> None:
    bursty = loadgen.arrival_offsets(random.Random(3), 20_000, 10.0, burstiness=0.25)
    gaps = [b - a for a, b in itertools.pairwise(bursty)]
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.1)  # 1/sqrt(shape)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    one = loadgen.arrival_offsets(random.Random(11), 100, 3.0)
    assert one == loadgen.arrival_offsets(random.Random(11), 100, 3.0)
    assert one != loadgen.arrival_offsets(random.Random(12), 100, 3.0)


def test_no_rate_means_everyone_at_once() -> None:
    assert loadgen.arrival_offsets(random.Random(1), 5, None) == [0.0] * 5


# ---- shapes ------------------------------------------------------------------------------------------


def test_range_ratio_draws_lengths_like_bench_serving() -> None:
    wl = loadgen.Workload(args_for(input_len=100, output_len=40, random_range_ratio=0.5), random.Random(1))
    reqs = wl.requests(2000)
    ins = [len(p) for p, _ in reqs]
    outs = [n for _, n in reqs]
    assert min(ins) == 50 and max(ins) == 100
    assert min(outs) == 20 and max(outs) == 40
    assert statistics.fmean(ins) == pytest.approx(75, rel=0.03)


def test_ratio_one_is_fixed_lengths_as_before() -> None:
    wl = loadgen.Workload(args_for(input_len=33, output_len=7), random.Random(1))
    assert {(len(p), n) for p, n in wl.requests(50)} == {(33, 7)}
    assert wl.meta()["dataset_name"] == "random"


def test_shared_prefixes_are_shared_and_questions_are_not() -> None:
    wl = loadgen.Workload(args_for(input_len=8, prefix_len=64, prefix_groups=3), random.Random(5))
    reqs = wl.requests(9)
    heads = [tuple(p[:64]) for p, _ in reqs]
    assert len(set(heads)) == 3 and heads[0] == heads[3] == heads[6]
    assert len({tuple(p[64:]) for p, _ in reqs}) == 9
    assert all(len(p) == 72 for p, _ in reqs)
    assert wl.meta()["dataset_name"] == "generated-shared-prefix"


def test_sharegpt_file_gives_lengths_from_its_conversations() -> None:
    pairs = loadgen.load_sharegpt(str(SHAREGPT))
    assert len(pairs) >= 40
    wl = loadgen.Workload(args_for(dataset=SHAREGPT), random.Random(2))
    reqs = wl.requests(len(pairs))
    expected = sorted((len(p.split()), len(r.split())) for p, r in pairs)
    assert sorted((len(p), n) for p, n in reqs) == expected  # each conversation once, in a seeded order
    assert len({n for _, n in reqs}) > 10  # real spread of reply lengths
    again = loadgen.Workload(args_for(dataset=SHAREGPT), random.Random(2)).requests(len(pairs))
    assert again == reqs
    assert wl.meta()["dataset_name"] == "sharegpt"


def test_word_ids_are_stable_and_in_the_vocabulary() -> None:
    ids = loadgen.word_ids("the cat sat on the mat", 400)
    assert ids[0] == ids[4] and len(ids) == 6 and all(1 <= i < 400 for i in ids)
    assert ids == loadgen.word_ids("the cat sat on the mat", 400)


@pytest.mark.parametrize("content, why", [
    ('{"conversations": []}', "expected a JSON list"),
    ('[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]', "no conversation"),
    ("not json", ""),
])
def test_a_bad_dataset_is_one_line_and_exit_2(tmp_path: Path, content: str, why: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text(content)
    code = loadgen.main(["--base-url", "http://127.0.0.1:9", "--levels", "1", "--requests", "1",
                         "--dataset", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("loadgen.py: error: --dataset:") and why in err[-1]


def test_dataset_and_prefix_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    code = loadgen.main(["--base-url", "http://127.0.0.1:9", "--levels", "1", "--requests", "1",
                         "--dataset", str(SHAREGPT), "--prefix-len", "8"])
    assert code == 2 and "give one" in capsys.readouterr().err


# ---- open loop against a real HTTP server ---------------------------------------------------------


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_open_loop_sends_at_the_rate_and_records_the_workload(api: str, server: FakeServer,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    args = common(server.url, api, **{"--levels": "64", "--requests": "120", "--warmup": "0",
                                            "--output-len": "3", "--seed": "9"})
    code, records = run_main([*args, "--request-rate", "40"], capsys)
    assert code == 0
    (rec,) = records
    assert rec["completed"] == 120 and rec["request_rate"] == 40.0 and rec["seed"] == 9
    assert rec["dataset_name"] == "random" and list(rec) == list(loadgen.RECORD_KEYS)
    # The requests left on the seeded schedule (120 arrivals at 40/s: ~3 s), not all at once.
    expected = loadgen.arrival_offsets(random.Random(9), 120, 40.0)
    seen = sorted(server.arrivals)
    span = seen[-1] - seen[0]
    assert expected[-1] * 0.85 <= span <= expected[-1] * 2  # on schedule (a busy box only delays sends)


def test_open_loop_respects_the_concurrency_cap(server: FakeServer,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    server.gap = 0.05
    args = common(server.url, "sglang", **{"--levels": "2", "--requests": "12", "--warmup": "0",
                                                 "--output-len": "4"})
    code, records = run_main([*args, "--request-rate", "1000"], capsys)
    assert code == 0 and records[0]["completed"] == 12
    assert server.max_in_flight == 2


def test_sharegpt_end_to_end_sends_the_dataset_lengths(server: FakeServer,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = common(server.url, "sglang", **{"--levels": "4", "--requests": "10", "--warmup": "0"})
    code, records = run_main([*args, "--dataset", str(SHAREGPT)], capsys)
    assert code == 0 and records[0]["dataset_name"] == "sharegpt"
    asked = sorted(body["sampling_params"]["max_new_tokens"] for _, body in server.bodies)
    pairs = loadgen.load_sharegpt(str(SHAREGPT))
    assert set(asked) <= {len(r.split()) for _, r in pairs}
    assert records[0]["total_output_tokens"] == sum(asked)


def test_the_shipped_dataset_is_sharegpt_shaped() -> None:
    data = json.loads(SHAREGPT.read_text())
    assert all(c["conversations"][0]["from"] == "human" and c["conversations"][1]["from"] == "gpt" for c in data)
