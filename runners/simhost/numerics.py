"""What the simulated model answers, and how settings change it: the ground truth of the correctness gate.

A greedy answer is a pure function of the prompt: its tokens and their logprobs come from a hash of the prompt, so
every launch of the reference configuration answers the same. An arithmetic question (``What is 17 + 25?
Answer:``) is answered right. Settings then change the answers by the profile's ``numerics`` figures (all
simulated):

* ``NCCL_PROTO`` forcing LL128 on PCIe with TP > 1 (NCCL's env.rst: LL128 where unsupported "can lead to data
  corruption") corrupts ``ll128_pcie_corrupt_fraction`` of the answers from an early token on;
* an FP8 (or FP4) KV cache shifts every logprob by about ``fp8_kv_logprob_shift`` nats and changes
  ``fp8_kv_divergent_fraction`` of the answers from a later token on;
* speculative decoding keeps the tokens (greedy verification) with ``speculative_logprob_noise`` on the logprobs.

Which answers a setting changes is decided by a hash of the prompt, so it is the same on every launch.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from runners.simhost.profile import NumericsSpec

__all__ = ["Answer", "Numerics", "answer"]

_VOCAB = ("the", "of", "and", "a", "to", "in", "is", "that", "it", "was", "for", "on", "are", "as", "with",
          "his", "they", "at", "be", "this", "from", "have", "or", "by", "one", "had", "not", "but", "what", "all",
          "were", "when", "we", "there", "can", "an", "your", "which", "their", "said", "if", "do", "will", "each")
_GARBAGE = ("<0x00>", "\ufffd", "!!", "ĠĠ", "<unk>", "@@")
_SUM = re.compile(r"What is (\d+) \+ (\d+)\?\s*Answer:\s*$")


@dataclass(frozen=True)
class Numerics:
    """The settings of one launch that change its answers."""

    spec: NumericsSpec
    ll128_corrupts: bool = False
    """``NCCL_PROTO`` forces LL128 where NCCL does not enable it (PCIe) and NCCL carries the all-reduces."""
    fp8_kv: bool = False
    speculative: bool = False


@dataclass(frozen=True)
class Answer:
    tokens: list[str]
    logprobs: list[float]

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def _unit(*parts: object) -> float:
    """A number in [0, 1) from a hash of ``parts`` (the same on every launch)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def answer(prompt: str, max_tokens: int, numerics: Numerics) -> Answer:
    """The greedy answer of ``max_tokens`` tokens to ``prompt`` under ``numerics``."""
    tokens: list[str] = []
    logprobs: list[float] = []
    m = _SUM.search(prompt)
    for i in range(max_tokens):
        if i == 0 and m is not None:
            tokens.append(f" {int(m.group(1)) + int(m.group(2))}")
        else:
            tokens.append(" " + _VOCAB[int(_unit(prompt, "token", i) * len(_VOCAB))])
        logprobs.append(-0.02 - 2.0 * _unit(prompt, "logprob", i) ** 2)
    spec = numerics.spec
    if numerics.fp8_kv:
        logprobs = [lp - spec.fp8_kv_logprob_shift * (0.5 + _unit(prompt, "fp8", i))
                    for i, lp in enumerate(logprobs)]
        if _unit(prompt, "fp8-flip") < spec.fp8_kv_divergent_fraction:
            start = max(1, int(max_tokens * (0.4 + 0.5 * _unit(prompt, "fp8-at"))))
            for i in range(min(start, max_tokens - 1), max_tokens):
                tokens[i] = " " + _VOCAB[int(_unit(prompt, "fp8-token", i) * len(_VOCAB))]
    if numerics.speculative:
        logprobs = [lp + spec.speculative_logprob_noise * (_unit(prompt, "spec", i) - 0.5)
                    for i, lp in enumerate(logprobs)]
    if numerics.ll128_corrupts and _unit(prompt, "ll128") < spec.ll128_pcie_corrupt_fraction:
        start = int(max_tokens * 0.3 * _unit(prompt, "ll128-at"))
        for i in range(start, max_tokens):
            tokens[i] = _GARBAGE[int(_unit(prompt, "garbage", i) * len(_GARBAGE))]
            logprobs[i] = -9.0 - 3.0 * _unit(prompt, "garbage-lp", i)
    return Answer(tokens, [round(lp, 6) for lp in logprobs])
