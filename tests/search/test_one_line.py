"""Small shared helpers: one line of an error, one line of a validation error, URLs parsed by SQLAlchemy."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator

from runners.errors import first_line, validation_line
from search.storage import redact, sqlite_file


def test_first_line() -> None:
    assert first_line(RuntimeError("  boom\nTraceback ...\n")) == "boom"
    assert first_line(KeyError()) == "KeyError"
    assert first_line("plain text") == "plain text"


class _Model(BaseModel):
    port: int = Field(ge=1)
    name: str = "x"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value == "bad":
            raise ValueError("a bad name")
        return value


def test_validation_line() -> None:
    with pytest.raises(ValidationError) as info:
        _Model(port=0)
    assert validation_line(info.value) == ("port", "Input should be greater than or equal to 1")
    with pytest.raises(ValidationError) as info:
        _Model(port=1, name="bad")
    assert validation_line(info.value) == ("name", "a bad name")


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg://servetune:s3cret@pg-box:5432/servetune", "postgresql+psycopg://servetune:***@pg-box:5432/servetune"),
    ("postgresql://pg-box/servetune", "postgresql://pg-box/servetune"),
    ("sqlite:///servetune.db", "sqlite:///servetune.db"),
    ("http://mlflow-box:5000", "http://mlflow-box:5000"),
    ("not a url", "not a url"),
])
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_sqlite_file() -> None:
    assert sqlite_file("sqlite:///servetune.db") == Path("servetune.db")
    assert sqlite_file("sqlite:////srv/st/servetune.db?timeout=30") == Path("/srv/st/servetune.db")
    assert sqlite_file("sqlite://") is None
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql+psycopg://u:p@h/db") is None
    assert sqlite_file("http://mlflow-box:5000") is None
