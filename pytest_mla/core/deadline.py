"""A bound on one cell: ``SIGALRM`` raises ``CellTimeout`` in the code that hangs.

An engine that hangs in ``configure`` or a kernel check that never returns
must end as that cell's ``error`` and let the other cells run, with or
without xdist (each worker runs its cells in its main thread). The alarm
interrupts Python code and blocking waits; ``CellTimeout`` derives from
``BaseException`` so that an engine's ``except Exception`` cannot swallow it.
Where there is no ``SIGALRM`` (Windows) or the cell does not run in the main
thread, the cell is not bounded.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

__all__ = ["CellTimeout", "Deadline"]


class CellTimeout(BaseException):
    """The cell ran past ``--mla-cell-timeout``; ``phase`` is what it was doing."""

    def __init__(self, seconds: float, phase: str) -> None:
        super().__init__(f"timed out after {seconds:g} s in {phase}")
        self.seconds = seconds
        self.phase = phase


class Deadline:
    """``with Deadline(seconds) as d: ...; d.phase = "kernel"; ...`` (``seconds`` None: no bound)."""

    def __init__(self, seconds: float | None, phase: str = "configure") -> None:
        self.seconds = seconds
        self.phase = phase
        self.active = False
        self._previous: object = None

    def __enter__(self) -> "Deadline":
        if (self.seconds and hasattr(signal, "setitimer")
                and threading.current_thread() is threading.main_thread()):
            self._previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self.active = True
        return self

    def _expire(self, signum: int, frame: FrameType | None) -> None:
        raise CellTimeout(self.seconds or 0.0, self.phase)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)  # type: ignore[arg-type]
            self.active = False
