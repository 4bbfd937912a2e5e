"""Fixtures the test packages share."""

import signal

import pytest


@pytest.fixture
def no_hang():
    """A run or command that opened a FIFO to write would block for ever: fail the test instead."""
    def stuck(signum, frame):
        raise TimeoutError("blocked (a FIFO opened for writing?)")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
