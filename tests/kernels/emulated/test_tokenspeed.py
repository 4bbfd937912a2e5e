"""TokenSpeed MLA decode (tokenspeed-mla 2.0.4), emulated, against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.compare import check_close
from pytest_mla.kernels.emulated import tokenspeed
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.reference import ref_merge

from .cases import LOG2E, LSE_TOL, TOL, assert_close, dense_rows, make_case, poisoned, reference

WORKSPACE = torch.empty(16, dtype=torch.int8)


def decode(case, *, q=None, cache=None, table=None, lens=None, **kw):
    q = case.q if q is None else q
    cache = case.kv_cache.squeeze(2) if cache is None else cache
    lens = case.cache_seqlens if lens is None else lens
    return tokenspeed.tokenspeed_mla_decode(
        query=q, kv_cache=cache, workspace_buffer=WORKSPACE, kv_lora_rank=512, qk_rope_head_dim=64,
        block_tables=case.block_table if table is None else table, seq_lens=lens,
        max_seq_len=max(int(lens.max()), 1), **{"softmax_scale": case.softmax_scale, **kw})


@pytest.mark.parametrize("seqlens,s_q", [([0, 1, 70, 129], 1), ([3, 4, 64, 130], 4)])
def test_decode_and_verify_match_the_reference_with_a_base2_lse(seqlens, s_q):
    case = make_case(seqlens, s_q=s_q, seed=60 + s_q)
    out = poisoned((len(seqlens), s_q, 16, 512), torch.bfloat16)
    ret, lse = decode(case, out=out, return_lse=True)
    ref_out, ref_lse = reference(case)  # lse [b, h, s_q], natural log, -inf where nothing is visible
    assert ret is out and lse.shape == (len(seqlens), s_q, 16) and lse.dtype == torch.float32
    assert_close("out", out, ref_out, TOL)
    assert_close("lse", lse, (ref_lse * LOG2E).transpose(1, 2), LSE_TOL)  # base 2; -inf stays -inf
    assert torch.isneginf(lse[0]).all() == (seqlens[0] == 0)
    # the causal block is bottom-right: without the mask every query sees every cached key
    free = decode(case, causal_mask=False)
    assert_close("free", free, reference(case, causal=False)[0], TOL)
    if s_q > 1:
        assert not check_close("masked", free, ref_out, TOL).ok


@pytest.mark.parametrize("k_scale", [1.0, 0.25])
def test_fp8_reads_raw_values_and_the_caller_folds_the_scales(k_scale):
    """No descales: softmax_scale carries q_scale·k_scale and output_scale k_scale, as the library's callers pass them."""
    case = make_case([5, 70, 129], s_q=2, kv_dtype="fp8_e4m3", kv_scale=k_scale, seed=63)
    q8 = case.q.to(torch.float8_e4m3fn)
    assert torch.equal(q8.double(), case.q.double())
    out = decode(case, q=q8, softmax_scale=case.softmax_scale * k_scale, output_scale=k_scale)
    assert out.dtype == torch.bfloat16
    assert_close("out", out, reference(case)[0], TOL)
    if k_scale != 1.0:  # a caller that forgets to fold k_scale gets a different answer
        wrong = decode(case, q=q8, softmax_scale=case.softmax_scale)
        assert not check_close("unscaled", wrong, reference(case)[0], TOL).ok


def _interleaved_shard(case, rank, world, interleave, page_size=64):
    """Rank ``rank``'s local cache of ``case``: global token t on rank (t // interleave) % world, in order."""
    from pytest_mla.kernels.inputs import gen_generator, gen_paged_cache

    rows = []
    for i in range(case.q.shape[0]):
        dense = dense_rows(case, i)
        owner = (torch.arange(dense.shape[0]) // interleave) % world
        rows.append(dense[owner == rank].squeeze(1).to(torch.float32))
    cache, _, table = gen_paged_cache([r[:, None] for r in rows], page_size, gen_generator(70 + rank))
    return cache.squeeze(2).to(case.kv_cache.dtype), table, torch.tensor([r.shape[0] for r in rows], dtype=torch.int32)


@pytest.mark.parametrize("world,interleave", [(2, 1), (4, 1), (2, 16)])
@pytest.mark.parametrize("s_q", [1, 3])
def test_dcp_partials_merge_to_the_full_attention(world, interleave, s_q):
    case = make_case([1, 5, 70, 130], s_q=s_q, kv_dtype="fp8_e4m3", kv_scale=1.0, seed=64 + world + s_q)
    q8 = case.q.to(torch.float8_e4m3fn)
    outs, lses = [], []
    for rank in range(world):
        cache, table, lens = _interleaved_shard(case, rank, world, interleave)
        o, lse2 = decode(case, q=q8, cache=cache, table=table, lens=lens, return_lse=True,
                         causal_seqs=case.cache_seqlens, cp_world=world, cp_rank=rank, cp_interleave_size=interleave)
        outs.append(o.double())
        lses.append((lse2.double() / LOG2E).transpose(1, 2))  # base 2 -> natural, [b, h, s_q]
    merged_out, merged_lse = ref_merge(outs, lses)
    ref_out, ref_lse = reference(case)
    assert_close("merged out", merged_out, ref_out, TOL)
    assert_close("merged lse", merged_lse, ref_lse, LSE_TOL)


def test_the_wrappers_checks_are_kept():
    case = make_case([9, 70], seed=66)
    with pytest.raises(ValueError, match="only supported on the fp8 decode path"):
        decode(case, cp_world=2, causal_seqs=case.cache_seqlens)
    q8, cache8 = case.q.to(torch.float8_e4m3fn), case.kv_cache.squeeze(2).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="causal_seqs .* is required when cp_world > 1"):
        decode(case, q=q8, cache=cache8, cp_world=2)
    with pytest.raises(ValueError, match=r"cp_rank must be in \[0, cp_world\)"):
        decode(case, q=q8, cache=cache8, cp_world=2, cp_rank=2, causal_seqs=case.cache_seqlens)
    with pytest.raises(AssertionError, match="must match query dtype"):
        decode(case, q=q8)
    with pytest.raises(ValueError, match="min_split_kv must be an integer"):
        decode(case, min_split_kv=0)


def test_what_the_emulation_does_not_model_raises_naming_the_flag():
    case = make_case([9, 70], seed=67)
    with pytest.raises(OutOfContractError, match="^window_left: "):
        decode(case, window_left=8)
    with pytest.raises(OutOfContractError, match="^local_visible_lens: "):
        decode(case, local_visible_lens=torch.ones(2, 1, dtype=torch.int32))
    table = case.block_table.clone()
    table[1, 1] = case.kv_cache.shape[0]
    with pytest.raises(OutOfRangeRead, match=r"^block_tables: index \d+ at 1 is outside"):
        decode(case, table=table)


def test_sm_count_and_prefill_warmup_need_no_device():
    assert tokenspeed.get_num_sm(torch.device("cuda", 0)) == tokenspeed.EMULATED_SM_COUNT
    assert tokenspeed.warmup_compile_prefill(q_dtype=torch.bfloat16, d_qk=576, d_v=512) is None
    assert math.isfinite(float(tokenspeed.EMULATED_SM_COUNT))
