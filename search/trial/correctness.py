"""The correctness gate's arithmetic: a configuration's answers against the reference configuration's.

For each prompt the answer's tokens are compared with the reference answer's up to the first token that differs:
its *agreement* is the share of the reference's tokens matched before that point (1 for an identical answer). The
*logprob gap* is the mean absolute difference of the two logprobs over the matched tokens (where the engine gives
logprobs). For a prompt with an ``expected`` answer, the answer is *right* when its text, stripped, starts with it.
A configuration passes when the mean agreement reaches ``min_agreement`` (and the gap and accuracy their limits,
where the space sets them); one that does not is infeasible, an Optuna constraint, so never the recommendation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from runners.engines import Engine
from runners.engines.script import render
from runners.server import AnswerPlan
from search.trial.records import CorrectnessFacts, WrongAnswer
from spaces.correctness import Correctness, Prompt
from spaces.launch import LaunchConfig
from spaces.schema import Space

__all__ = ["PROMPTS_FILE", "REFERENCE_ATTR", "GatePlan", "compare", "gate_files", "gate_plan", "store_reference",
           "stored_reference", "tokens_of"]

#: The prompts' file name in a run directory.
PROMPTS_FILE = "correctness-prompts.json"
#: The study's user attr holding the reference configuration's answers (asked once per study).
REFERENCE_ATTR = "servetune.correctness_reference"


@dataclass(frozen=True)
class GatePlan:
    """What the gate asks one launch, and against what."""

    settings: Correctness
    prompts: list[Prompt]
    reference_launch: LaunchConfig
    reference_name: str
    key: str
    """Names the reference answers: the reference launch, the engine version, the prompts and their length."""
    same_as_reference: bool
    """The launch renders exactly the reference's command and environment."""

    def answer_plan(self, model: str) -> AnswerPlan:
        return AnswerPlan(PROMPTS_FILE, self.settings.max_tokens, model)


def gate_plan(space: Space, launch: LaunchConfig, engine: Engine, version: str, argv: Sequence[str],
              env: Mapping[str, str], reference_params: Mapping[str, Any] | None = None) -> GatePlan:
    """The gate's plan for ``launch`` (rendered as ``argv``/``env`` for ``version``) against the reference
    configuration ``reference_params`` (None: the space's ``correctness.reference``)."""
    settings = space.correctness
    prompts = settings.prompt_set()
    params = dict(settings.reference if reference_params is None else reference_params)
    reference = LaunchConfig.from_params(space, params).model_copy(
        update={"port": launch.port, "python": launch.python, "host": launch.host})
    rendered = render(engine, reference, version)
    if settings.reference:
        name = ", ".join(f"{k}={v}" for k, v in settings.reference.items())
    else:
        name = "engine defaults of the numerics knobs" + (
            f" ({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
    key = hashlib.sha256(json.dumps({
        "launch": reference.model_dump(mode="json", exclude={"port", "python", "host"}), "version": version,
        "prompts": [p.prompt for p in prompts], "max_tokens": settings.max_tokens}, sort_keys=True).encode()
    ).hexdigest()[:16]
    same = list(rendered.argv) == list(argv) and dict(rendered.env) == dict(env)
    return GatePlan(settings, prompts, reference, name, key, same)


def gate_files(plan: GatePlan | None) -> dict[str, str]:
    """The files the gate needs in a run directory (the prompts), none without a gate."""
    if plan is None:
        return {}
    return {PROMPTS_FILE: json.dumps([p.prompt for p in plan.prompts])}


def stored_reference(study: optuna.Study, key: str) -> list[dict[str, Any]] | None:
    """The reference answers stored with ``study`` under ``key``, or None."""
    stored = study.user_attrs.get(REFERENCE_ATTR)
    if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("answers"), list):
        return list(stored["answers"])
    return None


def store_reference(study: optuna.Study, key: str, answers: list[dict[str, Any]], seconds: float,
                    trial: int) -> None:
    """Keep the reference answers with the study (and what asking them cost)."""
    study.set_user_attr(REFERENCE_ATTR, {"key": key, "answers": answers, "seconds": round(seconds, 3),
                                         "trial": trial})


def tokens_of(answer: dict[str, Any]) -> list[str]:
    """An answer's tokens (the engine's, else its text split before each space)."""
    tokens = answer.get("tokens")
    if isinstance(tokens, list) and tokens:
        return [str(t) for t in tokens]
    text = str(answer.get("text") or "")
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out.append(word if i == 0 else " " + word)
    return [t for t in out if t]


def _lp(answer: dict[str, Any]) -> list[float] | None:
    values = answer.get("logprobs")
    if not isinstance(values, list) or not values:
        return None
    return [float(v) if isinstance(v, int | float) else float("nan") for v in values]


def _shortfalls(agreement: float | None, gap: float | None, accuracy: float | None,
                settings: Correctness) -> list[str]:
    """What falls short of the space's thresholds, one phrase each."""
    reasons: list[str] = []
    if agreement is None:
        reasons.append("no prompt could be compared (the reference gave no answer)")
    elif agreement < settings.min_agreement:
        reasons.append(f"agreement {agreement:.2f} < {settings.min_agreement:g}")
    if settings.max_logprob_gap is not None and gap is not None and gap > settings.max_logprob_gap:
        reasons.append(f"logprob gap {gap:.3f} > {settings.max_logprob_gap:g} nats")
    if settings.min_accuracy is not None and accuracy is not None and accuracy < settings.min_accuracy:
        reasons.append(f"accuracy {accuracy:.2f} < {settings.min_accuracy:g}")
    return reasons


def compare(reference: Sequence[dict[str, Any]], got: Sequence[dict[str, Any]], prompts: Sequence[Prompt],
            settings: Correctness, *, reference_name: str = "engine defaults") -> CorrectnessFacts:
    """The gate's verdict on answers ``got`` against ``reference`` (one record each per prompt, by index)."""
    by_ref = {int(r["index"]): r for r in reference if "index" in r}
    by_got = {int(r["index"]): r for r in got if "index" in r}
    agreements: list[float] = []
    gaps: list[float] = []
    right = asked = 0
    wrong: list[WrongAnswer] = []
    for i, prompt in enumerate(prompts):
        ref, mine = by_ref.get(i), by_got.get(i)
        if ref is None or ref.get("error"):
            continue  # the reference has no answer here: nothing to compare with
        if mine is None or mine.get("error"):
            agreements.append(0.0)
            wrong.append(WrongAnswer(index=i, prompt=prompt.prompt, reference=str(ref.get("text", "")),
                                     got=f"(no answer: {mine.get('error') if mine else 'missing'})", diverged_at=0))
            continue
        a, b = tokens_of(ref), tokens_of(mine)
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        agreement = 1.0 if not a else n / len(a)
        agreements.append(agreement)
        la, lb = _lp(ref), _lp(mine)
        if la is not None and lb is not None and n:
            diffs = [abs(x - y) for x, y in zip(la[:n], lb[:n], strict=False) if x == x and y == y]
            if diffs:
                gaps.append(sum(diffs) / len(diffs))
        missed = False
        if prompt.expected is not None:
            asked += 1
            ok = str(mine.get("text", "")).strip().startswith(prompt.expected.strip())
            right += ok
            missed = not ok
        if agreement < 1.0 or missed:
            wrong.append(WrongAnswer(index=i, prompt=prompt.prompt, reference=str(ref.get("text", "")),
                                     got=str(mine.get("text", "")), diverged_at=n if agreement < 1.0 else None,
                                     expected=prompt.expected))
    mean = round(sum(agreements) / len(agreements), 4) if agreements else None
    gap = round(sum(gaps) / len(gaps), 5) if gaps else None
    accuracy = round(right / asked, 4) if asked else None
    reasons = _shortfalls(mean, gap, accuracy, settings)
    return CorrectnessFacts(passed=not reasons, agreement=mean, logprob_gap=gap, accuracy=accuracy,
                            prompts=len(prompts), wrong=wrong, reference=reference_name, reason="; ".join(reasons))
