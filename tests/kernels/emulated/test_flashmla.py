"""FlashMLA's emulation (sgl-flash-mla 1.0.0 API and vLLM's ops) against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import flashmla
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead

from .cases import LSE_TOL, TOL, assert_close, make_case, natural_with, poisoned, reference

# (seqlens, s_q): decode with empty and one-token requests, a chain verify whose first request is
# shorter than its queries (its first queries see nothing), lengths across page boundaries.
CASES = [([0, 1, 70, 129], 1), ([3, 4, 64, 130], 4), ([1, 200], 2)]


def run_sgl(case, *, causal=True, **kw):
    sched, splits = flashmla.get_mla_decoding_metadata(case.cache_seqlens, case.q.shape[1] * case.q.shape[2], 1,
                                                       use_legacy=True, **kw)
    meta = flashmla.FlashMLASchedMeta(tile_scheduler_metadata=sched, num_splits=splits)
    return flashmla.flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens, 512, meta,
                                           softmax_scale=case.softmax_scale, causal=causal, use_legacy=True)


@pytest.mark.parametrize("seqlens,s_q", CASES, ids=[f"{s}-sq{q}" for s, q in CASES])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_dense_decode_matches_reference(seqlens, s_q, dtype):
    case = make_case(seqlens, s_q=s_q, dtype=dtype, seed=len(seqlens) + s_q)
    out, lse = run_sgl(case)
    ref_out, ref_lse = reference(case)
    assert out.dtype == case.q.dtype and lse.dtype == torch.float32
    assert_close("out", out, ref_out, TOL)
    # natural log, +inf (not -inf) where a query sees nothing
    assert_close("lse", lse, natural_with(ref_lse, math.inf), LSE_TOL)
    assert torch.isposinf(lse[0]).any() == (seqlens[0] < s_q)


def test_single_query_ignores_causal():
    case = make_case([5, 70], s_q=1, seed=3)
    a, la = run_sgl(case, causal=True)
    b, lb = run_sgl(case, causal=False)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_multi_token_non_causal_sees_every_key():
    case = make_case([6, 70], s_q=3, seed=4)
    out, lse = run_sgl(case, causal=False)
    ref_out, ref_lse = reference(case, causal=False)
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, ref_lse, LSE_TOL)
    causal_out, _ = reference(case, causal=True)
    assert not torch.allclose(out.double(), causal_out, atol=1e-2)  # the case tells the masks apart


def test_vllm_op_writes_the_callers_buffer_and_returns_its_schedule():
    case = make_case([0, 33, 100], s_q=2, seed=5)
    out = poisoned((3, 2, 16, 512), torch.bfloat16)
    o, lse, tsm, splits = flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                                    case.softmax_scale, True, None, None, out)
    assert o is out and not torch.isnan(out).any()
    ref_out, ref_lse = reference(case)
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, natural_with(ref_lse, math.inf), LSE_TOL)
    assert tsm.dtype == torch.int32 and tsm.shape[1] == 8 and splits.shape == (4,)
    again = flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                      case.softmax_scale, True, tsm, splits)  # same lengths: the schedule holds
    assert torch.equal(again[0], o)
    grown = case.cache_seqlens + 1
    with pytest.raises(OutOfContractError, match="^tile_scheduler_metadata: built for other cache_seqlens"):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, grown, case.block_table, case.softmax_scale, True,
                                  tsm, splits)


def test_a_schedule_copied_into_a_graph_buffer_still_matches():
    """Engines copy the metadata into persistent CUDA-graph buffers; the copy must carry its lengths."""
    case = make_case([10, 90], seed=6)
    tsm, splits = flashmla.get_mla_decoding_metadata(case.cache_seqlens, 16, 1, use_legacy=True)
    buf_tsm = torch.zeros(4, 8, dtype=torch.int32)
    buf_tsm[: tsm.shape[0]].copy_(tsm)
    out, _, _, _ = flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                             case.softmax_scale, True, buf_tsm[: tsm.shape[0]], splits.clone())
    assert_close("out", out, reference(case)[0], TOL)
    with pytest.raises(OutOfContractError, match="^tile_scheduler_metadata: not built by the emulated"):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                  case.softmax_scale, True, torch.zeros(1, 8, dtype=torch.int32), splits)


@pytest.mark.parametrize("kv_scale", [1.0, 0.25])
@pytest.mark.parametrize("descale_q", [1.0, 0.5])
def test_fp8_descales_dequantise_q_k_and_v(kv_scale, descale_q):
    case = make_case([0, 1, 70, 129], s_q=2, kv_dtype="fp8_e4m3", kv_scale=kv_scale, seed=7)
    q_fp8 = (case.q.double() / descale_q).to(torch.float8_e4m3fn)
    assert torch.equal(q_fp8.double() * descale_q, case.q.double())  # exact, so the reference sees the same q
    sched, splits = flashmla.get_mla_decoding_metadata_dense_fp8(case.cache_seqlens, 32, 1)
    out, lse = flashmla.fwd_kvcache_mla_fp8(q_fp8, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                            case.softmax_scale, True, sched, splits,
                                            torch.tensor([descale_q]), torch.tensor([case.kv_scale]))
    ref_out, ref_lse = reference(case)  # dequantises the cache with kv_scale
    assert out.dtype == torch.bfloat16
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, natural_with(ref_lse, math.inf), LSE_TOL)
    # the same through the Python API, as SGLang calls it
    meta = flashmla.FlashMLASchedMeta(tile_scheduler_metadata=sched, num_splits=splits)
    out2, _ = flashmla.flash_mla_with_kvcache(q_fp8, case.kv_cache, case.block_table, case.cache_seqlens, 512, meta,
                                              softmax_scale=case.softmax_scale, causal=True, is_fp8_kvcache=True,
                                              use_legacy=True, descale_q=torch.tensor([descale_q]),
                                              descale_k=torch.tensor([case.kv_scale]))
    assert torch.equal(out2, out)


def test_a_descale_left_out_is_caught():
    """k_scale = 0.25 read as 1: the output moves far beyond tolerance (what an engine ignoring k_scale does)."""
    case = make_case([40, 129], kv_dtype="fp8_e4m3", kv_scale=0.25, seed=8)
    sched, splits = flashmla.get_mla_decoding_metadata_dense_fp8(case.cache_seqlens, 16, 1)
    out, _ = flashmla.fwd_kvcache_mla_fp8(case.q.to(torch.float8_e4m3fn), case.kv_cache, 512, case.cache_seqlens,
                                          case.block_table, case.softmax_scale, True, sched, splits,
                                          torch.tensor([1.0]), torch.tensor([1.0]))
    from pytest_mla.kernels.compare import check_close
    assert not check_close("out", out, reference(case)[0], TOL).ok


def test_a_cache_of_another_dtype_than_q_fails_the_librarys_own_check():
    """FlashMLA's TORCH_CHECK(kcache.dtype() == q_dtype): an e4m3 query over an e5m2 cache is the library's
    RuntimeError (a finding when an engine does it), not an emulation that cannot run."""
    case = make_case([40, 129], kv_dtype="fp8_e5m2", kv_scale=1.0, seed=9)
    sched, splits = flashmla.get_mla_decoding_metadata_dense_fp8(case.cache_seqlens, 16, 1)
    with pytest.raises(RuntimeError, match="^query and key must have the same dtype$"):
        flashmla.fwd_kvcache_mla_fp8(case.q.to(torch.float8_e4m3fn), case.kv_cache, 512, case.cache_seqlens,
                                     case.block_table, case.softmax_scale, True, sched, splits,
                                     torch.tensor([1.0]), torch.tensor([1.0]))


def test_out_of_range_page_raises():
    case = make_case([70, 129], seed=9)
    table = case.block_table.clone()
    table[1, 2] = case.kv_cache.shape[0]  # the third page of a 129-token request
    with pytest.raises(OutOfRangeRead, match=r"^block_table: index \d+ at 2 is outside"):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, table, case.softmax_scale, True)
    table = case.block_table.clone()
    table[0, 1] = -1  # past request 0's two pages would be fine; inside them is not
    with pytest.raises(OutOfRangeRead, match="^block_table: index -1"):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, table, case.softmax_scale, True)


def test_unused_table_entries_are_never_read():
    case = make_case([64, 65], seed=10)  # request 0 fills exactly one page; its next entry is UNUSED_PAGE
    out, *_ = flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table,
                                        case.softmax_scale, True)
    assert_close("out", out, reference(case)[0], TOL)


@pytest.mark.parametrize("change,flag", [
    (dict(page_size=16), "page_block_size"),
    (dict(h_q=16, dtype="fp32"), "q"),
])
def test_shapes_and_dtypes_outside_the_kernel_raise(change, flag):
    case = make_case([20], seed=11, **change)
    with pytest.raises(OutOfContractError, match=f"^{flag}: "):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 512, case.cache_seqlens, case.block_table, 0.04, True)


def test_flags_the_emulation_does_not_model_raise_naming_the_flag():
    case = make_case([20], seed=12)
    meta = flashmla.FlashMLASchedMeta()
    with pytest.raises(OutOfContractError, match="^indices: sparse decoding"):
        flashmla.flash_mla_with_kvcache(case.q, case.kv_cache, None, None, 512, meta,
                                        indices=torch.zeros(1, 1, 64, dtype=torch.int32), use_legacy=True)
    with pytest.raises(OutOfContractError, match="^topk: "):
        flashmla.get_mla_decoding_metadata(case.cache_seqlens, 16, 1, topk=64)


def test_the_librarys_head_size_checks_are_kept():
    """FlashMLA's TORCH_CHECKs on the head sizes (csrc/api/dense_decode.h) refuse any latent but DeepSeek's: a
    320-wide (Mistral Small 4) or 288-wide (MiniCPM3) row fails as on the GPU, not as an unmodelled call."""
    case = make_case([20], seed=12)
    with pytest.raises(RuntimeError, match="^Only head_size_v == 512 is supported$"):
        flashmla.dense_decode_fwd(case.q, case.kv_cache, 256, case.cache_seqlens, case.block_table, 0.04, True)
    for width in (320, 288):
        q, kv = case.q[..., :width].contiguous(), case.kv_cache[..., :width].contiguous()
        with pytest.raises(RuntimeError, match="^Only head_size_k == 576 or 512 is supported$"):
            flashmla.dense_decode_fwd(q, kv, 512, case.cache_seqlens, case.block_table, 0.04, True)
    with pytest.raises(OutOfContractError, match="^head_dim: "):  # q and cache of two widths: not modelled
        flashmla.dense_decode_fwd(case.q[..., :512].contiguous(), case.kv_cache, 512, case.cache_seqlens,
                                  case.block_table, 0.04, True)


def test_the_wheels_own_assertions_are_kept():
    case = make_case([20], seed=13)
    with pytest.raises(AssertionError, match="use_legacy=True"):  # dense decode lives on the legacy side only
        flashmla.flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens, 512,
                                        flashmla.FlashMLASchedMeta())
    with pytest.raises(AssertionError, match="num_splits must be None"):
        flashmla.flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens, 512,
                                        flashmla.FlashMLASchedMeta(), torch.zeros(2, dtype=torch.int32),
                                        use_legacy=True)


# sglang-kernel's module (SGLang 0.5.22): tensor metadata from get_mla_metadata, the legacy ops behind it


def run_sgl_kernel(case, *, causal=True, fp8=False, descale_q=None, descale_k=None, q=None):
    sched, splits = flashmla.sgl_kernel_get_mla_metadata(case.cache_seqlens, case.q.shape[1] * case.q.shape[2], 1,
                                                         is_fp8_kvcache=fp8)
    assert sched.dtype == torch.int32 and splits.dtype == torch.int32 and splits.numel() == case.q.shape[0] + 1
    return flashmla.sgl_kernel_flash_mla_with_kvcache(case.q if q is None else q, case.kv_cache, case.block_table,
                                                      case.cache_seqlens, 512, sched, splits,
                                                      softmax_scale=case.softmax_scale, causal=causal,
                                                      descale_q=descale_q, descale_k=descale_k)


@pytest.mark.parametrize("seqlens,s_q", CASES, ids=[f"{s}-sq{q}" for s, q in CASES])
def test_sgl_kernel_tensor_metadata_matches_reference(seqlens, s_q):
    case = make_case(seqlens, s_q=s_q, seed=20 + s_q)
    out, lse = run_sgl_kernel(case)
    ref_out, ref_lse = reference(case)
    assert out.dtype == case.q.dtype
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, natural_with(ref_lse, math.inf), LSE_TOL)


@pytest.mark.parametrize("kv_scale", [1.0, 0.25])
def test_sgl_kernel_fp8_query_takes_the_dense_fp8_op_with_its_descales(kv_scale):
    case = make_case([0, 1, 70, 129], s_q=2, kv_dtype="fp8_e4m3", kv_scale=kv_scale, seed=21)
    q_fp8 = case.q.to(torch.float8_e4m3fn)
    assert torch.equal(q_fp8.double(), case.q.double())
    out, lse = run_sgl_kernel(case, fp8=True, q=q_fp8, descale_q=torch.tensor([1.0]),
                              descale_k=torch.tensor([case.kv_scale]))
    ref_out, ref_lse = reference(case)
    assert out.dtype == torch.bfloat16
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, natural_with(ref_lse, math.inf), LSE_TOL)


def test_sgl_kernel_schedule_is_checked_against_the_calls_lengths():
    case = make_case([40, 129], seed=22)
    sched, splits = flashmla.sgl_kernel_get_mla_metadata(case.cache_seqlens + 1, 16, 1)
    with pytest.raises(OutOfContractError, match="^tile_scheduler_metadata: built for other cache_seqlens"):
        flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens,
                                                   512, sched, splits, softmax_scale=case.softmax_scale, causal=True)
    sched, splits = flashmla.sgl_kernel_get_mla_metadata(case.cache_seqlens, 16, 1, is_fp8_kvcache=True)
    with pytest.raises(OutOfContractError, match="^tile_scheduler_metadata: built for the other kernel"):
        flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens,
                                                   512, sched, splits, softmax_scale=case.softmax_scale, causal=True)


def test_sgl_kernel_sched_meta_path_and_the_wheels_assertions():
    case = make_case([5, 70], s_q=2, seed=23)
    meta, none = flashmla.sgl_kernel_get_mla_metadata()
    assert isinstance(meta, flashmla.FlashMLASchedMeta) and none is None
    out, _ = flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens,
                                                        512, meta, softmax_scale=case.softmax_scale, causal=True)
    assert_close("out", out, reference(case)[0], TOL)
    with pytest.raises(AssertionError, match="inconsistent with FlashMLASchedMeta"):
        flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens,
                                                   512, meta, softmax_scale=case.softmax_scale, causal=False)
    sched, splits = flashmla.sgl_kernel_get_mla_metadata(case.cache_seqlens, 16, 1)
    with pytest.raises(AssertionError, match="descale_q and descale_k should be both None or both not None"):
        flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, case.block_table, case.cache_seqlens,
                                                   512, sched, splits, descale_q=torch.tensor([1.0]))
    with pytest.raises(OutOfContractError, match="^topk: "):
        flashmla.sgl_kernel_get_mla_metadata(case.cache_seqlens, 16, 1, topk=64)
    with pytest.raises(OutOfContractError, match="^indices: "):
        flashmla.sgl_kernel_flash_mla_with_kvcache(case.q, case.kv_cache, None, None, 512, sched, splits,
                                                   indices=torch.zeros(1, 1, 64, dtype=torch.int32))
