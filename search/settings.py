"""Controller settings, with one stated precedence: CLI > environment > file > default.

* CLI: options given on the command line (passed to :func:`load_settings` as overrides);
* environment: ``SERVETUNE_STORAGE``, ``SERVETUNE_MLFLOW_URI``, ``SERVETUNE_ARTIFACTS_DIR``, ...;
* file: ``servetune.toml`` in the working directory (or ``SERVETUNE_CONFIG``), top-level keys;
* defaults below.

Searched knobs (NCCL variables included) are part of the launch config, never of the settings.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from runners.errors import ConfigError, validation_line
from runners.host import DEFAULT_HOST_DIR
from spaces.names import check_name

#: Defaults shared with the library entry points (:mod:`search.storage`, :mod:`search.driver.run`,
#: :mod:`search.outputs.tracking`), which take them when no settings are given.
HEARTBEAT_INTERVAL = 5
#: Seconds a dropped connection to the study's database server is retried (a restart, a network blip).
STORAGE_RETRY = 300.0
GRACE_PERIOD = 20
DEFAULT_TRACKING_URI = "sqlite:///mlruns/mlflow.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVETUNE_", extra="forbid", toml_file="servetune.toml")

    storage: str = "sqlite:///servetune.db"
    mlflow_uri: str = DEFAULT_TRACKING_URI
    artifacts_dir: Path = Path("servetune-artifacts")
    runs_root: str = "~/.servetune/runs"
    host_dir: str = DEFAULT_HOST_DIR
    """Where the controllers of every user keep their leases and the claim of a host's GPUs (on each host)."""
    sim_dir: Path = Path(".servetune/simhost")
    dashboard_port: int = Field(default=8080, ge=1, le=65535)
    smi_interval: float = Field(default=1.0, ge=0)
    heartbeat_interval: int = Field(default=HEARTBEAT_INTERVAL, ge=1)
    """Seconds between a running trial's heartbeats in the study storage."""
    storage_retry: float = Field(default=STORAGE_RETRY, ge=0)
    """Seconds a dropped connection to the study's database server is retried before a run stops (0: never)."""
    heartbeat_grace: int = Field(default=GRACE_PERIOD, ge=2)
    """Seconds without a heartbeat after which a RUNNING trial's controller is taken for dead."""
    outputs: tuple[str, ...] = ("notes", "figures", "report", "mlflow")
    """What a run writes besides the study (``search/outputs/registry.py``): ``notes`` and ``figures`` for
    optuna-dashboard, ``report`` (report.md, report.html), ``mlflow``; ``servetune run --no-mlflow`` leaves MLflow
    out."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = os.environ.get("SERVETUNE_CONFIG", "servetune.toml")
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=toml_file))


def study_name(value: str) -> str:
    """``value`` if it is a safe study name (:func:`spaces.names.check_name`: one path component of
    letters, digits, ``.``, ``_``, ``-``, no ``..``, at most 128 characters); else a one-line ConfigError.

    A study name becomes a directory on every host and under the artifacts directory, an MLflow experiment
    and a line of ``launch.sh``: every entry point that takes one (``run``, ``worker``, ``trials``,
    ``status``, ``report``, ``export``, ``sync-mlflow``, ``make demo``, :func:`search.driver.run.run_search`)
    checks it here before anything is read, written or run.
    """
    try:
        return check_name(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_settings(**cli: Any) -> Settings:
    """Settings with CLI overrides (None means "not given on the command line")."""
    given = {k: v for k, v in cli.items() if v is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        where, msg = validation_line(exc)
        raise ConfigError(f"setting {where or 'settings'}: {msg}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"settings file: {exc}") from None
