"""The cell deadline: SIGALRM ends a hung cell; outside cells the process behaves as without it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pytest_mla.core.deadline import CellTimeout, Deadline

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no SIGALRM timers here")


def test_a_hung_cell_ends_with_its_phase_and_the_next_cell_runs():
    with pytest.raises(CellTimeout, match=r"timed out after 0.05 s in the kernel check"):
        with Deadline(0.05) as d:
            d.phase = "the kernel check"
            time.sleep(5)
    with Deadline(0.05):  # a cell that finishes in time is not interrupted later
        pass
    time.sleep(0.1)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_handler_someone_else_installed_is_put_back_after_each_cell():
    calls = []

    def theirs(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGALRM, theirs)
    try:
        for _ in range(2):
            with Deadline(10):
                assert signal.getsignal(signal.SIGALRM) is not theirs  # the cell's own, during the cell
            assert signal.getsignal(signal.SIGALRM) is theirs and len(calls) == _
            signal.raise_signal(signal.SIGALRM)  # outside a cell: theirs runs
        assert calls == [signal.SIGALRM, signal.SIGALRM]
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_an_alarm_outside_a_cell_still_ends_the_process_like_the_default():
    code = textwrap.dedent("""
        import signal, time
        from pytest_mla.core.deadline import Deadline
        with Deadline(10):
            pass
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # someone else's alarm, after the cell
        time.sleep(5)
        print("survived")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGALRM and "survived" not in done.stdout
