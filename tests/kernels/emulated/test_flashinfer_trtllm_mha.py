"""FlashInfer's TRT-LLM GQA decode (XQA, trtllm-gen) against the float64 reference.

Every expectation comes from ``reference.ref_mla_decode`` on the case's own
inputs; XQA's masks are packed here from the layout FlashInfer's tests use
(``generate_causal_mask``: bit ``j`` of row ``i``, 32-bit words as pairs of
uint16), never with the emulation's unpacking.
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated.flashinfer_trtllm_mha import trtllm_batch_decode_with_kv_cache as decode
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.reference import ref_mla_decode

from .cases import TOL, assert_close, poisoned

WORKSPACE = torch.zeros(16, dtype=torch.uint8)
H_Q, H_KV, D = 8, 2, 64
BACKENDS = ["xqa", "trtllm-gen"]


def gqa_case(seqlens, *, s_q=1, page_size=16, kv_dtype="auto", spec_topk=1, spec_steps=0, seed=0):
    """Seeded GQA inputs: NaN past every length, shuffled block table (pages past the last hold a foreign id)."""
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=H_Q, h_kv=H_KV, d_qk=D, d_v=D, mla=False, page_size=page_size,
                             kv_dtype=kv_dtype, spec_topk=spec_topk, spec_steps=spec_steps, seed=seed)


def reference(case, *, tree=False):
    """``out [b·s_q, H, D]`` float64 from ``ref_mla_decode`` (causal bottom-right, or the case's tree)."""
    args = case.ref_args()
    if not tree:
        args["tree_mask"] = None
    out, _ = ref_mla_decode(**args)
    b, s_q = case.q.shape[:2]
    return out.reshape(b * s_q, H_Q, D)


def hnd(case):
    """The case's NHD pages ``[P, ps, Hk, D]`` as the default ``HND`` pages ``[P, Hk, ps, D]``."""
    return case.kv_cache.transpose(1, 2).contiguous(), case.v_cache.transpose(1, 2).contiguous()


def packed_mask(visible):
    """FlashInfer's packing of a ``[b, q, q]`` bool draft mask: uint32 words of bits ``j``, viewed as uint16 pairs."""
    b, q, _ = visible.shape
    words = -(-q // 32)
    padded = torch.zeros(b, q, words * 32, dtype=torch.int64)
    padded[..., :q] = visible.to(torch.int64)
    bits = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)
    as_u32 = (padded.view(b, q, words, 32) * bits).sum(-1)  # [b, q, words]
    low, high = as_u32 & 0xFFFF, as_u32 >> 16
    return torch.stack([low, high], dim=-1).reshape(b, q, 2 * words).to(torch.int32).to(torch.uint16)


def run(case, backend, *, scales=(None, 1.0), layout="HND", **kwargs):
    b, s_q = case.q.shape[:2]
    bmm1 = case.softmax_scale if scales[0] is None else scales[0]
    cache = hnd(case) if layout == "HND" else (case.kv_cache, case.v_cache)
    return decode(case.q.reshape(b * s_q, H_Q, D), cache, WORKSPACE, case.block_table, case.cache_seqlens,
                  max_seq_len=int(case.cache_seqlens.max()), bmm1_scale=bmm1, bmm2_scale=scales[1],
                  kv_layout=layout, backend=backend, q_len_per_req=s_q, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [16, 64])
def test_decode_matches_reference_into_the_callers_out(backend, page_size):
    case = gqa_case([1, 37, 130], page_size=page_size, seed=page_size)
    out = poisoned((3, H_Q, D), torch.bfloat16)
    got = run(case, backend, out=out)
    assert got is out
    assert_close("out", got, reference(case), TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nhd_pages_and_the_single_tensor_layout_read_the_same_rows(backend):
    case = gqa_case([5, 40], seed=3)
    ref = reference(case)
    assert_close("out", run(case, backend, layout="NHD"), ref, TOL)
    k, v = hnd(case)
    b = case.q.shape[0]
    single = decode(case.q.reshape(b, H_Q, D), torch.stack([k, v], dim=1), WORKSPACE, case.block_table,
                    case.cache_seqlens, 40, bmm1_scale=case.softmax_scale, backend=backend)
    assert_close("out", single, ref, TOL)


def test_trtllm_gen_verify_is_causal_bottom_right_without_a_mask():
    case = gqa_case([9, 70, 131], s_q=4, seed=5)
    assert_close("out", run(case, "trtllm-gen"), reference(case), TOL)


def test_xqa_verify_reads_the_draft_block_from_its_mask():
    causal = gqa_case([9, 70, 131], s_q=4, seed=5)
    tri = torch.tril(torch.ones(4, 4, dtype=torch.bool)).expand(3, 4, 4)
    assert_close("out", run(causal, "xqa", mask=packed_mask(tri)), reference(causal), TOL)
    tree = gqa_case([20, 90], s_q=5, spec_topk=2, spec_steps=2, seed=6)  # a tree: the mask is all that masks
    assert_close("out", run(tree, "xqa", mask=packed_mask(tree.tree_mask)), reference(tree, tree=True), TOL)
    with pytest.raises(AssertionError, match="Mask is required"):
        run(causal, "xqa")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_cache_is_read_raw_and_scaled_by_bmm1_and_bmm2(backend):
    case = gqa_case([33, 100], kv_dtype="fp8_e4m3", seed=7)
    s = case.kv_scale
    assert s is not None and s != 1.0
    got = run(case, backend, scales=(case.softmax_scale * s, s))  # the tests' q_scale·k_scale·sm_scale, v_scale
    assert got.dtype == torch.bfloat16
    assert_close("out", got, reference(case), TOL)
    wrong = run(case, backend, scales=(case.softmax_scale * s, 1.0))
    assert not torch.allclose(wrong.double(), reference(case), atol=1e-2)


def test_trtllm_gen_takes_an_fp8_query_with_an_fp8_cache_and_writes_bf16():
    case = gqa_case([33, 100], kv_dtype="fp8_e4m3", seed=8)
    b = case.q.shape[0]
    q8 = case.q.reshape(b, H_Q, D).to(torch.float8_e4m3fn)  # exact: the case rounds q through e4m3
    got = decode(q8, hnd(case), WORKSPACE, case.block_table, case.cache_seqlens, 100,
                 bmm1_scale=case.softmax_scale * case.kv_scale, bmm2_scale=case.kv_scale, backend="trtllm-gen",
                 out_dtype=torch.bfloat16)
    assert_close("out", got, reference(case), TOL)
    with pytest.raises(ValueError, match="only float16 and bfloat16 input"):
        decode(q8, hnd(case), WORKSPACE, case.block_table, case.cache_seqlens, 100, backend="xqa")


def test_ragged_queries_through_cum_seq_lens_q_on_trtllm_gen():
    case = gqa_case([12, 50], s_q=3, seed=9)
    q = case.q.reshape(6, H_Q, D)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    got = decode(q, hnd(case), WORKSPACE, case.block_table, case.cache_seqlens, 50, bmm1_scale=case.softmax_scale,
                 backend="trtllm-gen", q_len_per_req=None, max_q_len=3, cum_seq_lens_q=cu)
    assert_close("out", got, reference(case), TOL)
    with pytest.raises(ValueError, match="xqa backend does not support cum_seq_lens_q"):
        decode(q, hnd(case), WORKSPACE, case.block_table, case.cache_seqlens, 50, backend="xqa",
               q_len_per_req=None, max_q_len=3, cum_seq_lens_q=cu)


def test_lse_is_base_2_on_trtllm_gen_and_refused_by_xqa():
    case = gqa_case([7, 64], seed=10)
    args = case.ref_args()
    _, lse = ref_mla_decode(**args)  # [b, H, 1], natural log
    out, got = run(case, "trtllm-gen", return_lse=True)
    torch.testing.assert_close(got.double(), lse[:, :, 0] / math.log(2.0), atol=1e-5, rtol=1e-6)
    with pytest.raises(NotImplementedError, match="xqa backend does not support return_lse"):
        run(case, "xqa", return_lse=True)


def test_auto_picks_trtllm_gen_on_sm100_and_xqa_elsewhere(monkeypatch):
    case = gqa_case([9, 70], s_q=4, seed=11)
    for capability, needs_mask in (((10, 0), False), ((9, 0), True), ((12, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability, **k: c)
        if needs_mask:  # XQA's spec decode takes its mask; trtllm-gen has none
            with pytest.raises(AssertionError, match="Mask is required"):
                run(case, "auto")
        else:
            assert_close("out", run(case, "auto"), reference(case), TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_request_leaves_its_rows_unwritten(backend):
    case = gqa_case([0, 21], seed=12)
    got = run(case, backend, out=poisoned((2, H_Q, D), torch.bfloat16).zero_())
    assert got[0].isnan().all()  # a reader of that row sees it
    assert_close("out", got[1:], reference(case)[1:], TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_page_id_outside_the_cache_raises(backend):
    case = gqa_case([40, 5], seed=13)
    table = case.block_table.clone()
    table[0, 1] = case.kv_cache.shape[0] + 3
    with pytest.raises(OutOfRangeRead, match="block_tables"):
        decode(case.q.reshape(2, H_Q, D), hnd(case), WORKSPACE, table, case.cache_seqlens, 40,
               bmm1_scale=case.softmax_scale, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flag, kwargs", [
    ("window_left", {"window_left": 16}),
    ("sinks", {"sinks": torch.zeros(H_Q)}),
    ("skip_softmax_threshold_scale_factor", {"skip_softmax_threshold_scale_factor": 1e-30}),
    ("o_scale", {"o_scale": 0.5}),
    ("kv_cache_sf", {"kv_cache_sf": (torch.zeros(1), torch.zeros(1))}),
    ("causal_seqlens_kv_global", {"causal_seqlens_kv_global": torch.zeros(2, dtype=torch.int32)}),
])
def test_flags_outside_the_contract_are_refused_by_name(backend, flag, kwargs):
    case = gqa_case([10, 20], seed=14)
    with pytest.raises(OutOfContractError) as info:
        run(case, backend, **kwargs)
    assert info.value.flag == flag


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_e5m2_cache_is_refused_naming_the_cache(backend):
    case = gqa_case([10, 20], kv_dtype="fp8_e5m2", seed=15)
    with pytest.raises(OutOfContractError) as info:
        run(case, backend, scales=(case.softmax_scale, 1.0), mask=None)
    assert info.value.flag == "kv_cache" and "float8_e5m2" in str(info.value)


def test_library_checks_are_kept():
    case = gqa_case([10, 20], seed=16)
    with pytest.raises(ValueError, match="cp_world/cp_rank require causal_seqlens_kv_global"):
        run(case, "trtllm-gen", cp_world=2)
    with pytest.raises(ValueError, match="multi_ctas_kv_counter_buffer is too small"):
        run(case, "trtllm-gen", multi_ctas_kv_counter_buffer=torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="Invalid page_size"):
        run(gqa_case([10, 20], page_size=8, seed=16), "xqa")
    with pytest.raises(ValueError, match="Unsupported out_dtype"):
        run(case, "trtllm-gen", out_dtype=torch.float32)
