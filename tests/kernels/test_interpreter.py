"""``bf16_dot_fix``: bf16 ``tl.dot`` under the interpreter is right inside the fix, untouched outside it."""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels._mode import ensure_triton_mode, is_interpreter
from pytest_mla.kernels.interpreter import bf16_dot_fix

WHERE = ensure_triton_mode()  # before any @triton.jit below


def _dot_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        a = tl.load(a_ptr + offs[:, None] * N + offs[None, :])  # bf16, as an engine kernel loads it
        b = tl.load(b_ptr + offs[:, None] * N + offs[None, :])
        tl.store(c_ptr + offs[:, None] * N + offs[None, :], tl.dot(a, b))  # fp32 accumulator

    return dot


def _run(n=16):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(n, n, generator=g).to(torch.bfloat16)
    b = torch.randn(n, n, generator=g).to(torch.bfloat16)
    device = "cuda" if WHERE not in ("interpreter", "cpu") else "cpu"
    a, b = a.to(device), b.to(device)
    c = torch.full((n, n), float("nan"), device=device)
    _dot_kernel()[(1,)](a, b, c, N=n)
    ref = a.double().cpu() @ b.double().cpu()
    return float((c.cpu().double() - ref).abs().max())


@pytest.mark.skipif(WHERE != "interpreter", reason="the interpreter's bf16 dot; compiled kernels are checked below")
def test_fix_makes_interpreted_bf16_dot_right_and_is_scoped():
    from triton.runtime.interpreter import InterpreterBuilder

    original = InterpreterBuilder.create_dot
    assert _run() > 1.0, "triton's interpreter got bf16 dots right: the fix may no longer be needed"
    with bf16_dot_fix("interpreter") as active:
        assert active and InterpreterBuilder.create_dot is not original
        with bf16_dot_fix() as again:  # re-entrant
            assert again
        assert InterpreterBuilder.create_dot is not original
        assert _run() < 1e-4
    assert InterpreterBuilder.create_dot is original


def test_fix_does_nothing_for_a_gpu_target():
    with bf16_dot_fix("sm90") as active:
        assert not active
        if is_interpreter():
            from triton.runtime.interpreter import InterpreterBuilder

            assert not hasattr(InterpreterBuilder.create_dot, "__wrapped__")


@pytest.mark.skipif(WHERE in ("interpreter", "cpu"), reason="needs a GPU: compiled bf16 dot")
def test_compiled_bf16_dot_is_right_without_the_fix():
    with bf16_dot_fix(WHERE) as active:
        assert not active
        assert _run() < 1e-4


# ---- the other fixes of interpreter_fixes --------------------------------------------------------

interpreted = pytest.mark.skipif(WHERE != "interpreter", reason="fixes of Triton's interpreter")


@interpreted
def test_fast_bf16_widening_gives_tritons_bits_exactly():
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import fast_bf16_widening

    g = torch.Generator().manual_seed(5)
    bits = torch.randint(0, 2**16, (4089,), generator=g, dtype=torch.int32).to(torch.int16)
    special = torch.tensor([0x7F80, -128, 0x7FC0, 0x0001, -0x7FFF, 0, -0x8000], dtype=torch.int32).to(torch.int16)
    data = torch.cat([bits, special]).numpy().view(np.uint16).reshape(64, -1)
    want = interpreter._convert_float(data, tl.bfloat16, tl.float32, None)
    with fast_bf16_widening() as active:
        assert active
        got = interpreter._convert_float(data, tl.bfloat16, tl.float32, None)
        other = interpreter._convert_float(np.ones(4, dtype=np.uint32), tl.float32, tl.float16, "rtne")
    exact = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16).float().numpy().view(np.uint32)
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), exact)  # torch's exact widening
    subnormal = (data & 0x7F80) == 0
    assert np.array_equal(got.view(np.uint32)[~subnormal], want.view(np.uint32)[~subnormal])  # Triton's, elsewhere
    assert other.dtype == np.uint16  # other conversions are Triton's own
    assert interpreter._convert_float is not None and not hasattr(interpreter._convert_float, "__wrapped__")


if WHERE == "interpreter":
    import triton
    import triton.language as tl

    @triton.jit
    def _scale(x, f):
        return x * f + tl.zeros_like(x)  # a user helper calling a triton.language helper

    @triton.jit
    def _helper_kernel(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        for i in range(4):
            x = _scale(x, 2.0)
        tl.store(y_ptr + offs, x + tl.full([N], 1.0, tl.float32))

    @triton.jit
    def _masked_copy(flag_ptr, x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        flag = tl.load(flag_ptr)  # a bool scalar
        mask = ~flag | (offs < 4)  # broadcast: held as int8 by the interpreter's splat
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)


    @triton.jit
    def _descriptor_copy(x_ptr, y_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, TILE: tl.constexpr):
        # the first COLS of each row of x (rows of TILE): the descriptor pads the columns past COLS with zeros
        desc = tl.make_tensor_descriptor(base=x_ptr, shape=(ROWS, COLS), strides=(TILE, 1), block_shape=(ROWS, TILE))
        offs_r, offs_c = tl.arange(0, ROWS), tl.arange(0, TILE)
        tl.store(y_ptr + offs_r[:, None] * TILE + offs_c[None, :], desc.load([0, 0]))


@interpreted
def test_int1_mask_fix_passes_tensor_descriptor_loads_through():
    """Triton's interpreter loads a tensor descriptor's tile through ``create_masked_load`` with keyword
    arguments (vLLM's unified_attention does on XPU, ``USE_TD``): the fix keeps Triton's parameter names."""
    from pytest_mla.kernels.interpreter import int1_mask_fix

    x = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    y = torch.full((2, 8), -1.0)
    with int1_mask_fix():
        _descriptor_copy[(1,)](x, y, ROWS=2, COLS=4, TILE=8)
    assert torch.equal(y[:, :4], x[:, :4]) and bool((y[:, 4:] == 0).all())


@interpreted
def test_device_calls_reuse_the_launch_patch_with_the_same_result():
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import no_device_call_repatch

    kernel = _helper_kernel
    x = torch.randn(16)
    plain = torch.empty(16)
    kernel[(1,)](x, plain, N=16)
    original = interpreter._patch_lang
    calls = []
    with no_device_call_repatch() as active:
        assert active
        inner = interpreter._patch_lang
        interpreter._patch_lang = lambda fn: calls.append(fn) or inner(fn)
        fast = torch.empty(16)
        kernel[(1,)](x, fast, N=16)
        kernel[(1,)](x, fast, N=16)  # a second launch patches again and restores
        interpreter._patch_lang = inner
    assert interpreter._patch_lang is original
    assert torch.equal(plain, fast) and torch.allclose(fast, x * 16 + 1)
    assert len(calls) >= 2


@interpreted
def test_jit_constexprs_fix_matches_the_jit_function():
    from triton.runtime.interpreter import InterpretedFunction

    from pytest_mla.kernels.interpreter import jit_constexprs_fix

    kernel = _helper_kernel
    assert isinstance(kernel, InterpretedFunction) and not hasattr(kernel, "constexprs")
    with jit_constexprs_fix():
        assert kernel.constexprs == [2]  # N
    assert not hasattr(kernel, "constexprs")


@interpreted
def test_int1_mask_fix_lets_an_int8_held_mask_through():
    from pytest_mla.kernels.interpreter import int1_mask_fix

    masked_copy = _masked_copy
    x, flag = torch.arange(16, dtype=torch.float32), torch.tensor([True])
    y = torch.full((16,), -1.0)
    try:
        masked_copy[(1,)](flag, x, y, N=16)
        needed = False
    except Exception as exc:  # noqa: BLE001 - Triton wraps it in InterpreterError
        needed = "mask has unsupported dtype" in str(exc)
    with int1_mask_fix():
        y = torch.full((16,), -1.0)
        masked_copy[(1,)](flag, x, y, N=16)
    assert torch.equal(y[:4], x[:4]) and bool((y[4:] == -1).all())
    if not needed:
        pytest.skip("this Triton's interpreter handles int8-held masks itself: int1_mask_fix may be dropped")


def test_interpreter_fixes_do_nothing_on_a_gpu_target():
    from pytest_mla.kernels.interpreter import interpreter_fixes

    with interpreter_fixes("sm90") as active:
        assert active == []


@interpreted
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_fp8_specials_fix_widens_every_byte_as_torch_does_nan_and_inf_included(dtype):
    """Every one of the 256 bytes, widened to fp32 inside a kernel: torch's value (NaN where torch's is NaN)
    with the fix; without it the interpreter reads at least one special byte as a number (it still needs it)."""
    import triton
    import triton.language as tl

    from pytest_mla.kernels.interpreter import fp8_specials_fix

    @triton.jit
    def widen(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float32))

    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    want = x.float()
    plain, fixed = torch.full((256,), 7.0), torch.full((256,), 7.0)
    widen[(1,)](x, plain, N=256)
    with fp8_specials_fix("interpreter") as active:
        widen[(1,)](x, fixed, N=256)
    assert active
    assert torch.equal(fixed.isnan(), want.isnan())
    assert torch.equal(fixed[~want.isnan()], want[~want.isnan()])
    assert not torch.equal(plain.isnan(), want.isnan())
    widen[(1,)](x, fixed, N=256)  # restored after the block
    assert torch.equal(fixed.isnan(), plain.isnan())


@interpreted
def test_bf16_rounding_fix_narrows_fp32_to_bf16_as_torch_does_to_nearest_even():
    """fp32 → bf16 in a kernel (an explicit ``.to`` and a store into a bf16 tensor): bit for bit torch's
    ``.to(torch.bfloat16)`` (round to nearest, ties to even) with the fix, NaN where torch's is NaN; without
    it the interpreter truncates (it still needs the fix); an explicit ``rtz`` stays Triton's own."""
    import numpy as np
    import triton
    import triton.language as tl

    from pytest_mla.kernels.interpreter import bf16_rounding_fix

    @triton.jit
    def narrow(x_ptr, y_ptr, z_ptr, t_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        tl.store(y_ptr + offs, x.to(tl.bfloat16))
        tl.store(z_ptr + offs, x)  # the store narrows it
        tl.store(t_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtz"))

    g = torch.Generator().manual_seed(11)
    random_bits = torch.randint(-2**31, 2**31 - 1, (3000,), generator=g, dtype=torch.int64).to(torch.int32)
    edges = [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0xBF818000,  # ties to even (down, up), either side
             0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000,  # rounding to inf; inf
             0x7F800001, 0xFF800001, 0x7FC00000, 0x7FFFFFFF,  # NaNs (one whose payload is only in the low half)
             0x00000001, 0x00008000, 0x00018000, 0x807FFFFF, 0x00000000, 0x80000000]  # subnormals, zeros
    edge_bits = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in edges], dtype=torch.int64).to(torch.int32)
    values = torch.randn(1000, generator=g) * torch.logspace(-30, 30, 1000)
    x = torch.cat([random_bits.view(torch.float32), edge_bits.view(torch.float32), values])
    x = torch.cat([x, torch.zeros(4096 - x.numel())])
    want = x.to(torch.bfloat16)

    def run():
        out = [torch.full((x.numel(),), 7.0, dtype=torch.bfloat16) for _ in range(3)]
        narrow[(1,)](x, *out, N=x.numel())
        return out

    plain, _, plain_rtz = run()
    with bf16_rounding_fix("interpreter") as active:
        converted, stored, rtz = run()
        from triton.runtime import interpreter

        scalars = [interpreter._convert_float(np.array(v, dtype=np.float32), tl.float32, tl.bfloat16, None)
                   for v in (np.nan, 1.0 + 2**-7 + 2**-8)]  # 0-d values (a tie: to the even 0x3F82)
    assert active
    assert [s.shape for s in scalars] == [(), ()] and (scalars[0] & 0x7FFF) > 0x7F80 and scalars[1] == 0x3F82
    finite = ~want.isnan()
    for got in (converted, stored):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[finite].view(torch.int16), want[finite].view(torch.int16))
    assert torch.equal(rtz.view(torch.int16), plain_rtz.view(torch.int16))  # an explicit rtz is Triton's own
    assert not torch.equal(plain[finite].view(torch.int16), want[finite].view(torch.int16))
    normal = finite & (x.abs() >= torch.finfo(torch.float32).tiny)
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(plain[normal].view(torch.int16), truncated[normal])  # what Triton 3.9's interpreter does


SMALL_FLOATS = ["fp8e4nv", "fp8e5", "fp8e4b8", "fp8e5b16", "fp16", "bf16"]


@interpreted
@pytest.mark.parametrize("source", SMALL_FLOATS)
def test_fast_small_float_conversions_give_tritons_bits_for_every_code(source):
    """Every code of an 8- or 16-bit float, converted to every other float format and rounding mode the
    interpreter's conversion takes: bit for bit Triton's own conversion, in the input's shape (0-d included)."""
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import fast_small_float_conversions

    dtypes = {t.name: t for t in (tl.float8e4nv, tl.float8e5, tl.float8e4b8, tl.float8e5b16, tl.float16, tl.bfloat16,
                                  tl.float32)}
    src = dtypes[source]
    width = src.primitive_bitwidth
    g = np.random.default_rng(13)
    codes = g.permutation(1 << width).astype(f"uint{width}").reshape(-1, 16)
    if source == "fp16":
        codes = codes.view(np.float16)  # as the interpreter holds fp16
    checked = set()
    for out in dtypes.values():
        if out is src:
            continue
        for mode in (None, ir.ROUNDING_MODE.RTNE, ir.ROUNDING_MODE.RTZ):
            try:
                want = interpreter._convert_float(codes, src, out, mode)
            except Exception as exc:  # a pair Triton's conversion cannot do (fp8 to fp8 of more mantissa bits)
                with fast_small_float_conversions(), pytest.raises(type(exc)):
                    interpreter._convert_float(codes, src, out, mode)
                continue
            scalar = interpreter._convert_float(codes[3, 5:6].reshape(()), src, out, mode)
            with fast_small_float_conversions() as active:
                got = interpreter._convert_float(codes, src, out, mode)
                got_scalar = interpreter._convert_float(codes[3, 5:6].reshape(()), src, out, mode)
            assert active
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (out, mode)
            assert got_scalar.shape == () and got_scalar == scalar
            checked.add((out.name, mode))
    # the widenings every engine kernel does are among them (an fp8 cache read as fp16 / bf16 / fp32)
    widenings = {"fp32", "fp16", "bf16"} if source.startswith("fp8") else {"fp32"}
    assert {(out, None) for out in widenings} <= checked
    fp32 = np.ones(4, dtype=np.float32)  # a 32-bit input is Triton's own conversion
    with fast_small_float_conversions():
        assert np.array_equal(interpreter._convert_float(fp32, tl.float32, tl.bfloat16, None),
                              np.full(4, 0x3F80, dtype=np.uint16))


@interpreted
def test_fast_np_dtype_answers_as_triton_does_for_every_type():
    """Every scalar type, its pointer and a block of each: the same numpy type as Triton's own lookup."""
    import triton.language as tl
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import fast_np_dtype

    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e5b16, tl.float8e4nv, tl.float8e4b8,
               tl.float8e4b15]
    types = scalars + [tl.pointer_type(t) for t in scalars]
    types += [tl.block_type(t, [4, 8]) for t in types]
    want = [interpreter._get_np_dtype(t) for t in types]
    with fast_np_dtype() as active:
        assert active
        for _ in range(2):  # asked, then remembered
            assert [interpreter._get_np_dtype(t) for t in types] == want
    assert len(set(map(str, want))) > 10


FP8_TORCH = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2, "fp8e4b8": torch.float8_e4m3fnuz,
             "fp8e5b16": torch.float8_e5m2fnuz}


def _nearest_even_fp8(values, dtype):
    """The oracle: the nearest finite value of the fp8 format (its 256 codes decoded by torch's widening),
    a tie to the even code; NaN for NaN. Values beyond the largest finite are not asked."""
    decoded = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
    magnitude_codes = [c for c in range(128) if torch.isfinite(decoded[c])]
    grid = decoded[magnitude_codes]  # increasing with the code
    v = values.double()
    distance = (v.abs()[:, None] - grid[None, :]).abs()
    best = distance.min(dim=1, keepdim=True).values
    ties = distance == best
    codes = torch.tensor(magnitude_codes)
    even = ties & (codes[None, :] % 2 == 0)
    pick = torch.where(even.any(dim=1), even.float().argmax(dim=1), ties.float().argmax(dim=1))
    nearest = grid[pick] * torch.where(v < 0, -1.0, 1.0)
    return torch.where(v.isnan(), float("nan"), nearest)


@interpreted
@pytest.mark.parametrize("fp8", list(FP8_TORCH))
def test_fp8_rounding_fix_narrows_to_the_nearest_fp8_value_ties_to_even(fp8):
    """fp32 / bf16 / fp16 → fp8 with the default rounding: the nearest value of the format, ties to the even
    code, NaN for NaN (an oracle built from the decoded codes); without the fix the interpreter halves values
    whose rounding carries into the exponent (it still needs it). In a kernel too (``x.to(fp8)``, stored)."""
    import numpy as np
    import triton
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import fp8_rounding_fix

    dtype = FP8_TORCH[fp8]
    largest = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(17)
    decoded = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    finite = decoded[torch.isfinite(decoded)]
    midpoints = (finite.sort().values[1:] + finite.sort().values[:-1]) / 2  # every tie
    values = torch.cat([torch.randn(3000, generator=g) * largest / 8, torch.randn(1000, generator=g) * 1e-3,
                        finite, midpoints, torch.tensor([largest, -largest, 0.0, -0.0, float("nan")])])
    values = values[(values.abs() <= largest) | values.isnan()]
    tt = next(t for t in (tl.float8e4nv, tl.float8e5, tl.float8e4b8, tl.float8e5b16) if t.name == fp8)
    want = _nearest_even_fp8(values, dtype)

    def narrowed(source):
        if source == "fp32":
            data, tt_in, exact = values.numpy(), tl.float32, values
        elif source == "bf16":
            held = values.to(torch.bfloat16)
            data, tt_in, exact = held.view(torch.int16).numpy().view(np.uint16), tl.bfloat16, held.float()
        else:
            held = values.to(torch.float16)
            data, tt_in, exact = held.numpy(), tl.float16, held.float()
        codes = interpreter._convert_float(data, tt_in, tt, ir.ROUNDING_MODE.RTNE)
        got = torch.from_numpy(np.asarray(codes, dtype=np.uint8).copy()).view(dtype).double()
        return got, _nearest_even_fp8(exact, dtype)

    plain, _ = narrowed("fp32")
    with fp8_rounding_fix() as active:
        results = {source: narrowed(source) for source in ("fp32", "bf16", "fp16")}
    assert active
    for source, (got, expected) in results.items():
        assert torch.equal(got.isnan(), expected.isnan()), source
        ok = ~expected.isnan()
        assert torch.equal(got[ok], expected[ok]), (source, values[ok][got[ok] != expected[ok]][:5])
    ok = ~want.isnan()
    assert not torch.equal(plain[ok], want[ok])  # Triton 3.9's interpreter still gets some wrong

    @triton.jit
    def narrow(x_ptr, y_ptr, N: tl.constexpr, FP8: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(FP8))

    n = 8192
    x = torch.cat([values, torch.zeros(n - values.numel())])[:n]
    y = torch.zeros(n, dtype=dtype)
    with fp8_rounding_fix():
        narrow[(1,)](x, y, N=n, FP8=tt)
    expected = _nearest_even_fp8(x, dtype)
    assert torch.equal(y.double().isnan(), expected.isnan())
    assert torch.equal(y.double()[~expected.isnan()], expected[~expected.isnan()])


@interpreted
def test_interpreter_fixes_compose_each_narrowing_and_widening_as_alone():
    """All fixes at once (their install order): every bf16 code narrowed to each fp8 format is what
    fp8_rounding_fix alone gives (the conversion tables are built from it), every fp8 byte widened to fp32 what
    fp8_specials_fix alone gives (NaN included), and fp32 → bf16 what bf16_rounding_fix alone gives."""
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from pytest_mla.kernels.interpreter import bf16_rounding_fix, fp8_rounding_fix, fp8_specials_fix, interpreter_fixes

    bf16_codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bytes_ = np.arange(256, dtype=np.uint32).astype(np.uint8)
    fp32 = np.random.default_rng(19).standard_normal(4096).astype(np.float32)
    formats = (tl.float8e4nv, tl.float8e5, tl.float8e4b8, tl.float8e5b16)

    def conversions():
        return ([interpreter._convert_float(bf16_codes, tl.bfloat16, f, ir.ROUNDING_MODE.RTNE) for f in formats]
                + [interpreter._convert_float(bytes_, f, tl.float32, None) for f in formats]
                + [interpreter._convert_float(fp32, tl.float32, tl.bfloat16, None)])

    with fp8_rounding_fix():
        alone = conversions()[:4]
    with fp8_specials_fix():
        alone += conversions()[4:8]
    with bf16_rounding_fix():
        alone += conversions()[8:]
    with interpreter_fixes() as active:
        together = conversions()
    assert "fast_small_float_conversions" in active
    for one, all_ in zip(alone, together):
        assert one.dtype == all_.dtype and np.array_equal(np.asarray(one), np.asarray(all_))
