"""sgl-kernel-xpu's MLA ops (``flash_mla_decode``, ``flash_mla_prefill``), emulated, against the float64 reference.

Fresh seeded inputs from ``kernels/inputs.py`` (NaN past every length and in
spare pages, ``UNUSED_PAGE`` past each request's last page), NaN-poisoned
buffers where the caller hands one, and every expectation from
``reference.ref_mla_decode``; the workspace sizes from sgl-kernel-xpu's
``SplitKVWorkspaceLayout`` arithmetic, written out by hand.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS
from pytest_mla.kernels.emulated import sgl_kernel_xpu_attention as xpu
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import LOG2E, LSE_TOL, TOL, UNUSED_PAGE, assert_close, make_case, reference


def padded_table(case, page_size):
    """The case's block table, widened with ``UNUSED_PAGE`` to a multiple of ``128 / page_size`` (asserted)."""
    table = case.block_table
    pack = 128 // page_size
    width = -(-table.shape[1] // pack) * pack
    pad = torch.full((table.shape[0], width - table.shape[1]), UNUSED_PAGE, dtype=torch.int32)
    return torch.cat([table, pad], dim=1).contiguous()


def decode(case, page_size, *, splits=1, workspace=None, **kwargs):
    q = case.q[:, 0]
    if workspace is None:
        workspace = torch.empty(0, dtype=torch.uint8)
    return xpu.flash_mla_decode(q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), case.cache_seqlens,
                                padded_table(case, page_size), workspace, case.softmax_scale, splits, **kwargs)


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("heads", [16, 128])
def test_decode_matches_the_reference(page_size, heads):
    case = make_case([1, 2, 70, 300], h_q=heads, page_size=page_size, seed=page_size + heads)
    out, lse = decode(case, page_size, return_lse=True)
    ref_out, ref_lse = reference(case)
    assert out.shape == (4, heads, 512) and out.dtype == case.q.dtype
    assert_close("out", out, ref_out[:, 0], TOL)
    assert lse.dtype == torch.float32
    assert_close("lse", lse, ref_lse[:, :, 0] * LOG2E, LSE_TOL)  # base 2, as the library's test states


def test_decode_result_does_not_depend_on_the_split_and_checks_the_workspace():
    case = make_case([40, 200], page_size=64, seed=5)
    one = decode(case, 64)
    need = xpu.split_kv_workspace_bytes(2, 16, 4)
    with pytest.raises(RuntimeError, match="MLA workspace too small"):
        decode(case, 64, splits=4, workspace=torch.empty(need - 1, dtype=torch.uint8))
    four = decode(case, 64, splits=4, workspace=torch.empty(need, dtype=torch.uint8))
    assert torch.equal(one, four)


def test_a_planted_fault_is_seen(monkeypatch):
    """The check these tests make fails on an emulation whose scores drop the rope part (q_pe . k_pe)."""
    case = make_case([70, 129], page_size=64, seed=9)
    right = xpu._scores
    monkeypatch.setattr(xpu, "_scores", lambda q_nope, q_pe, rows, scale: right(q_nope, q_pe * 0, rows, scale))
    with pytest.raises(AssertionError, match="out"):
        assert_close("out", decode(case, 64), reference(case)[0][:, 0], TOL)


def test_prefill_is_causal_bottom_right():
    case = make_case([5, 70, 140], s_q=4, page_size=32, seed=11)
    b, s_q, h, _ = case.q.shape
    q = case.q.reshape(b * s_q, h, 576)
    cu = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32)
    out = xpu.flash_mla_prefill(q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), cu, case.cache_seqlens, s_q,
                                case.block_table, torch.empty(0, dtype=torch.uint8), case.softmax_scale)
    assert_close("out", out.reshape(b, s_q, h, 512), reference(case, causal=True)[0], TOL)
    with pytest.raises(RuntimeError, match="^Non-causal MLA prefill is not supported yet.$"):
        xpu.flash_mla_prefill(q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), cu, case.cache_seqlens, s_q,
                              case.block_table, torch.empty(0, dtype=torch.uint8), case.softmax_scale, causal=False)


def test_what_the_op_refuses_it_refuses_as_the_op_does():
    case = make_case([70], page_size=64, seed=3)
    q = case.q[:, 0]
    cache, table = case.kv_cache.squeeze(2), padded_table(case, 64)
    ws = torch.empty(0, dtype=torch.uint8)
    args = (q[..., :512], q[..., 512:], cache, case.cache_seqlens, table, ws, 0.04)
    with pytest.raises(AssertionError):  # the wrapper: pages a multiple of 128 / page_size
        xpu.flash_mla_decode(*args[:4], table[:, :1].contiguous(), ws, 0.04)
    with pytest.raises(AssertionError):  # int32 lengths
        xpu.flash_mla_decode(*args[:3], case.cache_seqlens.long(), *args[4:])
    with pytest.raises(AssertionError):  # one dtype
        xpu.flash_mla_decode(q[..., :512], q[..., 512:].half(), *args[2:])
    with pytest.raises(RuntimeError, match="^Unsupported page size for MLA decode: 8"):
        small = cache.reshape(-1, 8, 576)
        xpu.flash_mla_decode(*args[:2], small, case.cache_seqlens, table.repeat(1, 8), ws, 0.04)
    with pytest.raises(RuntimeError, match="^page_table must be contiguous$"):
        xpu.flash_mla_decode(*args[:4], torch.cat([table, table], 1)[:, ::2], ws, 0.04)
    with pytest.raises(OutOfContractError, match="^seq_lens: request 0 has length 0"):
        xpu.flash_mla_decode(*args[:3], torch.zeros(1, dtype=torch.int32), *args[4:])
    with pytest.raises(OutOfContractError, match="256/32"):
        bf16 = torch.bfloat16
        xpu.flash_mla_decode(torch.zeros(1, 16, 256, dtype=bf16), torch.zeros(1, 16, 32, dtype=bf16),
                             torch.zeros(4, 64, 288, dtype=bf16), *args[3:])


def test_an_index_outside_the_cache_is_an_out_of_range_read():
    case = make_case([70, 10], page_size=64, seed=4)
    table = padded_table(case, 64)
    table[0, 1] = case.kv_cache.shape[0]
    q = case.q[:, 0]
    with pytest.raises(OutOfRangeRead, match="^page_table: index"):
        xpu.flash_mla_decode(q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), case.cache_seqlens, table,
                             torch.empty(0, dtype=torch.uint8), 0.04)
    long = case.cache_seqlens.clone()
    long[1] = 64 * table.shape[1] + 1
    with pytest.raises(OutOfRangeRead, match="^seq_lens: request 1"):
        xpu.flash_mla_decode(q[..., :512], q[..., 512:], case.kv_cache.squeeze(2), long, padded_table(case, 64),
                             torch.empty(0, dtype=torch.uint8), 0.04)


def test_workspace_sizes_follow_the_library_arithmetic():
    # one split: no workspace
    assert xpu.flash_mla_decode_get_workspace_size(4096, 2, 16, 64, num_kv_splits=1) == 0
    # B*H = 2048 > 64, page 64: 64 tokens a split, 4096 / 64 = 64 splits
    assert xpu.set_split_kv(16, 128, 4096, 64) == 64
    o_accum = 16 * 128 * 64 * 512 * 2
    lse = 16 * 128 * 64 * 4
    assert xpu.flash_mla_decode_get_workspace_size(4096, 16, 128, 64) == o_accum + 2 * lse
    # 256-byte alignment of each part: 1 x 1 x 3 splits
    assert xpu.flash_mla_decode_get_workspace_size(4096, 1, 1, 64, num_kv_splits=3) == 3072 + 2 * 256
    assert xpu.flash_mla_prefill_get_workspace_size(4096, 16, 128, 64) == 0
    with pytest.raises(RuntimeError, match="^Unsupported page size: 1$"):
        xpu.flash_mla_decode_get_workspace_size(4096, 1, 16, 1)


def test_registered_under_the_names_sglang_imports():
    for name in ("flash_mla_decode", "flash_mla_prefill", "flash_mla_decode_get_workspace_size",
                 "flash_mla_prefill_get_workspace_size"):
        assert EMULATIONS[f"sgl_kernel:{name}"] is getattr(xpu, name)
