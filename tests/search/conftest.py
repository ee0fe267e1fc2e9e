"""Fixtures of the search tests."""

from __future__ import annotations

import optuna
import pytest

from tests.fixtures.trials import build_study, standard_trials


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    """The standard trials (tests/fixtures/trials.py) in a fresh SQLite study "qwen-h100", one per test module."""
    url = f"sqlite:///{tmp_path_factory.mktemp('study') / 'optuna.db'}"
    return build_study(url, "qwen-h100", standard_trials())
