"""servetune's orchestration: the only package that knows Optuna, MLflow and the runners together.

Its parts, each a sub-package that names its job (as optuna has ``study/``, ``samplers/``, ``trial/``):

* ``trial`` -- one trial: the record (:class:`~search.trial.records.TrialFacts`), the objective, the server
  evaluator, the preflight, the workload and the SLO rate search;
* ``strategy`` -- what to try and what to recommend: distributions, the probe and start-up design, the memory
  model, confirmation, the Pareto front, the choice (:func:`~search.strategy.choice.choose`), the study view
  and the :class:`~search.strategy.strategy.Strategy`;
* ``driver`` -- running a search: the run loop, the budget and study lock, leases, signals, the host pool,
  the hosts;
* ``outputs`` -- what people read: the report (Markdown and HTML), status, figures, dashboard notes, MLflow
  tracking, export;
* ``api`` -- :func:`run_study`, the library call behind ``servetune run``;
* ``cli`` -- the Typer app and its terminal views.

Leaf modules any part may use, which import no part: ``storage`` (the study storage), ``settings``,
``files``, ``spaces`` (loading a space with the engines' checks) and ``_optuna_compat``.

Import rules (``tests/test_architecture.py`` checks them; every import counts, in functions and under
``TYPE_CHECKING`` too): no import circle anywhere in search/, spaces/, runners/; ``trial`` imports no other
part; ``strategy`` imports only ``trial.records``; ``driver`` imports ``trial`` and ``strategy``;
``outputs`` imports ``trial.records`` and ``strategy``, never ``driver``; ``api`` imports any part but
``cli``; ``cli`` imports anything. Outside ``cli`` nothing imports first-party code inside a function
(third-party libraries that are slow to import, such as MLflow and plotly, are imported where used).

The package itself exports :func:`run_study` and its types lazily, so that ``servetune --help`` does not pay
for Optuna and MLflow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.api import RunPlan, run_study
    from search.driver.run import RunSummary, StopReason

__all__ = ["RunPlan", "RunSummary", "StopReason", "run_study"]

_LAZY = {"RunPlan": "search.api", "run_study": "search.api", "RunSummary": "search.driver.run",
         "StopReason": "search.driver.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'search' has no attribute {name!r}")
