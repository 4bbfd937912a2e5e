"""A bound on one cell: ``SIGALRM`` raises ``CellTimeout`` in the code that hangs.

An engine that hangs in ``configure`` or a kernel check that never returns
must end as that cell's ``error`` and let the other cells run, with or
without xdist (each worker runs its cells in its main thread). The alarm
interrupts Python code and blocking waits; ``CellTimeout`` derives from
``BaseException`` so that an engine's ``except Exception`` cannot swallow it.
Where there is no ``SIGALRM`` (Windows) or the cell does not run in the main
thread, the cell is not bounded.

Every cell arms the timer, so the handler is installed once and stays (two
``setitimer`` calls per cell, not four system calls): outside a cell it acts
as the handler it replaced (the default one ends the process, as before).
A handler someone else installs meanwhile is put back after the cell.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["CellTimeout", "Deadline", "MAX_TIMEOUT", "positive_seconds"]


class CellTimeout(BaseException):
    """The cell ran past ``--mla-cell-timeout``; ``phase`` is what it was doing."""

    def __init__(self, seconds: float, phase: str) -> None:
        super().__init__(f"timed out after {seconds:g} s in {phase}")
        self.seconds = seconds
        self.phase = phase


_active: "Deadline | None" = None  # the deadline of the cell running now (one at a time: the main thread)
_replaced: Any = signal.SIG_DFL  # the handler ``_on_alarm`` stands in for outside a cell


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    deadline = _active
    if deadline is not None:
        raise CellTimeout(deadline.seconds or 0.0, deadline.phase)
    if callable(_replaced):
        _replaced(signum, frame)
    elif _replaced != signal.SIG_IGN:  # the default action: end the process, as without us
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGALRM)


class Deadline:
    """``with Deadline(seconds) as d: ...; d.phase = "kernel"; ...`` (``seconds`` None: no bound)."""

    def __init__(self, seconds: float | None, phase: str = "configure") -> None:
        self.seconds = seconds
        self.phase = phase
        self.active = False
        self._restore: Any = None  # a handler installed by someone else, put back after the cell

    def __enter__(self) -> "Deadline":
        global _active, _replaced
        if self.seconds and _HAS_ITIMER and threading.current_thread() is _MAIN:
            current = signal.getsignal(signal.SIGALRM)
            if current is not _on_alarm:
                signal.signal(signal.SIGALRM, _on_alarm)
                if current in (signal.SIG_DFL, signal.SIG_IGN, None):
                    _replaced = signal.SIG_DFL if current is None else current  # we stand in for it from now on
                else:
                    self._restore = current
            _active = self
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.active = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _active
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _active = None
            self.active = False
            if self._restore is not None:
                signal.signal(signal.SIGALRM, self._restore)
                self._restore = None


#: The longest timeout taken (a year): the timers behind them overflow long before ``inf``.
MAX_TIMEOUT = 365 * 24 * 3600.0


def positive_seconds(text: str) -> float:
    """``text`` as a positive, finite number of seconds up to ``MAX_TIMEOUT``; ``ValueError`` (whose
    text the caller prefixes with its option's name) otherwise. NaN, inf, 0 and negatives are refused."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT:
        raise ValueError(f"expected a positive number of seconds up to {MAX_TIMEOUT:.0f}, got {text!r}")
    return value

_HAS_ITIMER = hasattr(signal, "setitimer")
_MAIN = threading.main_thread()
