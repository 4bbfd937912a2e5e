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
