"""Fixtures shared by the runner tests: the streaming stand-in server of the load generator's tests."""

from tests.runners.test_loadgen import server  # noqa: F401 (a fixture, found by pytest here)
