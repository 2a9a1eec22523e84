"""Shared pytest configuration."""

pytest_plugins = ["tests.conftest_llama"]
