"""optuna-dashboard's two storage helpers (a trial's note, a study's figure), without its web app.

``import optuna_dashboard`` loads the whole app, and with it ``optuna.importance`` and scikit-learn: a second
and about 160 MB of the controller's memory, for two functions that only write study attributes. The modules
that hold them (``_note``, ``_custom_plot_data``) import nothing of the package, so they are loaded here on
their own, from the installed package's directory, once. Where that fails (a release that moved them) the
package is imported as before.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["save_note", "save_plotly_graph_object"]


@functools.cache
def _module(name: str) -> ModuleType:
    """``optuna_dashboard.<name>`` loaded alone (its package's ``__init__`` not run)."""
    package = importlib.util.find_spec("optuna_dashboard")  # a top-level name: finding it runs nothing
    locations = list(package.submodule_search_locations or []) if package is not None else []
    for location in locations:
        path = Path(location) / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"servetune_optuna_dashboard{name}", path)
        if path.is_file() and spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return importlib.import_module("optuna_dashboard")


def save_note(target: Any, body: str) -> None:
    """optuna-dashboard's ``save_note(study_or_trial, body)``."""
    _module("_note").save_note(target, body)


def save_plotly_graph_object(study: Any, figure: Any, *, graph_object_id: str | None = None) -> str:
    """optuna-dashboard's ``save_plotly_graph_object(study, figure, graph_object_id=...)``."""
    return str(_module("_custom_plot_data").save_plotly_graph_object(study, figure, graph_object_id=graph_object_id))
