"""servetune's orchestration: the study, the objective, MLflow, notes, report and export.

The library's entry point is :func:`run_study` (what ``servetune run`` calls). It is imported on first
use, so that ``servetune --help`` does not pay for Optuna and MLflow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from search.api import RunPlan, run_study
    from search.driver.run import RunSummary, StopReason

__all__ = ["RunPlan", "RunSummary", "StopReason", "run_study"]

_LAZY = {"RunPlan": "search.api", "run_study": "search.api", "RunSummary": "search.driver.run",
         "StopReason": "search.driver.run"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'search' has no attribute {name!r}")
