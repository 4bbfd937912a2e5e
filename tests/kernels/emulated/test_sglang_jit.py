"""SGLang's JIT kernels (fixup_zero_kv_rows, fused_fp8_qkv_kv_cache), emulated from their CUDA sources' contracts."""

import math

import pytest
import torch

from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.emulated.sglang_jit import jit_fixup_module, jit_fused_fp8_qkv_kv_cache_module


def test_rows_of_sequences_without_kv_become_zero_and_minus_inf_and_nothing_else_moves():
    out = torch.randn(7, 2, 4).to(torch.bfloat16)
    lse = torch.randn(7, 2)
    before_out, before_lse = out.clone(), lse.clone()
    kv_lens = torch.tensor([3, 0, 5, 0], dtype=torch.int32)
    cum = torch.tensor([0, 2, 4, 6, 7], dtype=torch.int32)  # tokens: seq1 -> rows 2,3; seq3 -> row 6
    jit_fixup_module(torch.bfloat16).fixup_zero_kv_rows(out, lse, kv_lens, cum, 2)
    for row in range(7):
        empty = row in (2, 3, 6)
        assert torch.equal(out[row], torch.zeros_like(out[row]) if empty else before_out[row])
        assert torch.equal(lse[row], torch.full_like(lse[row], -math.inf) if empty else before_lse[row])


def test_only_max_seq_len_tokens_per_sequence_are_fixed_as_the_grid_covers():
    out, lse = torch.ones(3, 1, 2, dtype=torch.float16), torch.zeros(3, 1)
    jit_fixup_module(torch.float16).fixup_zero_kv_rows(out, lse, torch.tensor([0], dtype=torch.int32),
                                                       torch.tensor([0, 3], dtype=torch.int32), 2)
    assert out[:2].eq(0).all() and out[2].eq(1).all() and lse[2].eq(0).all()


def test_dtypes_outside_the_launchers_checks_raise():
    with pytest.raises(OutOfContractError, match="fixup_zero_kv.dtype"):
        jit_fixup_module(torch.float32)
    with pytest.raises(OutOfContractError, match="kv_lens"):
        jit_fixup_module(torch.bfloat16).fixup_zero_kv_rows(
            torch.zeros(1, 1, 1, dtype=torch.bfloat16), torch.zeros(1, 1), torch.tensor([0]),
            torch.tensor([0, 1], dtype=torch.int32), 1)


# ---- fused_fp8_qkv_kv_cache (trtllm_mha's FP8 KV write) ----------------------------------------------------

def _fp8_cache(slots, dim):
    return torch.full((slots, dim), math.nan).to(torch.float8_e4m3fn)


def test_fused_write_stores_k_over_k_scale_and_v_over_v_scale_at_each_slot_and_nothing_else():
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(3, 16, generator=g) * 4).to(torch.bfloat16)
    v = (torch.randn(3, 16, generator=g) * 4).to(torch.bfloat16)
    q = torch.randn(3, 32, generator=g).to(torch.bfloat16)
    k_cache, v_cache = _fp8_cache(6, 16), _fp8_cache(6, 16)
    q_out = torch.full((3, 32), math.nan).to(torch.float8_e4m3fn)
    loc = torch.tensor([4, 0, 2], dtype=torch.int64)
    k_scale, v_scale = torch.tensor([2.0]), torch.tensor([0.5])
    jit_fused_fp8_qkv_kv_cache_module(torch.bfloat16, True).fused_fp8_qkv_kv_cache(
        q, k, v, q_out, k_cache, v_cache, loc, k_scale, v_scale)
    for t, slot in enumerate(loc.tolist()):  # what the kernel's quant_row stores: e4m3(x * (1 / scale))
        assert torch.equal(k_cache[slot].float(), (k[t].float() / 2.0).to(torch.float8_e4m3fn).float())
        assert torch.equal(v_cache[slot].float(), (v[t].float() * 2.0).clamp(-448, 448).to(torch.float8_e4m3fn).float())
    for slot in (1, 3, 5):
        assert k_cache[slot].float().isnan().all() and v_cache[slot].float().isnan().all()
    assert torch.equal(q_out.float(), q.float().to(torch.float8_e4m3fn).float())


def test_fused_write_saturates_like_cudas_satfinite_conversion():
    k = torch.tensor([[1000.0, -1000.0]], dtype=torch.float16)
    k_cache, v_cache = _fp8_cache(1, 2), _fp8_cache(1, 2)
    one = torch.tensor([1.0])
    jit_fused_fp8_qkv_kv_cache_module(torch.float16, False).fused_fp8_qkv_kv_cache(
        None, k, k, None, k_cache, v_cache, torch.tensor([0], dtype=torch.int32), one, one)
    assert k_cache.float().tolist() == [[448.0, -448.0]]


def test_fused_write_past_the_cache_raises_and_launcher_checks_hold():
    module = jit_fused_fp8_qkv_kv_cache_module(torch.bfloat16, True)
    k = torch.zeros(1, 4, dtype=torch.bfloat16)
    one = torch.tensor([1.0])
    with pytest.raises(OutOfRangeRead, match="would write"):
        module.fused_fp8_qkv_kv_cache(None, k, k, None, _fp8_cache(2, 4), _fp8_cache(2, 4),
                                      torch.tensor([2]), one, one)
    with pytest.raises(OutOfContractError, match="q and q_out"):
        module.fused_fp8_qkv_kv_cache(k, k, k, None, _fp8_cache(2, 4), _fp8_cache(2, 4), torch.tensor([0]), one, one)
    with pytest.raises(OutOfContractError, match="k_cache"):
        module.fused_fp8_qkv_kv_cache(None, k, k, None, torch.zeros(2, 4, dtype=torch.bfloat16), _fp8_cache(2, 4),
                                      torch.tensor([0]), one, one)
    with pytest.raises(OutOfContractError, match="fused_fp8_qkv_kv_cache.dtype"):
        jit_fused_fp8_qkv_kv_cache_module(torch.float32, True)
