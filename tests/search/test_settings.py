"""Settings precedence, proven once: CLI > environment > file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.errors import ConfigError
from search.settings import load_settings


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVETUNE_STORAGE", raising=False)
    monkeypatch.delenv("SERVETUNE_CONFIG", raising=False)
    assert load_settings().storage == "sqlite:///servetune.db"  # default
    (tmp_path / "servetune.toml").write_text('storage = "sqlite:///file.db"\nmlflow_uri = "sqlite:///f.db"\n')
    assert load_settings().storage == "sqlite:///file.db"  # file beats default
    monkeypatch.setenv("SERVETUNE_STORAGE", "sqlite:///env.db")
    settings = load_settings()
    assert settings.storage == "sqlite:///env.db"  # environment beats file
    assert settings.mlflow_uri == "sqlite:///f.db"  # ...only for what it sets
    assert load_settings(storage="sqlite:///cli.db").storage == "sqlite:///cli.db"  # CLI beats all
    assert load_settings(storage=None).storage == "sqlite:///env.db"  # an absent CLI option is not given


def test_bad_setting_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVETUNE_DASHBOARD_PORT", "99999")
    with pytest.raises(ConfigError, match="dashboard_port"):
        load_settings()
    monkeypatch.delenv("SERVETUNE_DASHBOARD_PORT")
    (tmp_path / "servetune.toml").write_text('nonsense = 1\n')
    with pytest.raises(ConfigError, match="nonsense"):
        load_settings()
