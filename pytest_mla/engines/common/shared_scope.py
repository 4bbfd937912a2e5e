"""One set-up shared by the in-process DCP ranks of a check: the first rank to enter makes it, the last undoes it.

Ranks run as threads that take turns; a patch that one rank undid on its way
out while another still runs would hand the other the real callable (or the
other arch's constants). Every rank sees the one value the set-up yielded.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

__all__ = ["SharedScope"]


class SharedScope:
    """A refcounted context: ``with shared.enter(key, make) as value:`` (``make()`` a context manager).

    ``key`` names what the set-up is for; a rank asking for another key while
    one is entered is a ``RuntimeError`` (two checks in one process at once).
    """

    def __init__(self, what: str = "checks") -> None:
        self.what = what
        self.lock = threading.RLock()  # (a set-up that re-enters from its own thread must not deadlock)
        self.count = 0
        self.key: Any = None
        self.stack: contextlib.ExitStack | None = None
        self.value: Any = None

    @contextlib.contextmanager
    def enter(self, key: Any, make: Callable[[], contextlib.AbstractContextManager]) -> Iterator[Any]:
        with self.lock:
            if self.count == 0:
                stack = contextlib.ExitStack()
                try:
                    self.value = stack.enter_context(make())
                except BaseException:
                    stack.close()
                    raise
                self.stack, self.key = stack, key
            elif key != self.key:
                raise RuntimeError(f"{self.what}: concurrent checks want {key!r} and {self.key!r}")
            self.count += 1
        try:
            yield self.value
        finally:
            with self.lock:
                self.count -= 1
                if self.count == 0:
                    stack, self.stack, self.value = self.stack, None, None
                    stack.close()
