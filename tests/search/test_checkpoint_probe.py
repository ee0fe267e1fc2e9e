"""The first launch's memory arithmetic uses what the host and the model say before any launch: the checkpoint's
size and config.json (read on the host by the engine's python; the simulated host answers for its profile) and
the cards' memory, so a model whose weights take most of the card starts where it fits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.simeval import SimEvaluator
from runners.checkpoint import CheckpointFacts, checkpoint_command, parse_checkpoint
from runners.engines.sglang_memory import default_memory
from runners.simhost.profile import load_profile, shipped_profiles
from search.driver.hosts import local_host
from search.spaces import engine_of
from search.strategy.design import probe_params
from search.trial.preflight import preflight
from spaces.launch import LaunchConfig
from spaces.schema import Space, load_space

ROOT = Path(__file__).resolve().parents[2]
TIGHT = [ROOT / "spaces/sim-mixtral-8x22b-tp8-a100-40g-pcie.yaml", ROOT / "spaces/sim-llama31-70b-tp2-h100-noisy8.yaml"]

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "num_attention_heads": 64,
             "num_key_value_heads": 8, "num_hidden_layers": 80, "torch_dtype": "bfloat16"}


def run(command: str) -> str:
    res = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, check=True)
    return res.stdout


def test_the_reader_reads_config_json_and_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 3000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "tokenizer.json").write_bytes(b"\0" * 5000)  # not weights
    facts = parse_checkpoint(run(checkpoint_command(sys.executable, str(tmp_path))))
    assert facts is not None and facts.weights_bytes == 4000
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim) == (80, 8, 128)
    assert facts.kv_bytes_per_token(2) == 2 * 80 * 4 * 128 * 2
    assert facts.kv_bytes_per_token(16) == 2 * 80 * 1 * 128 * 2  # fewer KV heads than ranks: one each


def test_no_config_json_reads_as_nothing(tmp_path: Path) -> None:
    assert parse_checkpoint(run(checkpoint_command(sys.executable, str(tmp_path)))) is None
    assert parse_checkpoint("not json") is None


def test_mla_keeps_one_latent_per_layer_on_every_rank() -> None:
    facts = CheckpointFacts.from_config({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                         "num_attention_heads": 128}, 1 << 40)
    assert facts.kv_bytes_per_token(8) == facts.kv_bytes_per_token(1) == 61 * 576 * 2


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_the_simulated_host_serves_its_profiles_checkpoint(path: Path) -> None:
    """The simulated host's checkpoint gives the profile's own KV bytes per token and weights per rank."""
    profile = load_profile(path)
    m = profile.model
    space = load_space(ROOT / "spaces/sim-llama31-8b-h100.yaml")
    engine = engine_of(space.model_copy(update={"engine": space.engine.model_copy(
        update={"sim": space.engine.sim.model_copy(update={"profile": str(path)})})}))  # type: ignore[union-attr]
    facts = parse_checkpoint(run(engine.checkpoint_command(sys.executable, "/models/any")))
    assert facts is not None
    kv = facts.kv_bytes_per_token(m.reference_tp)
    bf16 = m.kv_bytes_per_token * (2 if m.kv_cache_dtype_default.startswith("fp8") else 1)  # config.json: 2 B
    assert kv is not None and abs(kv - bf16) / bf16 < 0.05
    assert abs(facts.weights_gib_per_gpu(m.reference_tp) - m.weights_per_gpu(m.reference_tp)) <= (
        m.replicated_weights_gib + 0.01)


def checkpoint_of(space: Space) -> CheckpointFacts:
    facts = parse_checkpoint(run(engine_of(space).checkpoint_command(sys.executable, space.model_path)))
    assert facts is not None
    return facts


@pytest.mark.parametrize("path", TIGHT, ids=lambda p: p.stem)
def test_a_model_that_fills_the_card_is_probed_where_it_fits(path: Path) -> None:
    """SGLang's default fraction leaves such a model no KV pool; without the checkpoint the probe (below the
    default) dies, with it the probe is above the default and serves the target level."""
    space = load_space(path)
    sim = SimEvaluator(space)
    card = float(sim.profile.host.memory_total_mib)
    tp = engine_of(space).tp_size(space.fixed_args)
    default = default_memory(space.engine.version or "", card, tp).mem_fraction_static
    weights = sim.profile.model.weights_per_gpu(tp) * 1024
    assert weights >= 0.75 * card  # the landscape is what it says: weights take >= 75% of the card
    assert default * card < weights  # SGLang's default static pool does not even hold the weights
    blind = probe_params(space, card, space.engine.version)
    assert sim.true_value(LaunchConfig.from_params(space, blind)) is None
    probe = probe_params(space, card, space.engine.version, checkpoint_of(space))
    assert probe["mem_fraction_static"] > default
    assert sim.true_value(LaunchConfig.from_params(space, probe)) is not None


@pytest.mark.parametrize("path", sorted((ROOT / "spaces").glob("*sim*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_landscapes_probe_serves(path: Path) -> None:
    """With the checkpoint's figures the probe never dies on a shipped landscape (the rate search's and the
    Pareto space's too: the probe is the same arithmetic)."""
    space = load_space(path)
    sim = SimEvaluator(space)
    probe = probe_params(space, float(sim.profile.host.memory_total_mib), space.engine.version, checkpoint_of(space))
    out = sim.outcome(LaunchConfig.from_params(space, probe))
    assert out.outcome == "ok", (probe, out.phase, out.error)


def test_the_preflight_reads_the_checkpoint_on_the_host(tmp_path: Path) -> None:
    space = load_space(TIGHT[0])
    host = local_host(space, runs_root=str(tmp_path / "runs"), sim_dir=tmp_path / "sim")
    try:
        info = preflight(host, space)
    finally:
        host.close()
    assert info.checkpoint is not None
    assert info.checkpoint.num_layers == 56 and info.checkpoint.num_kv_heads == 8
    assert abs(info.checkpoint.weights_gib_per_gpu(8) - 32.7) < 0.05
