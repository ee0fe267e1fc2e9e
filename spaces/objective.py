"""What a trial is scored by: the objective (one metric at a concurrency level, the highest rate under an SLO,
or a throughput-latency front), its SLO limits, the rate search, and the units of what it reports."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from spaces.strict import Strict


class Slo(Strict):
    p99_ttft_ms: float | None = Field(default=None, gt=0)
    p99_tpot_ms: float | None = Field(default=None, gt=0)
    max_error_rate: float | None = Field(default=None, ge=0, lt=1)
    """Largest share of failed requests a level may have and still hold the SLO."""

    def limits(self) -> dict[str, float]:
        """The set limits by metric name (``error_rate`` for ``max_error_rate``)."""
        named = {"p99_ttft_ms": self.p99_ttft_ms, "p99_tpot_ms": self.p99_tpot_ms,
                 "error_rate": self.max_error_rate}
        return {k: v for k, v in named.items() if v is not None}


class RateSearch(Strict):
    """How ``max_rate_under_slo`` looks for a configuration's highest rate: bracketing from ``start`` (doubling
    up or halving down within ``[low, high]``), then bisection until the bracket is within ``tolerance``
    (relative) or ``steps`` measurements are spent."""

    start: float = Field(default=4.0, gt=0)
    low: float = Field(default=0.25, gt=0)
    high: float = Field(default=256.0, gt=0)
    steps: int = Field(default=8, ge=2, le=30)
    tolerance: float = Field(default=0.05, gt=0, lt=1)
    requests: int = Field(default=200, ge=10)
    """Requests sent at each rate (Poisson arrivals, at most ``objective.level`` in flight)."""
    result: Literal["rate", "goodput"] = "rate"
    """The trial's value: the rate found, or the output throughput measured at it."""

    @model_validator(mode="after")
    def _bounds(self) -> RateSearch:
        if not self.low <= self.start <= self.high:
            raise ValueError(f"need low <= start <= high, got {self.low:g}, {self.start:g}, {self.high:g}")
        return self


#: The load generator's figures (bench_serving's names) a ``pareto`` objective may trade off, each with the
#: direction that makes it better: a throughput is maximised, a latency minimised.
PARETO_METRICS: dict[str, Literal["maximize", "minimize"]] = {
    **{name: "maximize" for name in ("output_throughput", "request_throughput", "input_throughput",
                                     "total_throughput")},
    **{f"{stat}_{what}_ms": "minimize" for what in ("ttft", "tpot", "itl", "e2e_latency")
       for stat in ("mean", "median", "p99")},
    "cost_per_mtok": "minimize",
    "energy_per_token_j": "minimize",
}

#: Figures a trial derives from its target level and its host rather than the load generator's record: the price
#: of a million output tokens (from the host's price per GPU-hour) and the joules per output token (from
#: nvidia-smi's power.draw over the level's load window).
DERIVED_METRICS = ("cost_per_mtok", "energy_per_token_j")


class ParetoMetric(Strict):
    """One metric of a ``pareto`` objective: a load generator figure at the objective's level, and whether
    more or less of it is better (default: the only direction that makes sense for it)."""

    name: str
    direction: Literal["maximize", "minimize"] | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in PARETO_METRICS:
            raise ValueError(f"unknown metric {v!r}; allowed: {', '.join(PARETO_METRICS)}")
        return v

    @model_validator(mode="after")
    def _sense(self) -> ParetoMetric:
        natural = PARETO_METRICS[self.name]
        if self.direction is not None and self.direction != natural:
            what = "a latency" if natural == "minimize" else "a throughput"
            raise ValueError(f"{self.name} is {what}: its direction is {natural}, not {self.direction}")
        return self

    @property
    def sense(self) -> Literal["maximize", "minimize"]:
        return self.direction or PARETO_METRICS[self.name]


#: The unit of each figure a trial can be scored by (:attr:`Objective.scored_by`), for what prints it.
OBJECTIVE_UNITS = {"output_throughput": "tok/s", "total_throughput": "tok/s", "input_throughput": "tok/s",
                   "request_throughput": "req/s", "slo_request_rate": "req/s", "slo_goodput": "tok/s",
                   "cost_per_mtok": "per 1M output tokens (the inventory's currency)",
                   "energy_per_token_j": "J/output token"}


class Objective(Strict):
    """What a trial is scored by.

    * ``throughput_at``: ``metric`` at concurrency ``level``; SLO limits are Optuna constraints;
    * ``max_rate_under_slo``: the highest request rate at which every ``slo`` limit holds (``rate`` says how
      it is searched), with at most ``level`` requests in flight;
    * ``pareto``: two or more ``metrics`` at concurrency ``level``, each with its direction, as one Optuna
      multi-objective study (the trials that no other beats on every metric form the front); SLO limits
      (p99 TTFT, p99 TPOT) are Optuna constraints, as for ``throughput_at``;
    * ``cost_per_mtok``: the price of a million output tokens at concurrency ``level`` (each host's
      ``price_per_gpu_hour`` in the inventory x the server's GPUs / its output throughput), minimised;
    * ``energy_per_token``: joules per output token at ``level`` (nvidia-smi's ``power.draw`` summed over the
      server's GPUs, averaged over that level's load window only, / its output throughput), minimised.
      Both take SLO limits as ``throughput_at`` does, and both can be ``pareto`` metrics
      (``cost_per_mtok``, ``energy_per_token_j``).
    """

    kind: Literal["throughput_at", "max_rate_under_slo", "pareto", "cost_per_mtok", "energy_per_token"] = \
        "throughput_at"
    metric: Literal["output_throughput", "request_throughput", "total_throughput"] = "output_throughput"
    metrics: list[ParetoMetric] | None = None
    level: int | None = None
    slo: Slo = Field(default_factory=Slo)
    rate: RateSearch | None = None

    @model_validator(mode="after")
    def _kind(self) -> Objective:
        if self.kind != "max_rate_under_slo" and self.rate is not None:
            raise ValueError(f"rate is only for kind max_rate_under_slo (this objective is {self.kind})")
        if self.kind != "pareto" and self.metrics is not None:
            raise ValueError(f"metrics is only for kind pareto (this objective is {self.kind}: give metric)")
        if self.kind == "pareto":
            self._check_pareto()
        if self.kind in ("cost_per_mtok", "energy_per_token"):
            if "metric" in self.model_fields_set:
                raise ValueError(f"{self.kind} scores {self.scored_by}; drop metric")
            if self.slo.max_error_rate is not None:
                raise ValueError("slo.max_error_rate is only for max_rate_under_slo; allowed here: "
                                 "slo.p99_ttft_ms, slo.p99_tpot_ms")
        if self.kind == "max_rate_under_slo":
            if not self.slo.limits():
                raise ValueError("max_rate_under_slo needs at least one slo limit "
                                 "(p99_ttft_ms, p99_tpot_ms or max_error_rate)")
            if "metric" in self.model_fields_set:
                raise ValueError("max_rate_under_slo scores the rate (or rate.result: goodput); drop metric")
        return self

    def _check_pareto(self) -> None:
        names = [m.name for m in self.metrics or []]
        if len(names) < 2:
            raise ValueError(f"pareto needs 2 or more metrics to trade off (got {len(names)}); for one metric "
                             "use kind throughput_at")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pareto metric {twice[0]} is named twice; each metric once")
        if "metric" in self.model_fields_set:
            raise ValueError("pareto scores its metrics list; drop metric")
        if self.slo.max_error_rate is not None:
            raise ValueError("slo.max_error_rate is only for max_rate_under_slo (a pareto trial's level must "
                             "serve every request); allowed here: slo.p99_ttft_ms, slo.p99_tpot_ms")

    @property
    def rate_search(self) -> RateSearch:
        return self.rate or RateSearch()

    @property
    def scored_by(self) -> str:
        """The name of what a trial's value is: the metric, or for ``max_rate_under_slo`` the rate found
        (``slo_request_rate``, req/s) or the output throughput at it (``slo_goodput``, tok/s); for ``pareto``
        the first of its metrics (the others are in :attr:`metric_names`)."""
        if self.kind == "max_rate_under_slo":
            return "slo_request_rate" if self.rate_search.result == "rate" else "slo_goodput"
        if self.kind == "pareto":
            return self.metric_names[0]
        if self.kind == "cost_per_mtok":
            return "cost_per_mtok"
        if self.kind == "energy_per_token":
            return "energy_per_token_j"
        return self.metric

    @property
    def metric_names(self) -> list[str]:
        """The names of the study's objectives, in order (one but for ``pareto``)."""
        if self.kind == "pareto":
            return [m.name for m in self.metrics or []]
        return [self.scored_by]

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        """The study's directions, one per :attr:`metric_names` (a throughput or rate is maximised, a cost or an
        energy minimised)."""
        if self.kind == "pareto":
            return [m.sense for m in self.metrics or []]
        return [PARETO_METRICS.get(self.scored_by, "maximize")]

    @property
    def needs_price(self) -> bool:
        """Every host must state its price per GPU-hour."""
        return "cost_per_mtok" in self.metric_names

    @property
    def needs_power(self) -> bool:
        """The hosts' nvidia-smi must report power.draw."""
        return "energy_per_token_j" in self.metric_names
