"""Uninitialised memory an engine allocates reads as NaN while its check runs.

An engine's backend allocates its scratch buffers (split-KV partial outputs,
LSEs, workspaces, output tensors) with ``torch.empty`` and relies on its
kernels to write every element it later reads. Where a path reads an element
no kernel wrote (a skipped split's partial output combined with weight 0,
padding heads, a tail past a sequence's end), the result depends on whatever
the allocator handed back: zeros on one machine, stale values or NaN on
another, so the same cell passes here and fails there, and a count of bad
positions differs between two runs. ``poisoned_scratch`` makes that memory
deterministic and loud: every floating tensor made by ``torch.empty``,
``torch.empty_like``, ``torch.empty_strided`` or ``Tensor.new_empty`` while
the block runs is filled with NaN (each float format's own NaN, fp8 included),
as FlashMLA's and flash-attention's own tests poison their outputs. A read of
uninitialised memory then shows as NaN in the output, the same on every host.

Integer tensors are left as allocated: a poisoned index would turn into an
out-of-range read whose meaning is the allocator's, not the engine's. Only
Python-level calls are seen (a C++ op's internal allocations are not), and
memory made before the block (a pool the check filled) is untouched; inside
a function ``torch.compile`` traces the allocations are left alone (an
in-place fill there breaks Dynamo's graph; Inductor plans those buffers). The
patch is process-wide while any block holds it (DCP ranks run as threads)
and reference counted.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch

__all__ = ["poisoned_scratch"]

_lock = threading.Lock()
_depth = 0
_saved: dict[tuple[Any, str], Callable[..., Any]] = {}


def _poisoning(make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(make)
    def make_poisoned(*args: Any, **kwargs: Any) -> Any:
        made = make(*args, **kwargs)
        if torch.compiler.is_compiling():  # traced by torch.compile: the graph's buffers are Inductor's
            return made
        if isinstance(made, torch.Tensor) and made.is_floating_point() and made.numel():
            made.fill_(float("nan"))
        return made

    return make_poisoned


def _targets() -> list[tuple[Any, str]]:
    return [(torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch.Tensor, "new_empty")]


@contextlib.contextmanager
def poisoned_scratch() -> Iterator[None]:
    """Floating tensors allocated uninitialised during the block hold NaN (see the module docstring)."""
    global _depth
    with _lock:
        if _depth == 0:
            for owner, name in _targets():
                original = getattr(owner, name)
                _saved[(owner, name)] = original
                setattr(owner, name, _poisoning(original))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for (owner, name), original in _saved.items():
                    setattr(owner, name, original)
                _saved.clear()
