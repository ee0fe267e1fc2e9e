"""The base of every section of a space file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown keys are refused (a typo is an error, not a silent default) and a loaded value never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
