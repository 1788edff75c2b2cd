"""Tests by tier; see tests/conftest.py's docstring."""
