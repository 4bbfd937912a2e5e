"""A scoped fix for bf16 ``tl.dot`` under Triton's interpreter (engine kernel checks only).

Triton 3.9's interpreter stores bf16 values as ``uint16`` bit patterns and
converts only fp8 operands in ``tl.dot`` (``InterpreterBuilder.create_dot``),
so a bf16 dot multiplies the integers behind the bits (errors ~1e9). An
engine's own kernels are checked as they are, so they cannot be rewritten
to upcast after each load like ours; instead, around one interpreted check,
``bf16_dot_fix`` widens bf16 operands of the interpreter's dot to fp32
before the matmul: what a GPU's tensor cores do (bf16 products accumulate in
fp32). Casts and element-wise bf16 arithmetic outside ``tl.dot`` are left
alone. On a GPU, or with the interpreter off, it does nothing at all.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

__all__ = ["bf16_dot_fix", "no_overflow_sanitizer"]

_lock = threading.Lock()
_depth = 0
_saved: Any = None


def _widening_dot(original: Any) -> Any:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle, _convert_float

    def widen(handle: Any) -> Any:
        if handle.dtype.scalar == tl.bfloat16:
            data = _convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return TensorHandle(data.reshape(handle.data.shape), tl.float32)
        return handle

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.__wrapped__ = original  # type: ignore[attr-defined]
    return create_dot


@contextlib.contextmanager
def bf16_dot_fix(where: str = "interpreter") -> Iterator[bool]:
    """Widen bf16 ``tl.dot`` operands to fp32 in the interpreter while the block runs.

    Yields whether the fix is active: only when ``where == "interpreter"`` and
    ``TRITON_INTERPRET`` is on. Re-entrant; restored on exit.
    """
    from ._mode import is_interpreter

    if where != "interpreter" or not is_interpreter():
        yield False
        return
    from triton.runtime.interpreter import InterpreterBuilder

    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = InterpreterBuilder.create_dot
            InterpreterBuilder.create_dot = _widening_dot(_saved)
        _depth += 1
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                InterpreterBuilder.create_dot = _saved
                _saved = None


_sanitizer_depth = 0
_sanitizer_saved: Any = None


@contextlib.contextmanager
def no_overflow_sanitizer(where: str = "interpreter") -> Iterator[bool]:
    """Run Triton's interpreter without its integer-overflow sanitizer while the block runs.

    The interpreter checks every 32-bit integer add, sub and mul for overflow
    (``InterpreterOptions.sanitize_overflow``), a debugging aid a GPU compile
    only turns on with ``debug``: on an engine's Triton kernels it costs about
    two thirds of an interpreted check. Without it the interpreter computes as
    a GPU build does. Yields whether it is off; does nothing unless
    ``where == "interpreter"`` and ``TRITON_INTERPRET`` is on. Re-entrant.
    """
    from ._mode import is_interpreter

    if where != "interpreter" or not is_interpreter():
        yield False
        return
    import dataclasses

    from triton.runtime import interpreter

    global _sanitizer_depth, _sanitizer_saved
    builder = interpreter.interpreter_builder
    with _lock:
        if _sanitizer_depth == 0:
            _sanitizer_saved = builder.options
            builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
        _sanitizer_depth += 1
    try:
        yield True
    finally:
        with _lock:
            _sanitizer_depth -= 1
            if _sanitizer_depth == 0:
                builder.options = _sanitizer_saved
                _sanitizer_saved = None
