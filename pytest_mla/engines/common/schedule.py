"""A backend's split-KV schedule: which split counts its kernel was handed, and from what length it splits.

Decode kernels change schedule with size: vLLM's TRITON_MLA splits a request's
KV only past ``2 * _MIN_WORK_PER_SPLIT`` cached tokens (per DCP rank), SGLang's
triton backend picks a split count per request from the batch's lengths. A
check that never crosses the threshold never runs the split merge, the path
every long request on a server takes. ``SplitSchedule`` names, for one backend,
the kernel call that receives the split count and how to read the threshold
from the engine's own code; ``recorded_splits`` records what the engine handed
its kernel during a check, for the kernel record (``RankResult.schedule``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import threading
from typing import Any, Callable, Iterator

__all__ = ["SplitSchedule", "recorded_splits"]


@dataclasses.dataclass(frozen=True)
class SplitSchedule:
    """Where a backend's split count shows, and from how many cached tokens (per rank) it splits."""

    #: ``module:attr``: the kernel entry point as the backend's module binds it (the name its impl calls);
    #: ``:attr``: an attribute of the backend object (``recorded_splits``'s ``owner``).
    call: str
    #: The parameter of that call that carries the split count (an int, or a tensor of one per request).
    argument: str
    #: Reads, from the installed engine, the cached tokens (per rank) from which one request takes more
    #: than one split; None: this release has no such threshold (the check then adds no long case).
    split_from: Callable[[], int | None] = lambda: None


#: The calls spied on now: ``(module name or owner id, attr) -> (holder, original, recorders)``. DCP ranks run in threads of one process
#: and record at once: the first installs the spy, the last puts the original back, and every active
#: recorder sees every rank's counts (a check keeps the union over its ranks anyway).
_ACTIVE: dict[tuple[Any, str], tuple[Any, Any, list[list[int]]]] = {}
_LOCK = threading.Lock()


@contextlib.contextmanager
def recorded_splits(schedule: SplitSchedule | None, owner: Any = None) -> Iterator[list[int]]:
    """Record the split counts the engine hands ``schedule.call`` inside the block (distinct values, in the
    list yielded, filled as calls are made). ``None``: nothing recorded. The call is replaced only where
    it is bound (the module ``module:attr`` names, or ``owner``'s attribute ``attr`` where the engine
    binds its kernel on an object), for the block, and calls through unchanged."""
    seen: list[int] = []
    if schedule is None:
        yield seen
        return
    module_name, _, attr = schedule.call.rpartition(":")
    key = (id(owner) if owner is not None else module_name, attr)
    with _LOCK:
        if key not in _ACTIVE:
            holder = owner if owner is not None else importlib.import_module(module_name)
            original = getattr(holder, attr)
            recorders: list[list[int]] = []
            setattr(holder, attr, _spy(original, schedule.argument, recorders))
            _ACTIVE[key] = (holder, original, recorders)
        _ACTIVE[key][2].append(seen)
    try:
        yield seen
    finally:
        with _LOCK:
            holder, original, recorders = _ACTIVE[key]
            recorders.remove(seen)
            if not recorders:
                setattr(holder, attr, original)
                del _ACTIVE[key]


def _spy(original: Callable, argument: str, recorders: list[list[int]]) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def spy(*args: Any, **kwargs: Any) -> Any:
        value = signature.bind(*args, **kwargs).arguments.get(argument)
        counts = value.flatten().tolist() if hasattr(value, "flatten") else [value]
        for seen in list(recorders):
            seen.extend(int(c) for c in counts if c is not None and int(c) not in seen)
        return original(*args, **kwargs)

    return spy
