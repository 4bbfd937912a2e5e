"""Shared fixtures of the plugin tests (the scriptable engines are in ``helpers.py``)."""

from __future__ import annotations

import pytest

from .helpers import LIAR_CONFTEST



@pytest.fixture
def liar(pytester):
    """A pytester whose conftest registers ``LiarEngine`` (``helpers.LIAR_CONFTEST``) as engine ``liar``."""
    pytester.makeconftest(LIAR_CONFTEST)
    return pytester
