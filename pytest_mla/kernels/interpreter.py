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

* ``fp8_specials_fix``: the interpreter widens fp8 with a generic bit-field
  conversion that knows no special values: an e4m3fn NaN (``0x7F``) reads as
  480, an e5m2 inf or NaN as a finite number, an e4m3fnuz / e5m2fnuz NaN
  (``0x80``) as -0. A GPU's conversion gives NaN (and inf). The fix keeps
  Triton's result for every other byte and writes the output format's NaN or
  inf where the fp8 byte holds one, so the NaN a check keeps in a cache's
  unused slots reaches a kernel that reads them, as on a GPU.
* ``no_device_call_repatch`` (speed only): every call of a ``@triton.jit``
  device function (``InterpretedFunction.__call__``) re-patches
  ``triton.language`` with ``_patch_lang``, though the kernel launch that
  runs it (``GridExecutor``) patched the same module objects already and
  restores them at its end; on an engine's kernels, with helpers called per
  tile, that is about a third of an interpreted check. The fix lets a
  device call inside a launch reuse the launch's patch. Results are
  unchanged (the patches are the same objects); a launch still patches and
  restores as before.
* ``fast_bf16_widening`` (speed only): the interpreter widens bf16 to fp32
  (loads cast with ``.to(tl.float32)``, the bf16 dot fix) with a generic
  bit-field conversion; bf16 is the top half of an fp32, so a 16-bit shift
  widens exactly, as a GPU's conversion does: the same bits as Triton's for
  every normal value, NaN and inf, and the exact value for bf16 subnormals
  (which Triton 3.9's generic conversion flushes to zero). Every other
  conversion is Triton's own.
* ``bf16_rounding_fix``: ``x.to(tl.bfloat16)`` from fp32 (and every store of
  an fp32 value into a bf16 tensor) is an ``fptrunc``, which a GPU rounds to
  nearest even (``cvt.rn.bf16.f32``); Triton's interpreter truncates the 16
  low bits instead (``_convert_float`` with no rounding mode), a one-sided
  error of up to one bf16 ulp on every narrowed value. The fix rounds to
  nearest even, ties to even, NaN kept a quiet NaN, overflow to inf, as
  torch's ``.to(torch.bfloat16)`` does; an explicit ``rtz`` still truncates.
  It is also the interpreter's most expensive conversion (a fifth of a
  sparse MLA check), and the fix is a few numpy operations.
* ``fp8_rounding_fix``: a narrowing to fp8 rounding to nearest even (the
  default of ``x.to(fp8)``: SGLang's Triton kernels quantize q and the
  softmax weights this way for their fp8 dots) carries a mantissa that
  rounds up into the exponent with an OR instead of an add in Triton's
  interpreter: 2.4–4.6 % of normal values come out at half their value
  (7.96 → 4.0 in e4m3fn, where a GPU gives 8.0). The fix takes torch's
  round-to-nearest-even narrowing for every value within the format's
  finite range (from fp32, and from bf16 / fp16 widened exactly first), and
  the format's NaN for a NaN (Triton's gives a number: 384 in e4m3fn); inf
  and values beyond the largest finite keep Triton's conversion (a GPU
  saturates or gives NaN there, by format and vendor).
* ``fast_small_float_conversions`` (speed only): a conversion from an 8- or
  16-bit float (fp8, fp16, bf16) to another float format is a function of
  the 256 or 65,536 codes of its input, so it is a table lookup: each table
  is built once per process by calling the conversion it replaces on every
  code, which makes every result bit-identical to that conversion's by
  construction (``tests/kernels/test_interpreter.py`` checks it on every
  code). An fp8 cache's widening was a quarter of a ROCm FP8 check.
* ``fast_np_dtype`` (speed only): the interpreter maps a Triton type to the
  numpy type holding it (``_get_np_dtype``) by building a 17-entry dict on
  each of the ~100,000 calls of a check; the fix asks it once per scalar
  type (a block type's answer is its element type's) and remembers it.

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

__all__ = ["bf16_dot_fix", "bf16_rounding_fix", "fast_bf16_widening", "fast_np_dtype", "fast_small_float_conversions",
           "fp8_rounding_fix", "fp8_specials_fix", "int1_mask_fix", "interpreter_fixes", "jit_constexprs_fix", "no_device_call_repatch",
           "no_overflow_sanitizer"]

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


def _bf16_bits_to_fp32(bits: Any) -> Any:
    """fp32 values of bf16 bit patterns (uint16): bf16 is an fp32's top half, so the widening is exact."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _install_bf16_dot() -> Callable[[], None]:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.create_dot

    def widen(handle: Any) -> Any:
        if handle.dtype.scalar == tl.bfloat16:
            data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return TensorHandle(data.reshape(handle.data.shape), tl.float32)
        return handle

    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.__wrapped__ = original  # type: ignore[attr-defined]
    InterpreterBuilder.create_dot = create_dot
    return lambda: setattr(InterpreterBuilder, "create_dot", original)


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

    # Triton's own parameter names: its tensor-descriptor loads (``create_descriptor_load``) pass them by keyword.
    def masked_load(self: Any, ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
        return load(self, ptrs, as_bool(mask), other, cache_policy, is_volatile)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
        return store(self, ptrs, value, as_bool(mask), cache_policy)

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


def _install_no_device_call_repatch() -> Callable[[], None]:
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang
    state: dict[str, Any] = {"launch": False, "patched": set()}  # lang modules patched in this launch

    class _NoPatch:
        def restore(self) -> None:
            pass

    def langs_of(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn: Any) -> Any:
        langs = langs_of(fn)
        if state["launch"] and langs <= state["patched"]:
            return _NoPatch()  # a device call whose language modules this launch has patched already
        scope = original(fn)
        if state["launch"]:  # a device call: its patch stays until the launch restores (as in Triton)
            state["patched"] |= langs
            return scope
        state["launch"], state["patched"] = True, set(langs)
        restore = scope.restore

        def restore_and_end() -> None:
            state["launch"], state["patched"] = False, set()
            restore()

        scope.restore = restore_and_end
        return scope

    interpreter._patch_lang = patch_lang
    return lambda: setattr(interpreter, "_patch_lang", original)


def _install_fast_bf16_widening() -> Callable[[], None]:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            return _bf16_bits_to_fp32(input).view(np.uint32)  # uint32 bits, as Triton's (callers view as float32)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert_float
    return lambda: setattr(interpreter, "_convert_float", original)


def _install_bf16_rounding() -> Callable[[], None]:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode is None:
            return _fp32_bits_to_bf16_rtne(np.asarray(input, dtype=np.float32).view(np.uint32))
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert_float
    return lambda: setattr(interpreter, "_convert_float", original)


def _fp32_bits_to_bf16_rtne(bits: Any) -> Any:
    """bf16 bit patterns (uint16) of fp32 bit patterns (uint32), rounded to nearest, ties to even."""
    import numpy as np

    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    rounded = np.asarray(rounded).astype(np.uint16)  # (an array also for a 0-d input, whose arithmetic gives scalars)
    nan = np.asarray((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000))
    if nan.any():  # rounding could carry a NaN's payload into inf: keep the sign and high payload, quiet bit set
        rounded[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


#: fp8 formats by Triton name: torch's dtype.
_FP8_TORCH = {"fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2", "fp8e4b8": "float8_e4m3fnuz",
              "fp8e5b16": "float8_e5m2fnuz"}


def _install_fp8_rounding() -> Callable[[], None]:
    import numpy as np
    import torch
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        target = _FP8_TORCH.get(getattr(output_dtype, "name", ""))
        if target is None or rounding_mode != ir.ROUNDING_MODE.RTNE or \
                input_dtype not in (tl.float32, tl.bfloat16, tl.float16):
            return original(input, input_dtype, output_dtype, rounding_mode)
        if input_dtype == tl.bfloat16:  # held as its bits
            values = _bf16_bits_to_fp32(input)
        else:
            values = np.asarray(input).astype(np.float32)
        fp8 = getattr(torch, target)
        rounded = torch.from_numpy(values).to(fp8).view(torch.uint8).numpy()
        in_range = (np.abs(values) <= np.float32(torch.finfo(fp8).max)) | np.isnan(values)  # NaN: the format's NaN
        if in_range.all():
            return rounded
        out = np.asarray(original(input, input_dtype, output_dtype, rounding_mode)).copy()
        out[in_range] = rounded[in_range]
        return out

    interpreter._convert_float = convert_float
    return lambda: setattr(interpreter, "_convert_float", original)


def _install_fast_small_float_conversions() -> Callable[[], None]:
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._convert_float
    tables: dict[tuple[str, str, Any], Any] = {}  # built from what this install wraps, dropped with it

    def table(input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        key = (input_dtype.name, output_dtype.name, rounding_mode)
        found = tables.get(key)
        if found is None:
            width = input_dtype.primitive_bitwidth
            codes = np.arange(1 << width, dtype=np.uint32).astype(f"uint{width}")
            found = tables[key] = np.asarray(original(codes, input_dtype, output_dtype, rounding_mode))
        return found

    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        data = np.asarray(input)
        width = input_dtype.primitive_bitwidth
        if width <= 16 and data.dtype.itemsize * 8 == width:  # (the interpreter holds fp16 as float16, others as uint)
            codes = data.view(f"uint{width}")
            return table(input_dtype, output_dtype, rounding_mode)[codes.reshape(-1)].reshape(data.shape)
        return original(input, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert_float
    return lambda: setattr(interpreter, "_convert_float", original)


def _install_fast_np_dtype() -> Callable[[], None]:
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._get_np_dtype
    known: dict[Any, Any] = {}

    def get_np_dtype(tt_dtype: Any) -> Any:
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        try:
            return known[scalar]
        except KeyError:
            found = known[scalar] = original(scalar)
            return found
        except TypeError:  # a pointer type (it defines __eq__, not __hash__): Triton's own answer
            return original(tt_dtype)

    interpreter._get_np_dtype = get_np_dtype
    return lambda: setattr(interpreter, "_get_np_dtype", original)


#: The fp8 formats' special values, by the bytes that hold them: (NaN test, inf test or None).
_FP8_SPECIALS = {
    "fp8e4nv": (lambda b: (b & 0x7F) == 0x7F, None),  # e4m3fn: S.1111.111 is NaN, no inf
    "fp8e5": (lambda b: ((b & 0x7C) == 0x7C) & ((b & 0x03) != 0), lambda b: (b & 0x7F) == 0x7C),  # e5m2: IEEE-like
    "fp8e4b8": (lambda b: b == 0x80, None),  # e4m3fnuz: the negative zero pattern is the NaN, no inf
    "fp8e5b16": (lambda b: b == 0x80, None),  # e5m2fnuz: likewise
}


def _install_fp8_specials() -> Callable[[], None]:
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter._convert_float

    def convert_float(input: Any, input_dtype: Any, output_dtype: Any, rounding_mode: Any) -> Any:
        out = original(input, input_dtype, output_dtype, rounding_mode)
        rule = _FP8_SPECIALS.get(getattr(input_dtype, "name", ""))
        if rule is None or output_dtype.primitive_bitwidth <= input_dtype.primitive_bitwidth:
            return out
        byte = np.frombuffer(input.tobytes(), dtype=np.uint8).reshape(np.shape(input))
        nan = rule[0](byte)
        inf = rule[1](byte) if rule[1] is not None else None
        if not nan.any() and (inf is None or not inf.any()):
            return out
        width, mantissa = output_dtype.primitive_bitwidth, output_dtype.fp_mantissa_width
        uint = getattr(np, f"uint{width}")
        all_ones = ((1 << (width - mantissa - 1)) - 1) << mantissa
        out = np.array(out, copy=True).reshape(byte.shape)
        out[nan] = uint(all_ones | (1 << (mantissa - 1)))  # a quiet NaN of the output format
        if inf is not None:
            sign = (byte >> 7).astype(uint) << uint(width - 1)
            out[inf] = uint(all_ones) | sign[inf]
        return out

    interpreter._convert_float = convert_float
    return lambda: setattr(interpreter, "_convert_float", original)


bf16_dot_fix = _scoped("bf16_dot_fix", _install_bf16_dot)
fp8_specials_fix = _scoped("fp8_specials_fix", _install_fp8_specials)
fast_bf16_widening = _scoped("fast_bf16_widening", _install_fast_bf16_widening)
bf16_rounding_fix = _scoped("bf16_rounding_fix", _install_bf16_rounding)
fast_small_float_conversions = _scoped("fast_small_float_conversions", _install_fast_small_float_conversions)
fast_np_dtype = _scoped("fast_np_dtype", _install_fast_np_dtype)
fp8_rounding_fix = _scoped("fp8_rounding_fix", _install_fp8_rounding)
no_device_call_repatch = _scoped("no_device_call_repatch", _install_no_device_call_repatch)
no_overflow_sanitizer = _scoped("no_overflow_sanitizer", _install_no_overflow_sanitizer)
int1_mask_fix = _scoped("int1_mask_fix", _install_int1_mask)
jit_constexprs_fix = _scoped("jit_constexprs_fix", _install_jit_constexprs)

# In this order (each wraps what those before it installed): the tables of fast_small_float_conversions are
# built from Triton's conversion with fp8_rounding_fix, and fp8_specials_fix, outermost, marks the special
# bytes after any of them.
FIXES = (bf16_dot_fix, no_overflow_sanitizer, int1_mask_fix, jit_constexprs_fix, no_device_call_repatch,
         fp8_rounding_fix, fast_small_float_conversions, fast_bf16_widening, bf16_rounding_fix, fp8_specials_fix,
         fast_np_dtype)


@contextlib.contextmanager
def interpreter_fixes(where: str = "interpreter") -> Iterator[list[str]]:
    """Every fix above for the block; yields the names of those active (empty on a GPU)."""
    with contextlib.ExitStack() as stack:
        yield [fix.__name__ for fix in FIXES if stack.enter_context(fix(where))]
