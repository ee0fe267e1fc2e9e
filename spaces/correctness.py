"""The correctness gate of a space: a configuration must answer as the reference configuration does before it can
be the answer.

Some settings make a server fast and wrong: ``NCCL_PROTO=LL128`` forced where NCCL does not enable it can corrupt
data, an FP8 KV cache can shift a model's answers. So, once per configuration, the server is asked a fixed set of
prompts (``spaces/data/correctness-prompts.json`` and the space's own file), greedily (temperature 0), with
logprobs, and its answers are compared with those of the reference configuration (the engine's defaults unless the
space names one): the share of each answer's tokens that match up to the first divergence, the mean logprob
distance over the matched tokens, and for prompts with an ``expected`` answer, the accuracy. A configuration below
a threshold is infeasible (an Optuna constraint): it is never recommended.

    correctness:
      enabled: null            # null: on when the space searches a knob that can change numerics; true / false
      prompts: my-prompts.json # optional: more prompts (a JSON list of strings or {prompt, expected} objects)
      max_tokens: 24
      min_agreement: 0.9       # mean token match up to the first divergence, 0-1
      max_logprob_gap: null    # mean |logprob - reference logprob| over the matched tokens (nats)
      min_accuracy: null       # share of prompts with an expected answer that the answer starts with
      reference: {}            # the reference configuration's knobs ({}: every knob at the engine default)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spaces.strict import Strict

__all__ = ["NUMERICS_KNOBS", "SHIPPED_PROMPTS", "Correctness", "Prompt", "changes_numerics", "load_prompts"]

SHIPPED_PROMPTS = Path(__file__).with_name("data") / "correctness-prompts.json"
"""The prompts every gate asks (plus the space's own file)."""

NUMERICS_KNOBS: tuple[str, ...] = (
    "nccl.NCCL_PROTO", "nccl.NCCL_ALGO", "--kv-cache-dtype", "--dtype", "--quantization", "--attention-backend",
    "--prefill-attention-backend", "--decode-attention-backend", "--speculative-", "--fp8-", "--enable-fp32-lm-head",
    "--torch-compile", "--enable-torch-compile", "env.VLLM_ATTENTION_BACKEND", "env.SGLANG_",
)
"""Knobs (a name, or a prefix ending in ``-`` or ``_``) that can change what a model answers: the NCCL protocol
and algorithm (a reduction order, and LL128's corruption where unsupported), KV and weight dtypes, speculative
decoding, the attention backend, compilation and the engine's own variables."""


def changes_numerics(name: str) -> bool:
    """Whether searching knob ``name`` can change a model's answers (:data:`NUMERICS_KNOBS`)."""
    return any(name == k or (k.endswith(("-", "_")) and name.startswith(k)) for k in NUMERICS_KNOBS)


class Prompt(BaseModel):
    """One prompt of the gate, with the answer it should start with where one is known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str = Field(min_length=1)
    expected: str | None = None


def load_prompts(path: Path) -> list[Prompt]:
    """The prompts of a JSON file (a list of strings or of ``{prompt, expected}``); ValueError (one line)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: give a non-empty JSON list of prompts (strings or {{prompt, expected}})")
    out = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            item = {"prompt": item}
        try:
            out.append(Prompt.model_validate(item))
        except Exception:
            raise ValueError(f"{path}: item {i} is not a prompt (a string or {{prompt, expected}})") from None
    return out


class Correctness(Strict):
    """The gate's settings (the module docstring shows them in a space file)."""

    enabled: bool | None = None
    prompts: str | None = None
    """A JSON file of more prompts, relative to the space file."""
    max_tokens: int = Field(default=24, ge=1, le=512)
    min_agreement: float = Field(default=0.9, ge=0, le=1)
    max_logprob_gap: float | None = Field(default=None, gt=0)
    min_accuracy: float | None = Field(default=None, ge=0, le=1)
    reference: dict[str, Any] = Field(default_factory=dict)
    """The reference configuration's knob values by their search names (``{}``: the engine's defaults)."""

    @field_validator("reference")
    @classmethod
    def _reference(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, value in v.items():
            if isinstance(value, dict | list) and not name.startswith("--"):
                raise ValueError(f"reference.{name}: give one value, not {type(value).__name__}")
        return v

    def on_for(self, searched: list[str]) -> bool:
        """Whether the gate runs for a space searching ``searched``: as ``enabled`` says, else when one of them
        can change numerics."""
        if self.enabled is not None:
            return self.enabled
        return any(changes_numerics(name) for name in searched)

    def prompt_set(self) -> list[Prompt]:
        """The shipped prompts, then the space's own."""
        prompts = load_prompts(SHIPPED_PROMPTS)
        if self.prompts is not None:
            prompts += load_prompts(Path(self.prompts))
        return prompts
