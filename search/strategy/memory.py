"""The memory model of one study: what a configuration leaves free, fitted from every launched trial.

A study fixes the host, the model, the engine version and the fixed args, so the memory a server uses
is a small set of figures that every launch reports in its log (the ``mem.*`` facts), dead or alive.
SGLang's start-up arithmetic (``srt/model_executor/model_runner.py``, ``profile_max_num_token``) per GPU, in
GiB::

    pre                                 free before the weights (``Load weight begin. avail mem``): the
                                        card less the driver, the CUDA context, NCCL, other processes
    weights W                           ``Load weight end. mem usage``
    KV(mfs)      = pre * mfs - W        the pool: ``rest = (pre - W) - pre * (1 - mfs)``
    free_pool    = pre * (1 - mfs) - s  ``Memory pool end. avail mem`` (s: req_to_token table, buffers)
    free_cap     = free_pool - g(bs)    after CUDA-graph capture; ``g(bs) = a + c * bs`` over the
                                        largest captured batch size (bs <= max running requests)

Everything after capture (the capture workspace, the warm-up's first forward, a chunked prefill's
activations, an eager decode step when the target concurrency exceeds the largest graph) must fit in
``free_cap`` less fragmentation. Those needs are *thresholds* on ``free_cap``, one per phase, and each
launch bounds them: a server that died there says the need exceeded its ``free_cap`` (and, from the OOM
line, at least what it held plus what it tried to allocate); one that got through says the need was at
most its ``free_cap``. The KV pool has its own threshold on ``KV(mfs)``.

:meth:`MemoryModel.predict` gives, for a candidate, the margin in GiB (``free_cap`` less the largest
need, or the KV pool less its need) with a standard deviation that shrinks as launches come in, and
whether the configuration dies *for certain* under the model: its free memory, even at the optimistic end
of the fit, is below a need some launch has already proved. The search skips a launch that dies for
certain or *likely* (:attr:`Prediction.likely_death`: a margin below 0.43 sd, one chance in three).

vLLM (:class:`VllmMemoryModel`) is fitted the same way from its own lines: its start-up checks refuse a
KV cache larger than what is free (the refusal says both figures) and a ``max_model_len`` whose one
request needs more KV cache than the budget leaves (``gpu_memory_utilization * total`` less weights,
activations and graphs; the refusal says what was needed and what was available).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from runners.engines.common import flag_value
from runners.telemetry import FailureKind
from search.spaces import engine_of
from search.trial.records import OK, Outcome, TrialFacts
from spaces.schema import Space

__all__ = [
    "VLLM_ALLOCATION",
    "VLLM_MAX_LEN",
    "Bound",
    "Candidate",
    "LaunchFacts",
    "MemoryModel",
    "Prediction",
    "VllmFacts",
    "VllmMemoryModel",
    "batch_tokens",
    "facts_from_record",
    "facts_from_trial",
    "memory_class",
    "study_model",
    "vllm_facts_from_record",
    "vllm_fixed",
    "workload_batch_tokens",
]

#: What a skip's outcome says (a :class:`~runners.telemetry.FailureKind`; its facts are fields of
#: :class:`~search.trial.records.TrialFacts`: ``predicted_margin_gib``, ``predicted_sd_gib``, ``predicted_phase``,
#: ``prediction_rests_on``, ``measured_margin_gib``).
PREDICTED_OOM = FailureKind.PREDICTED_OOM
MARGIN_CONSTRAINT = "memory_margin_gib"

#: One-sided z for "the optimistic end of the fit" (95%).
Z = 1.645
#: A sampled configuration is skipped when it dies with a probability above one in three under the
#: model (its margin is below ``-SKIP_Z`` standard deviations, i.e. below 0.43 sd): a skip costs nothing
#: and leaves the sampler a constraint to learn from, a death costs a launch (on an 8-GPU host, minutes
#: of start-up on every card). The model's needs after capture have no term for every activation (a
#: long chunked prefill), so a margin of a fraction of its sd is not taken as safe.
SKIP_Z = -0.43

#: Prior needs after capture (GiB) and their spread, before any launch has bounded them.
PRIOR_NEED = {"kv_pool": (0.05, 0.5), "cuda_graph": (2.0, 1.5), "serve": (1.0, 1.0), "eager": (3.0, 3.0)}

_SERVE_PHASES = {"warmup", "prefill", "serving", "ready"}


@dataclass(frozen=True)
class LaunchFacts:
    """What one launched trial says about memory (GiB unless named otherwise); None = not seen."""

    number: int
    outcome: Outcome  # a launch: never predicted_oom
    phase: str | None  # where it died
    mfs: float | None  # the resolved --mem-fraction-static
    max_bs: int | None  # the --cuda-graph-max-bs it ran with (resolved)
    pre: float | None = None
    weights: float | None = None
    free_pool: float | None = None
    graph: float | None = None
    free_cap: float | None = None
    max_running: int | None = None
    tried: float | None = None
    free_at_oom: float | None = None
    total: float | None = None
    target_served: bool = False
    chunk: int | None = None  # the resolved --chunked-prefill-size (-1: chunked prefill off)

    @property
    def graph_bs(self) -> int | None:
        """The largest captured batch size: the max, cut at the running-request limit."""
        if self.max_bs is None:
            return None
        return min(self.max_bs, self.max_running) if self.max_running else self.max_bs


@dataclass(frozen=True)
class Candidate:
    """A configuration to predict: the resolved memory knobs and the target concurrency."""

    mfs: float | None
    max_bs: int | None
    concurrency: int
    chunk: int | None = None  # --chunked-prefill-size (None: as launched)


@dataclass(frozen=True)
class Bound:
    """Interval-censored threshold of one phase's need: ``lower < need <= upper``."""

    lower: float | None = None
    upper: float | None = None
    lower_from: tuple[int, ...] = ()
    upper_from: tuple[int, ...] = ()

    def estimate(self, prior: tuple[float, float]) -> tuple[float, float]:
        """(need, sd): the middle of the interval, or the prior pushed inside a one-sided one."""
        mean, sd = prior
        lo, hi = self.lower, self.upper
        if lo is not None and hi is not None:
            return (lo + hi) / 2, max((hi - lo) / 4, 0.05)
        if hi is not None:
            return min(mean, hi - 0.5 * sd) if mean > hi - 0.5 * sd else mean, sd
        if lo is not None:
            return max(mean, lo + 0.25), sd
        return mean, sd


@dataclass(frozen=True)
class Prediction:
    """The model's verdict on a candidate."""

    margin_gib: float  # free memory left at the tightest phase (negative: a deficit)
    sd_gib: float
    kv_gib: float | None
    free_after_capture_gib: float | None
    tightest: str  # the phase the margin is taken at
    certain_death: bool  # even the optimistic figure is below a need a launch has proved
    rests_on: tuple[int, ...]  # the trials whose figures the prediction uses

    @property
    def likely_death(self) -> bool:
        """Dies under the model with a probability above one in three (:data:`SKIP_Z`), or for certain."""
        return self.certain_death or self.margin_gib + SKIP_Z * self.sd_gib < 0

    def summary(self) -> dict[str, Any]:
        return {
            "margin_gib": round(self.margin_gib, 3),
            "sd_gib": round(self.sd_gib, 3),
            "kv_gib": None if self.kv_gib is None else round(self.kv_gib, 3),
            "free_after_capture_gib": None if self.free_after_capture_gib is None
            else round(self.free_after_capture_gib, 3),
            "phase": self.tightest,
            "rests_on": list(self.rests_on),
        }


def _num(values: Mapping[str, Any], key: str) -> float | None:
    value = values.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _knob(rec: TrialFacts, name: str) -> float | None:
    """The knob's value in ``rec`` (:meth:`~search.trial.records.TrialFacts.knob_value`) when it is a number."""
    value = rec.knob_value(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def batch_tokens(target: int, input_len: int | None, prefix_len: int = 0) -> int | None:
    """The most new tokens one prefill batch of a workload can hold: every request at the target level
    arriving together (``None`` for prompts of unknown length, such as a dataset's)."""
    return None if input_len is None else target * (input_len + prefix_len)


def facts_from_trial(trial: FrozenTrial | TrialFacts, *, target: int) -> LaunchFacts | None:
    """The memory facts of a finished, launched trial (None for a skip, a reuse, a FAIL, a waiting one)."""
    rec = trial if isinstance(trial, TrialFacts) else TrialFacts.from_trial(trial)
    if rec.state not in (TrialState.COMPLETE, TrialState.PRUNED):
        return None
    return facts_from_record(rec, target=target)


def facts_from_record(rec: TrialFacts, *, target: int) -> LaunchFacts | None:
    """The memory facts in a trial's record and params (None when it was not launched)."""
    if rec.outcome is None or not rec.launched:
        return None
    memory = rec.memory
    mfs = _knob(rec, "mem_fraction_static")
    max_bs_f = _knob(rec, "cuda_graph_max_bs")
    running = memory.number("max_running_requests")
    chunk = _knob(rec, "chunked_prefill_size")
    served = any(lv.max_concurrency == target and lv.served for lv in rec.levels)
    return LaunchFacts(
        number=rec.number, outcome=rec.outcome, phase=rec.phase.value if rec.phase else None, mfs=mfs,
        max_bs=None if max_bs_f is None else int(max_bs_f),
        pre=memory.number("avail_before_weights_gib"), weights=memory.number("weights_gib"),
        free_pool=memory.number("avail_after_kv_gib"), graph=memory.number("graph_gib"),
        free_cap=memory.number("free_after_capture_gib"),
        max_running=None if running is None else int(running),
        tried=memory.number("tried_to_allocate_gib"), free_at_oom=memory.number("free_at_oom_gib"),
        total=memory.number("gpu_total_gib"), target_served=served or rec.outcome == OK,
        chunk=None if chunk is None else int(chunk),
    )


def _covers(served: int | None, tokens: int | None) -> bool:
    """A launch that served prefill batches of ``served`` tokens covers a candidate's ``tokens``."""
    return served == tokens or (served is not None and tokens is not None and served >= tokens)


@dataclass
class MemoryModel:
    """SGLang's memory arithmetic fitted to a study's launches (see the module docstring)."""

    target: int
    facts: list[LaunchFacts] = field(default_factory=list)
    #: The most new tokens one prefill batch of the workload holds (target x prompt length); None: unknown.
    batch_tokens: int | None = None
    #: The memory class the model is fitted to (:func:`memory_class`): other classes get no prediction.
    klass: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_trials(cls, trials: Iterable[FrozenTrial | TrialFacts], *, target: int,
                    batch_tokens: int | None = None) -> MemoryModel:
        facts = [f for f in (facts_from_trial(t, target=target) for t in trials) if f is not None]
        return cls(target=target, facts=facts, batch_tokens=batch_tokens)

    def prefill_tokens(self, chunk: int | None) -> int | None:
        """New tokens in the workload's largest prefill batch at ``chunk`` (None: as launched): the chunk,
        cut at what the workload sends at once. The activations of a prefill grow with it, so the
        serving need is compared only between launches in the right order (see :meth:`bounds`)."""
        c = chunk if chunk is not None else self._default("chunk")
        if c is None:
            return None
        if c <= 0:  # chunked prefill off: the whole batch at once
            return self.batch_tokens
        return int(min(c, self.batch_tokens) if self.batch_tokens else c)

    # ---- the static fit ---------------------------------------------------------------------------

    def _pre(self) -> tuple[float, tuple[int, ...]] | None:
        seen = [(f.pre, f.number) for f in self.facts if f.pre is not None]
        if not seen:
            return None
        return statistics.median(p for p, _ in seen), tuple(n for _, n in seen)

    def _weights(self) -> float | None:
        seen = [f.weights for f in self.facts if f.weights is not None]
        return statistics.median(seen) if seen else None

    def _static(self, pre: float) -> tuple[float, float]:
        """(s, sd): memory taken with the pool besides the KV cache, from ``Memory pool end``."""
        seen = [pre * (1 - f.mfs) - f.free_pool for f in self.facts if f.free_pool is not None and f.mfs is not None]
        if not seen:
            return 0.3, 0.5
        return statistics.fmean(seen), 0.05 + (statistics.pstdev(seen) if len(seen) > 1 else 0.0)

    def _graph_points(self) -> list[tuple[int, float, int]]:
        # Only a finished capture says what the graphs hold (a failed one reports what it had so far).
        return [(f.graph_bs, f.graph, f.number) for f in self.facts
                if f.graph is not None and f.free_cap is not None and f.graph_bs is not None and f.graph_bs > 0]

    def graph_fit(self) -> tuple[float, float, float, float] | None:
        """(a, c, sd_c, sd0) of ``g(bs) = a + c * bs``: least squares over the distinct batch sizes seen;
        with one, the slope is only known to lie between 0 and g/bs."""
        pts = self._graph_points()
        if not pts:
            return None
        by_bs: dict[int, list[float]] = {}
        for bs, g, _ in pts:
            by_bs.setdefault(bs, []).append(g)
        xs = sorted(by_bs)
        ys = [statistics.fmean(by_bs[x]) for x in xs]
        if len(xs) == 1:
            c = ys[0] / xs[0] / 2
            return ys[0] - c * xs[0], c, c, 0.05
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        c = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        a = my - c * mx
        resid = [y - (a + c * x) for x, y in zip(xs, ys, strict=True)]
        rms = math.sqrt(sum(r * r for r in resid) / max(len(xs) - 2, 1)) if len(xs) > 2 else 0.0
        return a, c, rms / math.sqrt(sxx) if sxx else 0.0, 0.05 + rms

    def _graph_at(self, bs: int) -> tuple[float, float] | None:
        fit = self.graph_fit()
        if fit is None:
            return None
        a, c, sd_c, sd0 = fit
        near = min((abs(bs - p[0]) for p in self._graph_points()), default=0)
        return a + c * bs, sd0 + sd_c * near

    def _default(self, attr: str) -> float | None:
        seen = [getattr(f, attr) for f in self.facts if getattr(f, attr) is not None]
        return statistics.median(seen) if seen else None

    def _running(self) -> int | None:
        seen = [f.max_running for f in self.facts if f.max_running is not None]
        return int(statistics.median(seen)) if seen else None

    def resolve(self, cand: Candidate) -> tuple[float | None, int | None]:
        """The candidate's mfs and largest captured batch size (knobs not searched: as launched)."""
        mfs = cand.mfs if cand.mfs is not None else self._default("mfs")
        max_bs = cand.max_bs if cand.max_bs is not None else self._default("max_bs")
        if max_bs is None:
            return mfs, None
        running = self._running()
        return mfs, int(min(max_bs, running) if running else max_bs)

    def free_after_capture(self, cand: Candidate) -> tuple[float, float] | None:
        """(GiB, sd) free after capture for the candidate, or None before the model has the figures."""
        pre = self._pre()
        mfs, bs = self.resolve(cand)
        if pre is None or mfs is None or bs is None:
            return None
        same = [f.free_cap for f in self.facts if f.free_cap is not None and f.mfs is not None
                and abs(f.mfs - mfs) < 1e-6 and f.graph_bs == bs]
        if same:  # launched before: its own figure
            return statistics.median(same), 0.02
        s, sd_s = self._static(pre[0])
        graph = self._graph_at(bs)
        if graph is None:
            return None
        return pre[0] * (1 - mfs) - s - graph[0], math.hypot(sd_s, graph[1])

    def kv(self, cand: Candidate) -> float | None:
        pre, w = self._pre(), self._weights()
        mfs, _ = self.resolve(cand)
        if pre is None or w is None or mfs is None:
            return None
        return pre[0] * mfs - w

    # ---- the needs ------------------------------------------------------------------------------

    def _phase_of(self, f: LaunchFacts) -> str | None:
        """Which need a death bounds from below: kv_pool, cuda_graph, serve, eager (None: other cause)."""
        if f.outcome is not FailureKind.OOM or f.phase is None:
            return None
        if f.phase == "kv_pool":
            return "kv_pool"
        if f.phase == "cuda_graph":
            return "cuda_graph"
        if f.phase == "decode":
            bs = self.resolve(Candidate(f.mfs, f.max_bs, self.target))[1]
            return "eager" if bs is not None and self.target > bs else "serve"
        if f.phase in _SERVE_PHASES:
            return "serve"
        return None

    def bounds(self, tokens: int | None = None) -> dict[str, Bound]:
        """Each phase's need, bounded by the launches that died there and those that got through. The
        serving need grows with a prefill batch's ``tokens``: for a candidate at ``tokens`` only a death
        at as many tokens or fewer bounds it from below, only a survival at as many or more from above."""
        lower: dict[str, list[tuple[float, int]]] = {p: [] for p in PRIOR_NEED}
        upper: dict[str, list[tuple[float, int]]] = {p: [] for p in PRIOR_NEED}
        for f in self.facts:
            self._bound(f, lower, upper)
        if tokens is not None:
            t_of = {f.number: self.prefill_tokens(f.chunk) for f in self.facts}
            lower["serve"] = [x for x in lower["serve"] if (t := t_of.get(x[1])) is None or t <= tokens]
            upper["serve"] = [x for x in upper["serve"] if (t := t_of.get(x[1])) is None or t >= tokens]
        out: dict[str, Bound] = {}
        for p in PRIOR_NEED:
            ups = upper[p]
            hi = min(ups) if ups else None
            # A death above a proven survival was something else (noise, another process): dropped.
            lows = [x for x in lower[p] if hi is None or x[0] < hi[0]]
            lo = max(lows) if lows else None
            out[p] = Bound(lower=lo[0] if lo else None, upper=hi[0] if hi else None,
                           lower_from=tuple(n for _, n in lows), upper_from=tuple(n for _, n in ups))
        return out

    def _bound(self, f: LaunchFacts, lower: dict[str, list[tuple[float, int]]],
               upper: dict[str, list[tuple[float, int]]]) -> None:
        """Add what launch ``f`` says to the phases' lower (died there) and upper (got through) bounds."""
        cand = Candidate(f.mfs, f.max_bs, self.target)
        kv = self.kv(cand)
        cap = f.free_cap
        if cap is None:
            pred = self.free_after_capture(cand)
            cap = pred[0] if pred is not None else None
        _, bs = self.resolve(cand)
        eager = bs is not None and self.target > bs
        died = self._phase_of(f)
        if died == "kv_pool":
            if kv is not None:
                lower["kv_pool"].append((kv, f.number))
            return
        if kv is not None and f.phase != "load_weights" and (f.outcome == OK or f.free_pool is not None):
            upper["kv_pool"].append((kv, f.number))
        if cap is None:
            return
        if died == "cuda_graph":
            lower["cuda_graph"].append((cap, f.number))
            return
        if f.free_cap is not None:  # capture finished
            upper["cuda_graph"].append((cap, f.number))
        if died in ("serve", "eager"):
            held = (cap - f.free_at_oom + f.tried) if f.free_at_oom is not None and f.tried is not None else cap
            lower[died].append((max(cap, held), f.number))
        elif f.target_served:
            upper["serve"].append((cap, f.number))
            if eager:
                upper["eager"].append((cap, f.number))

    # ---- prediction -----------------------------------------------------------------------------

    def predict(self, cand: Candidate) -> Prediction | None:
        """The margin of ``cand`` in GiB with its sd, or None while no launch has given the figures."""
        kv = self.kv(cand)
        cap = self.free_after_capture(cand)
        if kv is None and cap is None:
            return None
        bounds = self.bounds(self.prefill_tokens(cand.chunk))
        _, bs = self.resolve(cand)
        pre = self._pre()
        rests: set[int] = set(pre[1]) if pre is not None else set()
        options: list[tuple[float, float, str, bool]] = []  # margin, sd, phase, certain death
        if kv is not None:
            b = bounds["kv_pool"]
            need, sd = b.estimate(PRIOR_NEED["kv_pool"])
            options.append((kv - need, math.hypot(sd, 0.05), "kv_pool",
                            b.lower is not None and kv + Z * 0.05 < b.lower))
            rests.update(b.lower_from)
        if cap is not None:
            phases = ["cuda_graph", "serve"] + (["eager"] if bs is not None and self.target > bs else [])
            for p in phases:
                b = bounds[p]
                need, sd = b.estimate(PRIOR_NEED[p])
                certain = b.lower is not None and cap[0] + Z * cap[1] < b.lower
                options.append((cap[0] - need, math.hypot(sd, cap[1]), p, certain))
                rests.update(b.lower_from)
            rests.update(n for _, _, n in self._graph_points())
        # A death that is certain under the proven bounds, or a margin below zero with confidence.
        options = [(m, d, p, c or m + Z * d < 0) for m, d, p, c in options]
        mfs, _ = self.resolve(cand)
        tokens = self.prefill_tokens(cand.chunk)
        for f in self.facts:  # the same configuration died of OOM: memory does not vary between runs
            if (f.outcome is FailureKind.OOM and f.mfs is not None and mfs is not None and abs(f.mfs - mfs) < 1e-6
                    and f.graph_bs == bs and self._phase_of(f) is not None
                    and self.prefill_tokens(f.chunk) == tokens):
                died = self._phase_of(f) or "oom"
                options.append((self.measured_margin(f), 0.02, died, True))
                rests.add(f.number)
        margin, sd, phase, _ = min(options, key=lambda o: o[0])
        certain = any(o[3] for o in options)
        if certain:
            margin, sd, phase, _ = min((o for o in options if o[3]), key=lambda o: o[0])
        return Prediction(margin_gib=margin, sd_gib=sd, kv_gib=kv,
                          free_after_capture_gib=cap[0] if cap else None, tightest=phase,
                          certain_death=certain, rests_on=tuple(sorted(rests)))

    def proven(self, cand: Candidate) -> bool:
        """True when launches have already shown that ``cand`` survives: at the pessimistic end of the fit
        it leaves at least the free memory after capture (and the KV pool) with which some launch got
        through each phase it will meet (an eager decode step included when the target concurrency
        exceeds its largest graph), or the same memory knobs served the target in a launch. No prior need
        enters: a phase no launch has got through is unproven."""
        cap = self.free_after_capture(cand)
        if cap is None:
            return False
        mfs, bs = self.resolve(cand)
        tokens = self.prefill_tokens(cand.chunk)
        if any(f.outcome == OK and f.target_served and f.mfs is not None and mfs is not None
               and abs(f.mfs - mfs) < 1e-6 and f.graph_bs == bs and _covers(self.prefill_tokens(f.chunk), tokens)
               for f in self.facts):
            return True
        bounds = self.bounds(tokens)
        phases = ["cuda_graph", "serve"] + (["eager"] if bs is not None and self.target > bs else [])
        for p in phases:
            hi = bounds[p].upper
            if hi is None or cap[0] - Z * cap[1] < hi:
                return False
        kv, kv_hi = self.kv(cand), bounds["kv_pool"].upper
        return kv_hi is None or (kv is not None and kv >= kv_hi)

    def candidate(self, params: Mapping[str, Any]) -> Candidate:
        """A trial's params as the model reads them (knobs not searched: as launched)."""
        mfs, bs = params.get("mem_fraction_static"), params.get("cuda_graph_max_bs")
        chunk = params.get("chunked_prefill_size")
        return Candidate(mfs=float(mfs) if isinstance(mfs, float) else None,
                         max_bs=int(bs) if isinstance(bs, int) else None, concurrency=self.target,
                         chunk=chunk if isinstance(chunk, int) and not isinstance(chunk, bool) else None)

    def predict_params(self, params: Mapping[str, Any]) -> Prediction | None:
        """:meth:`predict` for a trial's params (None for another memory class than the model's)."""
        if memory_class(params) != self.klass:
            return None
        return self.predict(self.candidate(params))

    def add_record(self, rec: TrialFacts) -> float | None:
        """Take a finished launch in at once (a launch that contradicts a prediction counts for the
        next); its :meth:`measured_margin`, or None when it says nothing about memory (or is of another
        memory class than the model's)."""
        if memory_class(rec.params) != self.klass:
            return None
        launch = facts_from_record(rec, target=self.target)
        if launch is None or launch.outcome not in (OK, FailureKind.OOM):
            return None
        self.facts.append(launch)
        return self.measured_margin(launch)

    def measured_margin(self, f: LaunchFacts) -> float:
        """The margin a launch showed: an OOM's deficit (negative), else what it had free after capture
        less the needs the model knows (never below zero: it survived)."""
        if f.outcome is FailureKind.OOM:
            if f.tried is not None and f.free_at_oom is not None:
                return min(f.free_at_oom - f.tried, -0.01)
            return -0.01
        pred = self.predict(Candidate(f.mfs, f.max_bs, self.target, f.chunk))
        if pred is None:
            return f.free_cap if f.free_cap is not None else 0.0
        return max(pred.margin_gib, 0.0)


# ---- vLLM ------------------------------------------------------------------------------------------

#: The two start-up checks of vLLM a configuration can fail, by the phase name a skip records.
VLLM_ALLOCATION = "kv_pool"  # the KV cache (or the utilization's share of the card) must fit what is free
VLLM_MAX_LEN = "max_model_len"  # one request of max_model_len must fit in the KV cache

#: The spread of "what is free" between launches (GiB): another process, the page cache, fragmentation.
VLLM_FREE_SD = 0.25


@dataclass(frozen=True)
class VllmFacts:
    """What one vLLM launch says about its memory checks (GiB). ``demand``: what the allocation check
    compares with what is free (the explicit KV cache space, else ``utilization * total``);
    ``available``: what a refusal said was free; ``kv``: the KV cache a survivor got; a max-model-len
    refusal's ``needed`` KV for ``max_model_len`` tokens."""

    number: int
    outcome: Outcome
    demand: float | None
    available: float | None = None
    refused: str | None = None  # VLLM_ALLOCATION | VLLM_MAX_LEN | None
    kv: float | None = None
    needed: float | None = None
    max_model_len: int | None = None
    utilization: float | None = None
    total: float | None = None


def _vllm_setting(params: Mapping[str, Any], fixed: Mapping[str, float], key: str) -> float | None:
    """A vLLM memory setting: searched (``params``), else fixed by the space (``fixed``)."""
    return _num(params, key) if key in params else _num(fixed, key)


def _vllm_demand(params: Mapping[str, Any], fixed: Mapping[str, float], total: float | None) -> float | None:
    """What vLLM's allocation check asks for: the explicit KV cache space, else utilization x total."""
    kv = _vllm_setting(params, fixed, "kv_cache_space_gib")
    if kv is not None:
        return kv
    util = _vllm_setting(params, fixed, "gpu_memory_utilization")
    return util * total if util is not None and total else None


def vllm_facts_from_record(rec: TrialFacts, fixed: Mapping[str, float] | None = None) -> VllmFacts | None:
    """The memory-check facts of a launched vLLM trial (None for a skip, a reuse or a trial with none)."""
    if rec.outcome is None or not rec.launched or rec.outcome not in (OK, FailureKind.OOM):
        return None
    fixed = fixed or {}
    mem, params = rec.memory, rec.params
    total = mem.number("gpu_total_gib") or mem.number("node_total_gib")
    length = _vllm_setting(params, fixed, "max_model_len")
    refused = None
    if rec.outcome is FailureKind.OOM and rec.phase is not None and rec.phase.value == "kv_pool":
        if mem.number("context_len") is not None and "max model len" in (rec.reason or ""):
            refused = VLLM_MAX_LEN
            length = mem.number("context_len")
        elif mem.number("kv_available_gib") is not None:
            refused = VLLM_ALLOCATION
    return VllmFacts(
        number=rec.number, outcome=rec.outcome, demand=_vllm_demand(params, fixed, total),
        available=mem.number("kv_available_gib") if refused == VLLM_ALLOCATION else None, refused=refused,
        kv=mem.number("kv_available_gib") if refused == VLLM_MAX_LEN else mem.number("kv_gib"),
        needed=mem.number("kv_requested_gib") if refused == VLLM_MAX_LEN else None,
        max_model_len=None if length is None else int(length),
        utilization=_vllm_setting(params, fixed, "gpu_memory_utilization"), total=total)


@dataclass
class VllmMemoryModel:
    """vLLM's start-up memory checks fitted to a study's launches (``v1/worker/gpu_worker.py`` and
    ``v1/core/kv_cache_utils.py`` at 0.11.0):

    * the allocation check: what a configuration asks for (``VLLM_CPU_KVCACHE_SPACE`` /
      ``--kv-cache-memory-bytes`` on the CPU backend, ``gpu_memory_utilization * total`` on a GPU) must
      not exceed what is free; a refusal says what was free, a survivor that it had at least its demand;
    * the max-model-len check: one request of ``max_model_len`` tokens needs ``len * bytes_per_token`` of
      KV cache (a refusal says how much for its length), which must fit in the KV cache the configuration
      gets (the explicit space, else ``utilization * total - non_kv``, ``non_kv`` from any survivor).

    Both are deterministic pre-checks: a configuration predicted to fail one with confidence is not
    launched (``predicted_oom``), and each launch's margin is the trial's memory constraint.
    """

    facts: list[VllmFacts] = field(default_factory=list)
    fixed: Mapping[str, float] = field(default_factory=dict)
    #: The memory class the model is fitted to (:func:`memory_class`): other classes get no prediction.
    klass: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_trials(cls, trials: Iterable[FrozenTrial | TrialFacts],
                    fixed: Mapping[str, float] | None = None) -> VllmMemoryModel:
        recs = [t if isinstance(t, TrialFacts) else TrialFacts.from_trial(t) for t in trials]
        facts = [f for f in (vllm_facts_from_record(r, fixed) for r in recs
                             if r.state in (TrialState.COMPLETE, TrialState.PRUNED)) if f is not None]
        return cls(facts=facts, fixed=dict(fixed or {}))

    def _total(self) -> float | None:
        seen = [f.total for f in self.facts if f.total is not None]
        return statistics.median(seen) if seen else None

    def free(self) -> tuple[float, tuple[int, ...]] | None:
        """What the allocation check found free (the smallest refusal's figure), and the trials it rests on."""
        seen = [(f.available, f.number) for f in self.facts if f.available is not None]
        if not seen:
            return None
        low = min(a for a, _ in seen)
        return low, tuple(n for _, n in seen)

    def gib_per_token(self) -> float | None:
        seen = [f.needed / f.max_model_len for f in self.facts
                if f.needed is not None and f.max_model_len]
        return statistics.fmean(seen) if seen else None

    def non_kv_gib(self) -> float | None:
        """``utilization * total - kv`` of the survivors (GPU backend)."""
        seen = [f.utilization * f.total - f.kv for f in self.facts
                if f.kv is not None and f.utilization is not None and f.total is not None
                and (f.outcome == OK or f.refused == VLLM_MAX_LEN)
                and "kv_cache_space_gib" not in self.fixed]
        return statistics.fmean(seen) if seen else None

    def _kv_of(self, params: Mapping[str, Any]) -> float | None:
        kv = _vllm_setting(params, self.fixed, "kv_cache_space_gib")
        if kv is not None:
            return kv
        util = _vllm_setting(params, self.fixed, "gpu_memory_utilization")
        non_kv, total = self.non_kv_gib(), self._total()
        if util is not None and non_kv is not None and total is not None:
            return util * total - non_kv
        return None

    def predict_params(self, params: Mapping[str, Any]) -> Prediction | None:
        """The margin of the tighter check in GiB, or None when no check applies: no launch has given its
        figures, a survivor already asked for as much, or the params are of another memory class."""
        if memory_class(params) != self.klass:
            return None
        options: list[tuple[float, float, str, bool, tuple[int, ...]]] = []
        demand = _vllm_demand(params, self.fixed, self._total())
        free = self.free()
        if demand is not None and free is not None:
            margin = free[0] - demand
            proven = any(f.outcome == OK and f.demand is not None and f.demand >= demand for f in self.facts)
            certain = margin < 0 and any(f.refused == VLLM_ALLOCATION and f.demand is not None
                                         and f.demand <= demand for f in self.facts)
            if not proven:
                options.append((margin, VLLM_FREE_SD, VLLM_ALLOCATION, certain, free[1]))
        per_token, kv = self.gib_per_token(), self._kv_of(params)
        length = _vllm_setting(params, self.fixed, "max_model_len")
        if per_token is not None and kv is not None and length is not None:
            margin = kv - per_token * length
            rests = tuple(f.number for f in self.facts if f.needed is not None or f.kv is not None)
            options.append((margin, 0.05 + 0.02 * abs(kv), VLLM_MAX_LEN, False, rests))
        if not options:
            return None
        margin, sd, phase, certain, rests = min(options, key=lambda o: o[0])
        certain = certain or margin + Z * sd < 0
        return Prediction(margin_gib=margin, sd_gib=sd, kv_gib=kv, free_after_capture_gib=None, tightest=phase,
                          certain_death=certain, rests_on=tuple(sorted(rests)))

    def add_record(self, rec: TrialFacts) -> float | None:
        """Take a finished launch in; its margin (a refusal's deficit, else the predicted headroom, at
        least zero), or None when it says nothing about memory."""
        if memory_class(rec.params) != self.klass:
            return None
        f = vllm_facts_from_record(rec, self.fixed)
        if f is None:
            return None
        self.facts.append(f)
        if f.refused == VLLM_ALLOCATION and f.demand is not None and f.available is not None:
            return min(f.available - f.demand, -0.01)
        if f.refused == VLLM_MAX_LEN and f.needed is not None and f.kv is not None:
            return min(f.kv - f.needed, -0.01)
        if f.outcome is FailureKind.OOM:
            return -0.01
        free = self.free()
        if free is not None and f.demand is not None:  # it got through: what was free less what it asked
            return max(free[0] - f.demand, 0.0)
        pred = self.predict_params(rec.params)
        return max(pred.margin_gib, 0.0) if pred is not None else 0.0


# ---- a study's model ----------------------------------------------------------------------------------


def workload_batch_tokens(space: Space) -> int | None:
    """:func:`batch_tokens` of the space's workload."""
    wl = space.workload
    return batch_tokens(space.target_level, None if wl.dataset else wl.input_len,
                        wl.prefix.len if wl.prefix is not None else 0)


def vllm_fixed(space: Space) -> dict[str, float]:
    """The vLLM memory settings a space fixes rather than searches: ``--max-model-len`` and
    ``--gpu-memory-utilization`` in ``fixed_args``, ``VLLM_CPU_KVCACHE_SPACE`` in ``env``."""
    given = {"max_model_len": flag_value(space.fixed_args, "--max-model-len"),
             "gpu_memory_utilization": flag_value(space.fixed_args, "--gpu-memory-utilization"),
             "kv_cache_space_gib": (space.env or {}).get("VLLM_CPU_KVCACHE_SPACE")}
    out: dict[str, float] = {}
    for key, value in given.items():
        if value is not None:
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def study_model(space: Space, trials: Iterable[TrialFacts]) -> MemoryModel | VllmMemoryModel | None:
    """The memory model of a study of ``space``, fitted to its finished launches: SGLang's arithmetic for
    SGLang and the simulated host, vLLM's start-up checks for vLLM, None for an engine without one."""
    family = engine_of(space).memory_family
    if family not in ("vllm", "sglang"):
        return None
    # Searched flags that move memory (a KV dtype, a draft model) split the launches into classes whose figures
    # differ; the model is fitted to the first launch's class and predicts only for it.
    trials = sorted(trials, key=lambda t: t.number)
    klass = next((memory_class(t.params) for t in trials if t.params), ())
    same = [t for t in trials if memory_class(t.params) == klass]
    if family == "vllm":
        model: MemoryModel | VllmMemoryModel = VllmMemoryModel.from_trials(same, vllm_fixed(space))
    else:
        model = MemoryModel.from_trials(same, target=space.target_level, batch_tokens=workload_batch_tokens(space))
    model.klass = klass
    return model


#: Free flags (a name, or a prefix ending in ``-``) that change the memory a server's weights, KV cache or graphs
#: take: the KV dtype (bytes per token), speculative decoding (a draft model's weights and KV, and from SGLang
#: 0.5.2 to 0.5.13 a larger reserve: runners/engines/sglang_memory.py), weight dtype and quantisation, paging,
#: DP attention, offloading and the hierarchical cache.
MEMORY_FLAGS = ("--kv-cache-dtype", "--speculative-", "--dtype", "--quantization", "--page-size",
                "--enable-dp-attention", "--dp-size", "--data-parallel-size", "--cpu-offload-gb",
                "--enable-hierarchical-cache", "--hicache-", "--context-length", "--max-total-tokens",
                "--max-model-len", "--kv-cache-memory-bytes", "--block-size", "--swap-space")


def memory_class(params: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The values of the memory-moving free flags (:data:`MEMORY_FLAGS`) in ``params``: launches of one class
    share the memory arithmetic's figures."""
    return tuple(sorted((k, str(v)) for k, v in params.items() if k.startswith("--") and v is not None
                        and any(k == f or (f.endswith("-") and k.startswith(f)) for f in MEMORY_FLAGS)))
