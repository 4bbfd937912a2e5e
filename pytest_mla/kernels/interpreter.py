"""Scoped fixes to Triton's interpreter, applied around interpreted *engine* checks only.

An engine's own Triton kernels are checked as they are, so where Triton
3.9's interpreter differs from a GPU build they cannot be rewritten; instead,
while one interpreted check runs, ``interpreter_fixes`` patches the
interpreter so that it computes what a GPU computes, and restores it after:

* ``bf16_dot_fix``: the interpreter stores bf16 as ``uint16`` bit patterns
  and converts only fp8 operands in ``tl.dot`` (``InterpreterBuilder.create_dot``),
  so a bf16 dot multiplies the integers behind the bits (errors ~1e9). The
  fix widens bf16 operands to fp32 before the matmul: what tensor cores do
  (bf16 products, fp32 accumulation). Casts and element-wise bf16 arithmetic
  outside ``tl.dot`` are left alone.
* ``no_overflow_sanitizer``: the interpreter checks every 32-bit integer
  add, sub and mul for overflow (``sanitize_overflow``), a debugging aid a
  GPU compile only turns on with ``debug``; on an engine's kernels it costs
  about two thirds of an interpreted check.
* ``int1_mask_fix``: an int1 value loaded from a ``torch.bool`` tensor and
  broadcast can come out of the interpreter's splat as int8, and its C
  ``load``/``store`` accept only bool masks (``ValueError('mask has
  unsupported dtype')``); on a GPU an int1 mask is true where nonzero. The
  fix hands masked loads and stores a bool view of such a mask. (vLLM's V2
  model runner hits it in ``_compute_slot_mappings_kernel`` under DCP.)
* ``jit_constexprs_fix``: ``@triton.jit`` under the interpreter makes an
  ``InterpretedFunction`` without ``JITFunction.constexprs``; launch code
  that reads it (vLLM's ``CorrectAttnCPOutKernel.__call__``, its DCP merge)
  fails before the kernel runs. The fix gives it the attribute, computed by
  Triton's own ``KernelParam`` as ``JITFunction`` computes it.

Each fix is re-entrant (reference counted) and does nothing unless
``where == "interpreter"`` and ``TRITON_INTERPRET`` is on: on a GPU nothing
is touched. ``tests/kernels/test_interpreter.py`` checks each one, and that
the interpreter still needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator

__all__ = ["bf16_dot_fix", "int1_mask_fix", "interpreter_fixes", "jit_constexprs_fix", "no_overflow_sanitizer"]

_lock = threading.Lock()


def _scoped(name: str, install: Callable[[], Callable[[], None]]) -> Callable[..., Any]:
    """A re-entrant context manager that runs ``install()`` on first entry and its returned undo on last exit."""
    state: dict[str, Any] = {"depth": 0, "undo": None}

    @contextlib.contextmanager
    def fix(where: str = "interpreter") -> Iterator[bool]:
        from ._mode import is_interpreter

        if where != "interpreter" or not is_interpreter():
            yield False
            return
        with _lock:
            if state["depth"] == 0:
                state["undo"] = install()
            state["depth"] += 1
        try:
            yield True
        finally:
            with _lock:
                state["depth"] -= 1
                if state["depth"] == 0:
                    state["undo"]()
                    state["undo"] = None

    fix.__name__ = fix.__qualname__ = name
    fix.__doc__ = f"``{name}(where)``: see the module docstring. Yields whether it is active."
    return fix


def _install_bf16_dot() -> Callable[[], None]:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _convert_float

    original = InterpreterBuilder.create_dot

    def widen(handle: Any) -> Any:
        if handle.dtype.scalar == tl.bfloat16:
            data = _convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return TensorHandle(data.reshape(handle.data.shape), tl.float32)
        return handle

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.__wrapped__ = original  # type: ignore[attr-defined]
    InterpreterBuilder.create_dot = create_dot

    def undo() -> None:
        InterpreterBuilder.create_dot = original

    return undo


def _install_no_overflow_sanitizer() -> Callable[[], None]:
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    saved = builder.options
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)

    def undo() -> None:
        builder.options = saved

    return undo


def _install_int1_mask() -> Callable[[], None]:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def as_bool(handle: Any) -> Any:
        if handle.data.dtype == np.bool_:
            return handle
        return TensorHandle(handle.data != 0, tl.int1)

    def masked_load(self: Any, ptrs: Any, mask: Any, other: Any, cache: Any, volatile: Any) -> Any:
        return load(self, ptrs, as_bool(mask), other, cache, volatile)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, cache: Any) -> Any:
        return store(self, ptrs, value, as_bool(mask), cache)

    InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = masked_load, masked_store

    def undo() -> None:
        InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = load, store

    return undo


def _interpreted_constexprs(self: Any) -> list[int]:
    import inspect

    from triton.runtime.jit import KernelParam

    params = inspect.signature(self.fn).parameters.values()
    return [i for i, p in enumerate(params) if KernelParam(i, p, False, False).is_constexpr]


def _install_jit_constexprs() -> Callable[[], None]:
    from triton.runtime.interpreter import InterpretedFunction

    if "constexprs" in vars(InterpretedFunction):  # Triton grew it: nothing to do
        return lambda: None
    InterpretedFunction.constexprs = property(_interpreted_constexprs)  # type: ignore[attr-defined]

    def undo() -> None:
        del InterpretedFunction.constexprs

    return undo


bf16_dot_fix = _scoped("bf16_dot_fix", _install_bf16_dot)
no_overflow_sanitizer = _scoped("no_overflow_sanitizer", _install_no_overflow_sanitizer)
int1_mask_fix = _scoped("int1_mask_fix", _install_int1_mask)
jit_constexprs_fix = _scoped("jit_constexprs_fix", _install_jit_constexprs)

FIXES = (bf16_dot_fix, no_overflow_sanitizer, int1_mask_fix, jit_constexprs_fix)


@contextlib.contextmanager
def interpreter_fixes(where: str = "interpreter") -> Iterator[list[str]]:
    """Every fix above for the block; yields the names of those active (empty on a GPU)."""
    with contextlib.ExitStack() as stack:
        yield [fix.__name__ for fix in FIXES if stack.enter_context(fix(where))]
