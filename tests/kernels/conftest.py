"""Shared helpers of the kernel tests."""

from __future__ import annotations

import pytest


def _assert_plain(value):
    """Only built-in JSON-able values (what crosses from an xdist worker to the controller)."""
    if isinstance(value, dict):
        assert all(isinstance(k, str) for k in value)
        for v in value.values():
            _assert_plain(v)
    elif isinstance(value, list):
        for v in value:
            _assert_plain(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), (type(value), value)


@pytest.fixture
def assert_plain():
    """``assert_plain(value)``: fails unless ``value`` is made of dicts, lists, str, int, float, bool, None."""
    return _assert_plain
