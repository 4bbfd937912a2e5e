"""``poisoned_scratch``: floating tensors an engine allocates uninitialised hold NaN inside the block only."""

from __future__ import annotations

import threading

import pytest
import torch

from pytest_mla.kernels.scratch import poisoned_scratch

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]


def _allocations(dtype):
    base = torch.zeros(3, 5, dtype=torch.float32)
    return {
        "torch.empty": torch.empty(3, 5, dtype=dtype),
        "torch.empty_like": torch.empty_like(base, dtype=dtype),
        "torch.empty_strided": torch.empty_strided((3, 5), (5, 1), dtype=dtype),
        "Tensor.new_empty": base.new_empty((3, 5), dtype=dtype),
    }


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_uninitialised_float_allocation_holds_the_formats_nan(dtype):
    with poisoned_scratch():
        made = _allocations(dtype)
    for how, tensor in made.items():
        assert tensor.dtype == dtype and tensor.shape == (3, 5), how
        assert torch.isnan(tensor.float()).all(), (how, tensor.float())


def test_integer_tensors_are_left_as_allocated_and_initialised_ones_untouched():
    with poisoned_scratch():
        index = torch.empty(4, dtype=torch.int32)
        index.fill_(7)
        zeros, full = torch.zeros(4), torch.full((4,), 2.0)
    assert index.tolist() == [7] * 4 and zeros.tolist() == [0.0] * 4 and full.tolist() == [2.0] * 4


def test_nested_and_threaded_blocks_restore_torch_only_when_the_last_one_ends():
    originals = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    entered, release = threading.Barrier(2), threading.Event()

    def rank():
        with poisoned_scratch():
            entered.wait()
            release.wait(10)

    other = threading.Thread(target=rank)
    other.start()
    with poisoned_scratch():
        with poisoned_scratch():
            entered.wait()
        assert torch.isnan(torch.empty(2)).all()
    assert torch.empty is not originals[0], "another rank still holds the block"
    release.set()
    other.join(10)
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == originals
    with poisoned_scratch():
        pass
    assert torch.empty is originals[0]


def test_an_exception_inside_the_block_restores_torch():
    with pytest.raises(RuntimeError, match="engine"):
        with poisoned_scratch():
            raise RuntimeError("engine")
    assert torch.empty.__module__ != "pytest_mla.kernels.scratch"
    assert not getattr(torch.empty, "__wrapped__", None)


def test_torch_compiled_flex_attention_inside_the_block_compiles_and_matches_eager():
    """SGLang's flex_attention backend runs ``torch.compile(flex_attention)``; Inductor's lowering allocates
    with ``torch.empty`` while it traces, and an in-place fill there failed the compile ("a leaf Variable
    that requires grad is being used in an in-place operation")."""
    from torch.nn.attention.flex_attention import flex_attention

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), poisoned_scratch():  # a cached graph would skip the trace
        out = torch.compile(flex_attention)(q, k, v)
    torch._dynamo.reset()
    assert torch.allclose(out, flex_attention(q, k, v), atol=1e-5)
