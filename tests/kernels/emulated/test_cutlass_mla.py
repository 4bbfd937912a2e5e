"""vLLM's SM100 CUTLASS MLA op, emulated, against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import cutlass_mla
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import LSE_TOL, TOL, assert_close, make_case, natural_with, poisoned, reference


def run(case, *, heads=16, lse=True, dtype=None):
    b = case.q.shape[0]
    q = case.q[:, 0]  # one query token per request
    out = poisoned((b, cutlass_mla.MAX_HEADS, 512), dtype or case.q.dtype)
    lse_buf = poisoned((b, cutlass_mla.MAX_HEADS), torch.float32) if lse else torch.empty(0)
    ret = cutlass_mla.sm100_cutlass_mla_decode(out, lse_buf, q[..., :512], q[..., 512:], case.kv_cache.squeeze(2),
                                               case.cache_seqlens, case.block_table, torch.empty(0, dtype=torch.uint8),
                                               case.softmax_scale, -1)
    assert ret is out
    return out, lse_buf


@pytest.mark.parametrize("page_size", [64, 128])
def test_decode_fills_the_first_heads_of_the_128_head_tile(page_size):
    case = make_case([0, 1, 70, 129], page_size=page_size, seed=70)
    out, lse = run(case)
    ref_out, ref_lse = reference(case)
    assert_close("out", out[:, :16], ref_out[:, 0], TOL)
    assert_close("lse", lse[:, :16], natural_with(ref_lse[:, :, 0], math.inf), LSE_TOL)  # natural log, +inf if empty
    assert torch.isnan(out[:, 16:]).all() and torch.isnan(lse[:, 16:]).all()  # the padding is the caller's to drop


def test_fp8_is_read_raw_and_written_as_bf16():
    case = make_case([5, 70], page_size=64, kv_dtype="fp8_e4m3", kv_scale=1.0, seed=71)
    fp8 = type(case)(**{**case.__dict__, "q": case.q.to(torch.float8_e4m3fn)})
    out, _ = run(fp8, dtype=torch.bfloat16)
    assert_close("out", out[:, :16], reference(case)[0][:, 0], TOL)


def test_contract_violations_raise():
    case = make_case([70], page_size=64, seed=72)
    q = case.q[:, 0]
    with pytest.raises(OutOfContractError, match=r"^out: .* \(heads padded to the tile\)"):
        cutlass_mla.sm100_cutlass_mla_decode(torch.empty(1, 16, 512, dtype=torch.bfloat16), torch.empty(0),
                                             q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), case.cache_seqlens,
                                             case.block_table, None, 0.04, -1)
    table = case.block_table.clone()
    table[0, 1] = 77
    with pytest.raises(OutOfRangeRead, match="^page_table: index 77"):
        cutlass_mla.sm100_cutlass_mla_decode(torch.empty(1, 128, 512, dtype=torch.bfloat16), torch.empty(0),
                                             q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), case.cache_seqlens,
                                             table, None, 0.04, -1)


def test_workspace_size_follows_the_split_heuristic():
    assert cutlass_mla.sm100_cutlass_mla_get_workspace_size(128, 1, 148, -1) == 0  # one split: no accumulators
    assert cutlass_mla.sm100_cutlass_mla_get_workspace_size(8192, 4, 148, -1) == 0  # B > 1: vLLM forces one split
    assert cutlass_mla.sm100_cutlass_mla_get_workspace_size(8192, 1, 148, -1) == 16 * 128 * 513 * 4
    assert cutlass_mla.sm100_cutlass_mla_get_workspace_size(128, 2, 148, 4) == 4 * 2 * 128 * 513 * 4
