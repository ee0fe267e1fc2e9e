"""The ``servetune`` command: a thin Typer app over the library (:mod:`search.api` and the parts of search/)."""

from search.cli.commands import app, main

__all__ = ["app", "main"]
