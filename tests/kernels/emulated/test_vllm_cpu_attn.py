"""vLLM's CPU paged attention ops (``CPU_ATTN``'s ``torch.ops._C`` of a CPU build), emulated, against the reference.

The cases are what vLLM's ``tests/kernels/attention/test_cpu_attn.py``
(``varlen_with_paged_kv``) does: a ``[blocks, kv_heads, block_size, 2 * d]``
cache viewed as its K and V halves, every token written by
``cpu_attn_reshape_and_cache`` through a shuffled block table, a schedule from
``get_scheduler_metadata``, then ``cpu_attention_with_kv_cache``. The cache
starts NaN, the output is poisoned; the expectation is ``ref_mla_decode`` on
the same paged tokens (GQA heads, causal bottom-right).
"""

from __future__ import annotations

import math

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS, vllm_cpu_attn as ops
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.inputs import gen_decode_inputs
from pytest_mla.kernels.reference import ref_mla_decode

from .cases import TOL, assert_close, poisoned

H_Q, H_KV, D = 8, 2, 64


def gqa_case(seqlens, *, s_q=1, page_size=32, kv_dtype="auto", seed=0):
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=H_Q, h_kv=H_KV, d_qk=D, d_v=D, mla=False, page_size=page_size,
                             kv_dtype=kv_dtype, seed=seed)


def reference(case, *, causal=True):
    args = case.ref_args()
    args["causal"] = causal
    args["tree_mask"] = None
    out, _ = ref_mla_decode(**args)
    b, s_q = case.q.shape[:2]
    return out.reshape(b * s_q, H_Q, D)


def fp8_of(case):
    return case.kv_cache.dtype == torch.float8_e4m3fn


def written_cache(case, isa, *, block_table=None):
    """A NaN cache, every cached token written by ``cpu_attn_reshape_and_cache`` at its block-table slot."""
    ps = case.kv_cache.shape[1]
    fp8 = fp8_of(case)
    blocks = case.kv_cache.shape[0]
    cache = torch.full((blocks, H_KV, ps, 2 * D), math.nan, dtype=torch.float8_e4m3fn if fp8 else case.q.dtype)
    cache = cache.view(torch.uint8) if fp8 else cache
    key_cache, value_cache = cache.view(blocks, H_KV, 2 * ps, D).chunk(2, dim=2)
    table = case.block_table if block_table is None else block_table
    keys, values, slots = [], [], []
    scale = case.kv_scale or 1.0
    for i, n in enumerate(int(x) for x in case.cache_seqlens):
        pages = case.block_table[i, : -(-n // ps)].long()
        keys.append(case.kv_cache[pages].reshape(-1, H_KV, D)[:n])
        values.append(case.v_cache[pages].reshape(-1, H_KV, D)[:n])
        t = torch.arange(n)
        slots.append(table[i, t // ps].long() * ps + t % ps)
    key = (torch.cat(keys).to(torch.float64) * scale).to(case.q.dtype)
    value = (torch.cat(values).to(torch.float64) * scale).to(case.q.dtype)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, torch.cat(slots), isa, k_scale=scale,
                                   v_scale=scale, kv_cache_dtype="fp8" if fp8 else "auto")
    return key_cache, value_cache


def attend(case, isa, *, read_isa=None, causal=True, caches=None, **changes):
    b, s_q = case.q.shape[:2]
    fp8 = fp8_of(case)
    key_cache, value_cache = caches if caches is not None else written_cache(case, isa)
    qsl = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32)
    lens = case.cache_seqlens.to(torch.int32)
    meta = ops.get_scheduler_metadata(b, H_Q, H_KV, D, lens, case.q.dtype, qsl, causal, -1, read_isa or isa, True,
                                      None, "fp8" if fp8 else "auto")
    args = {"query": case.q.reshape(b * s_q, H_Q, D), "key_cache": key_cache, "value_cache": value_cache,
            "output": poisoned((b * s_q, H_Q, D), case.q.dtype), "query_start_loc": qsl, "seq_lens": lens,
            "scale": case.softmax_scale, "causal": causal, "alibi_slopes": None, "sliding_window": -1,
            "block_table": case.block_table, "softcap": 0.0, "scheduler_metadata": meta, "s_aux": None,
            "dynamic_causal": None, "k_scale": case.kv_scale or 1.0, "v_scale": case.kv_scale or 1.0,
            "kv_cache_dtype": "fp8" if fp8 else "auto"}
    args.update(changes)
    ops.cpu_attention_with_kv_cache(**args)
    return args["output"]


@pytest.mark.parametrize("isa", ["vec", "amx"])
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("s_q, page_size", [(1, 32), (4, 64)])
def test_attention_matches_the_reference_over_a_shuffled_paged_cache(isa, kv_dtype, s_q, page_size):
    case = gqa_case([4, 33, 100, 130], s_q=s_q, page_size=page_size, kv_dtype=kv_dtype, seed=70 + s_q)
    assert_close("out", attend(case, isa), reference(case))


def test_without_causal_every_query_sees_every_key():
    case = gqa_case([40, 70], s_q=3, seed=71)
    out = attend(case, "vec", causal=False)
    assert_close("out", out, reference(case, causal=False))
    assert not torch.allclose(out.float(), reference(case).float(), atol=1e-2)  # the mask matters here


def test_a_cache_written_for_one_isa_and_read_with_another_is_scrambled():
    case = gqa_case([50, 90], seed=72)
    out = attend(case, "amx", read_isa="vec")
    assert not torch.allclose(torch.nan_to_num(out.float(), nan=1e3), reference(case).float(), atol=0.05)


@pytest.mark.parametrize("isa, token, dim, k_at, v_at", [
    # vec: K column-major [d, block], V row-major [block, d] (block 32, d 64)
    ("vec", 3, 5, 5 * 32 + 3, 3 * 64 + 5),
    # amx: K (token 17 -> group 1, slot 1; dim 5 -> pair 2, lane 1), V (dim 5 -> group 0; token 17 -> pair 8, lane 1)
    ("amx", 17, 5, ((1 * 32 + 2) * 16 + 1) * 2 + 1, 0 * 32 * 16 + 8 * 32 + 5 * 2 + 1),
    ("amx", 2, 37, ((0 * 32 + 18) * 16 + 2) * 2 + 1, 2 * 32 * 16 + 1 * 32 + 5 * 2 + 0),
])
def test_each_isa_writes_the_tiles_its_kernel_reads(isa, token, dim, k_at, v_at):
    key = torch.zeros(1, 1, D, dtype=torch.bfloat16)
    value = torch.zeros(1, 1, D, dtype=torch.bfloat16)
    key[0, 0, dim], value[0, 0, dim] = 3.0, 5.0
    cache = torch.zeros(2, 1, 32, 2 * D, dtype=torch.bfloat16)
    key_cache, value_cache = cache.view(2, 1, 64, D).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([32 + token]), isa)
    k_tile, v_tile = cache[1, 0].reshape(-1)[: 32 * D], cache[1, 0].reshape(-1)[32 * D:]
    assert k_tile.nonzero().flatten().tolist() == [k_at] and k_tile[k_at] == 3.0
    assert v_tile.nonzero().flatten().tolist() == [v_at] and v_tile[v_at] == 5.0
    assert not cache[0].any()


def test_fp8_writes_truncate_to_the_e4m3_byte_below():
    values = torch.tensor([1.1, -1.1, 1.0, 500.0, 0.0, 2.0 ** -9 * 3.5], dtype=torch.float32)
    assert ops._quantise_e4m3(values, 1.0).tolist() == [0x38, 0xB8, 0x38, 0x7E, 0x00, 0x03]
    every = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = every[~torch.isnan(every.float())]
    assert torch.equal(ops._quantise_e4m3(finite.float() * 4.0, 0.25).view(torch.float8_e4m3fn).float(),
                       finite.float().where(finite.float() != 0, 0.0))


def test_the_scale_is_the_softmax_scale():
    case = gqa_case([60, 90], seed=73)
    wrong = attend(case, "amx", scale=case.softmax_scale * 1.05)
    assert not torch.allclose(wrong.float(), reference(case).float(), atol=1e-3, rtol=1.5e-2)


def test_a_block_id_off_by_one_reads_other_tokens():
    case = gqa_case([64, 96], seed=74)
    shifted = case.block_table.clone()
    for i, n in enumerate(int(x) for x in case.cache_seqlens):
        used = -(-n // case.kv_cache.shape[1])
        shifted[i, :used] = (shifted[i, :used] + 1) % case.kv_cache.shape[0]
    out = attend(case, "vec", block_table=shifted)
    assert not torch.allclose(torch.nan_to_num(out.float(), nan=1e3), reference(case).float(), atol=0.05)


def test_a_block_id_outside_the_cache_raises_naming_the_flag():
    case = gqa_case([40], seed=75)
    table = case.block_table.clone()
    table[0, 1] = case.kv_cache.shape[0]
    with pytest.raises(OutOfRangeRead, match=r"^block_table: index \d+ at 1 is outside"):
        attend(case, "vec", block_table=table)
    with pytest.raises(OutOfRangeRead, match=r"^slot_mapping: "):
        written_cache(case, "vec", block_table=table)


def test_a_schedule_built_for_other_lengths_is_the_callers_bug():
    case = gqa_case([40, 50], seed=76)
    with pytest.raises(OutOfRangeRead, match=r"^scheduler_metadata: "):
        attend(case, "vec", seq_lens=case.cache_seqlens.to(torch.int32) - 1)


@pytest.mark.parametrize("change, flag", [
    ({"alibi_slopes": torch.ones(H_Q)}, "alibi_slopes"),
    ({"sliding_window": 16}, "sliding_window"),
    ({"softcap": 30.0}, "softcap"),
    ({"s_aux": torch.zeros(H_Q, dtype=torch.bfloat16)}, "s_aux"),
    ({"kv_cache_dtype": "fp8_e5m2"}, "kv_cache_dtype"),
])
def test_what_is_not_modelled_raises_one_line_naming_the_flag(change, flag):
    case = gqa_case([20], seed=77)
    with pytest.raises(OutOfContractError) as info:
        attend(case, "vec", **change)
    assert str(info.value).startswith(f"{flag}: ") and "\n" not in str(info.value)


def test_the_scheduler_refuses_unmodelled_isas_and_knows_the_real_ones():
    lens, qsl = torch.tensor([5], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(OutOfContractError, match=r"^isa_hint: ISA 'vec16'"):
        ops.get_scheduler_metadata(1, 8, 2, 64, lens, torch.bfloat16, qsl, True, -1, "vec16", True, None, "auto")
    with pytest.raises(RuntimeError, match="Unsupported CPU attention ISA hint: avx2"):
        ops.get_scheduler_metadata(1, 8, 2, 64, lens, torch.bfloat16, qsl, True, -1, "avx2", True, None, "auto")
    with pytest.raises(OutOfContractError, match=r"^head_dim: 80"):
        ops.get_scheduler_metadata(1, 8, 2, 80, lens, torch.bfloat16, qsl, True, -1, "vec", True, None, "auto")


def test_registered_under_the_ops_vllm_calls():
    for name in ("get_scheduler_metadata", "cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache"):
        assert EMULATIONS[f"torch.ops._C:{name}"] is getattr(ops, name)
