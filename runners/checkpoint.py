"""What a model's checkpoint says before any launch: its weights' size and the ``config.json`` figures the
memory arithmetic needs (layers, KV heads, head size; MLA's latent rank).

The preflight asks the host (:func:`checkpoint_command`: the engine's python reads ``config.json`` under the
model path and sums the weight files' sizes; the simulated host answers for its profile the same way) and
the search's first launch places ``--mem-fraction-static`` where the weights and the target level's KV
cache fit (``search.strategy.design``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["GIB", "CheckpointFacts", "checkpoint_command", "parse_checkpoint"]

GIB = float(1 << 30)

#: The reader run with the engine's python on the host: ``config.json`` and the weight files' total size,
#: as one JSON line (nothing when the path holds no config.json).
_READER = r"""
import json, os, sys
root = sys.argv[1]
try:
    config = json.load(open(os.path.join(root, "config.json")))
except (OSError, ValueError):
    sys.exit(0)
size = 0
for name in os.listdir(root):
    if name.endswith((".safetensors", ".bin", ".pt")) and not name.startswith("training_args"):
        size += os.path.getsize(os.path.join(root, name))
print(json.dumps({"config": config, "weights_bytes": size}))
"""


def checkpoint_command(python: str, model_path: str) -> str:
    """Shell command that prints, as its last stdout line, ``{"config": ..., "weights_bytes": N}`` for the
    checkpoint at ``model_path`` (nothing when it has no ``config.json``)."""
    return f"{shlex.quote(python)} -c {shlex.quote(_READER)} {shlex.quote(model_path)}"


class CheckpointFacts(BaseModel):
    """A checkpoint's memory figures (from its ``config.json`` and its files' size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_bytes: int = Field(gt=0)
    num_layers: int | None = Field(default=None, gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """MLA (DeepSeek): the latent the KV cache holds per layer, with ``qk_rope_head_dim``; not split by TP."""
    qk_rope_head_dim: int = 0
    dtype_bytes: int = 2

    @classmethod
    def from_config(cls, config: Mapping[str, Any], weights_bytes: int) -> CheckpointFacts:
        """The figures of a Hugging Face ``config.json`` (a multimodal one's ``text_config`` when it has one)."""
        text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
        assert isinstance(text, Mapping)
        layers = _int(text, "num_hidden_layers", "n_layers", "num_layers")
        heads = _int(text, "num_attention_heads", "n_heads")
        kv_heads = _int(text, "num_key_value_heads", "n_kv_heads") or heads
        head_dim = _int(text, "head_dim")
        hidden = _int(text, "hidden_size", "dim")
        if head_dim is None and hidden and heads:
            head_dim = hidden // heads
        return cls(weights_bytes=weights_bytes, num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                   kv_lora_rank=_int(text, "kv_lora_rank"), qk_rope_head_dim=_int(text, "qk_rope_head_dim") or 0)

    def weights_gib_per_gpu(self, tp: int) -> float:
        """The weights one of ``tp`` ranks holds (GiB): the checkpoint split evenly."""
        return self.weights_bytes / GIB / max(tp, 1)

    def kv_bytes_per_token(self, tp: int) -> float | None:
        """KV-cache bytes per token on one rank at the model's dtype (None when ``config.json`` lacks a figure).
        MLA keeps one latent per layer on every rank; GQA/MHA splits the KV heads over the ranks (at least one
        head each: SGLang replicates KV heads when there are fewer than ranks)."""
        if self.num_layers is None:
            return None
        if self.kv_lora_rank is not None:
            return float(self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes)
        if self.num_kv_heads is None or self.head_dim is None:
            return None
        heads = max(self.num_kv_heads / max(tp, 1), 1.0)
        return 2.0 * self.num_layers * heads * self.head_dim * self.dtype_bytes


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def parse_checkpoint(stdout: str) -> CheckpointFacts | None:
    """:func:`checkpoint_command`'s answer (its last line), None when there is none or it does not read."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
        config, size = data["config"], int(data["weights_bytes"])
        if not isinstance(config, Mapping) or size <= 0:
            return None
        return CheckpointFacts.from_config(config, size)
    except (ValueError, KeyError, TypeError, ValidationError):
        return None
