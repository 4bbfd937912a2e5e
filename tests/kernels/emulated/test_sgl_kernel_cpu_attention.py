"""sgl-kernel's CPU attention ops (``decode_attention_cpu``, ``extend_attention_cpu``), emulated, against the reference.

The cases are what SGLang's ``intel_amx`` backend hands the ops: a slot-paged
cache (``[slots, H_kv, D]``, page size 1) addressed through ``req_to_token``
rows, ``req_pool_indices`` picking the rows. Every slot no sequence owns is
NaN, every ``req_to_token`` column past a length points at a NaN slot, the
outputs start NaN. The expectation is ``ref_mla_decode`` on a cache the test
fills itself (page size 1, the pool row as block table); ``logit_cap`` against
a few lines of float64 written from its definition.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mla.kernels.emulated import EMULATIONS
from pytest_mla.kernels.emulated import sgl_kernel_cpu_attention as ops
from pytest_mla.kernels.emulated.glue import OutOfContractError, OutOfRangeRead
from pytest_mla.kernels.reference import ref_mla_decode

from .cases import TOL, assert_close, poisoned

SLOTS, MAX_REQS, MAX_CTX, SPLITS = 300, 6, 96, 8
POISON_SLOT = SLOTS - 1  # never owned: NaN, and what every req_to_token column past a length points at


class Pool:
    """A NaN cache, a req_to_token table, and the rows the test itself placed (its own expectation)."""

    def __init__(self, lens, *, heads_kv, d, dv, mla, dtype=torch.bfloat16, index_dtype=torch.int32, seed=0):
        self.g = torch.Generator().manual_seed(seed)
        self.dtype, self.mla, self.d, self.dv = dtype, mla, d, dv
        if mla:
            self.k_buffer = poisoned((SLOTS, 1, d), dtype)
            self.v_buffer = self.k_buffer[..., :dv]
        else:
            self.k_buffer = poisoned((SLOTS, heads_kv, d), dtype)
            self.v_buffer = poisoned((SLOTS, heads_kv, dv), dtype)
        self.expected_k = self.k_buffer.clone()  # what the cache must hold (filled by the test, not the op)
        self.expected_v = self.expected_k[..., :dv] if mla else self.v_buffer.clone()
        self.req_to_token = torch.full((MAX_REQS, MAX_CTX), POISON_SLOT, dtype=index_dtype)
        free = torch.randperm(SLOTS - 1, generator=self.g)
        self.pool_rows = torch.randperm(MAX_REQS, generator=self.g)[:len(lens)]
        self.slots = []
        taken = 0
        for b, n in enumerate(lens):
            mine = free[taken:taken + n]
            taken += n
            self.req_to_token[self.pool_rows[b], :n] = mine.to(index_dtype)
            self.slots.append(mine)

    def rand(self, *shape):
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def fill(self, b, count):
        """Write sequence ``b``'s first ``count`` tokens into the cache (and the expectation)."""
        slots = self.slots[b][:count]
        k = self.rand(count, *self.k_buffer.shape[1:])
        self.k_buffer[slots] = k
        self.expected_k[slots] = k
        if not self.mla:
            v = self.rand(count, *self.v_buffer.shape[1:])
            self.v_buffer[slots] = v
            self.expected_v[slots] = v

    def place(self, b, position, k, v):
        """Put a token the op itself writes into the expectation only."""
        slot = self.slots[b][position]
        self.expected_k[slot] = k
        if not self.mla:
            self.expected_v[slot] = v

    def reference(self, b, q, length, scale):
        """``ref_mla_decode`` of sequence ``b``'s ``q [s_q, H, D]`` over its first ``length`` expected tokens."""
        heads_kv = self.expected_k.shape[1]
        cache = self.expected_k.reshape(SLOTS, 1, heads_kv, self.d)
        v_cache = None if self.mla else self.expected_v.reshape(SLOTS, 1, heads_kv, self.dv)
        table = self.req_to_token[self.pool_rows[b]][None].to(torch.int32)
        return ref_mla_decode(q[None], cache, table, torch.tensor([length], dtype=torch.int32), self.dv,
                              softmax_scale=scale, causal=True, v_cache=v_cache)


# ---- decode ------------------------------------------------------------------------------------------------


def decode_case(lens, *, heads, heads_kv, d, dv, mla, index_dtype=torch.int32, seed=0):
    pool = Pool(lens, heads_kv=heads_kv, d=d, dv=dv, mla=mla, index_dtype=index_dtype, seed=seed)
    b = len(lens)
    for i, n in enumerate(lens):
        pool.fill(i, n - 1)  # the last token is the new one: the op writes it at loc
    q = pool.rand(b, heads, d)
    key = pool.rand(b, 1 if mla else heads_kv, d)
    value = key[..., :dv] if mla else pool.rand(b, heads_kv, dv)
    loc = torch.stack([pool.slots[i][n - 1] for i, n in enumerate(lens)]).to(torch.int64)
    for i, n in enumerate(lens):
        pool.place(i, n - 1, key[i], value[i])
    args = dict(query=q, k_buffer=pool.k_buffer, v_buffer=pool.v_buffer, key_scale=1.0, value_scale=1.0,
                output=poisoned((b, heads, dv), q.dtype), key=key, value=value, loc=loc,
                attn_logits=poisoned((b, heads, SPLITS, dv + 1), torch.float32), req_to_token=pool.req_to_token,
                req_pool_indices=pool.pool_rows.to(torch.int64), seq_lens=torch.tensor(lens, dtype=torch.int64),
                sm_scale=d ** -0.5, logit_cap=0.0, is_cross_attn=False, sliding_window_size=0, encoder_lens=None,
                sinks=None)
    return pool, args


def check_decode(pool, args, lens, *, scale=None):
    scale = args["sm_scale"] if scale is None else scale
    for i, n in enumerate(lens):
        ref_out, ref_lse = pool.reference(i, args["query"][i][None], n, scale)
        assert_close(f"out[{i}]", args["output"][i], ref_out[0, 0].to(torch.float32), TOL)
        # the splits' LSEs combine to the sequence's LSE (natural log)
        split_lse = args["attn_logits"][i, :, :, -1].to(torch.float64)
        assert torch.allclose(torch.logsumexp(split_lse, dim=-1), ref_lse[0, :, 0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(("heads", "heads_kv", "d", "dv", "mla"), [
    (16, 1, 576, 512, True),  # DeepSeek's absorbed MLA: one latent head, V the first 512 columns
    (8, 8, 64, 64, False),  # MHA
    (8, 2, 128, 128, False),  # GQA
])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_decode_writes_the_new_token_and_matches_the_reference(heads, heads_kv, d, dv, mla, index_dtype):
    lens = [1, 7, 33, 90]  # 1: only the new token; 7 < SPLITS: empty splits; 90: uneven splits
    pool, args = decode_case(lens, heads=heads, heads_kv=heads_kv, d=d, dv=dv, mla=mla, index_dtype=index_dtype,
                             seed=heads + d)
    assert ops.decode_attention_cpu(**args) is None
    check_decode(pool, args, lens)
    # the in-kernel write: each key (and, not MLA, value) at its loc, every other slot as it was
    assert torch.equal(pool.k_buffer.nan_to_num(7.0), pool.expected_k.nan_to_num(7.0))
    assert torch.equal(pool.v_buffer.nan_to_num(7.0), pool.expected_v.nan_to_num(7.0))


def test_decode_reads_head_strided_buffers_and_odd_head_sizes():
    """As the op's own test: buffers and new rows strided by head (``x.transpose(0, 1).contiguous().transpose(0,
    1)``), head sizes 33 / 55 (decode has no multiple-of-32 rule)."""
    lens = [4, 30]
    pool, args = decode_case(lens, heads=8, heads_kv=2, d=33, dv=55, mla=False, seed=13)
    for name in ("k_buffer", "v_buffer", "key", "value"):
        strided = args[name].transpose(0, 1).contiguous().transpose(0, 1)
        assert not strided.is_contiguous() and strided.stride(-1) == 1
        args[name] = strided
    pool.k_buffer, pool.v_buffer = args["k_buffer"], args["v_buffer"]
    ops.decode_attention_cpu(**args)
    check_decode(pool, args, lens)
    assert torch.equal(pool.k_buffer.nan_to_num(7.0), pool.expected_k.nan_to_num(7.0))


def test_decode_attn_logits_hold_each_split_and_split_zero_the_merge():
    lens = [20]  # 8 splits of ceil(20 / 8) = 3 tokens: splits 0..5 hold 3, 6 holds 2, 7 is empty
    pool, args = decode_case(lens, heads=4, heads_kv=4, d=64, dv=64, mla=False, seed=5)
    ops.decode_attention_cpu(**args)
    logits = args["attn_logits"][0].to(torch.float64)  # [H, splits, 65]
    for s, (lo, hi) in enumerate([(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 20)]):
        if s == 0:
            continue  # split 0's output columns hold the merge, checked below
        _, ref_lse = pool.reference(0, args["query"][0][None], hi, args["sm_scale"])
        # split s alone: its softmax sum is the difference of two prefixes' (tokens [0, hi) less [0, lo))
        _, lse_lo = pool.reference(0, args["query"][0][None], lo, args["sm_scale"])
        expected_lse = torch.log(torch.exp(ref_lse[0, :, 0]) - torch.exp(lse_lo[0, :, 0]))
        assert torch.allclose(logits[:, s, -1], expected_lse, atol=1e-4), s
    assert bool(torch.isneginf(logits[:, 7, -1]).all()) and bool((logits[:, 7, :-1] == 0).all())
    top = logits[:, :, -1].max(dim=1).values
    weights = torch.exp(logits[:, :, -1] - top[:, None])
    assert_close("merge", (logits[:, 0, :-1] / weights.sum(1)[:, None]).to(torch.float32),
                 args["output"][0].to(torch.float32), TOL)


def test_decode_logit_cap_caps_the_scaled_scores():
    lens = [5, 12]
    pool, args = decode_case(lens, heads=4, heads_kv=2, d=64, dv=64, mla=False, seed=9)
    args["sm_scale"], args["logit_cap"] = 0.5, 2.0  # large scores, a tight cap: the cap changes the answer
    ops.decode_attention_cpu(**args)
    for i, n in enumerate(lens):
        q = args["query"][i].double()  # [4, 64]
        slots = pool.req_to_token[pool.pool_rows[i], :n].long()
        k = pool.expected_k[slots].double().repeat_interleave(2, dim=1)  # [n, 4, 64]
        v = pool.expected_v[slots].double().repeat_interleave(2, dim=1)
        s = 0.5 * torch.einsum("hd,nhd->hn", q, k)
        s = 2.0 * torch.tanh(s / 2.0)
        expected = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v)
        assert_close(f"capped[{i}]", args["output"][i], expected.float(), TOL)
        uncapped = torch.einsum("hn,nhd->hd", torch.softmax(0.5 * torch.einsum("hd,nhd->hn", q, k), -1), v)
        assert not torch.allclose(expected, uncapped, atol=0.05)  # the case would see a missing cap


def test_planted_fault_a_wrong_decode_scale_fails_the_check():
    lens = [9, 40]
    pool, args = decode_case(lens, heads=16, heads_kv=1, d=576, dv=512, mla=True, seed=2)
    true_scale = args["sm_scale"]
    args["sm_scale"] = true_scale * 1.05
    ops.decode_attention_cpu(**args)
    with pytest.raises(AssertionError):
        check_decode(pool, args, lens, scale=true_scale)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"seq_lens": torch.tensor([7], dtype=torch.int32)}, RuntimeError, "decode: expect req_lens to be int64"),
    ({"req_to_token": None}, RuntimeError, "decode: expect req_to_token to be int32 or int64"),
    ({"loc": torch.zeros(1, 1, dtype=torch.int64)}, RuntimeError, "loc must be a 1D tensor"),
    ({"attn_logits": torch.zeros(1, 4, SPLITS, 65, dtype=torch.float64)}, RuntimeError, "at::kFloat"),
    ({"value": None}, RuntimeError, "key and value should have values at the same time"),
    ({"query": "float32"}, RuntimeError, "not implemented for 'Float'"),
    ({"key_scale": 0.5}, OutOfContractError, "key_scale"),
    ({"sliding_window_size": 128}, OutOfContractError, "sliding_window_size"),
    ({"sinks": torch.zeros(4)}, OutOfContractError, "sinks"),
    ({"is_cross_attn": True}, OutOfContractError, "is_cross_attn"),
])
def test_decode_argument_checks(change, error, message):
    _, args = decode_case([7], heads=4, heads_kv=4, d=64, dv=64, mla=False)
    for key, value in change.items():
        if key == "req_to_token":
            value = args["req_to_token"].to(torch.int16)
        elif value == "float32":
            value = args["query"].float()
        args[key] = value
    with pytest.raises(error, match=message):
        ops.decode_attention_cpu(**args)


def test_decode_fp8_cache_is_not_modelled():
    _, args = decode_case([7], heads=4, heads_kv=4, d=64, dv=64, mla=False)
    args["k_buffer"] = args["k_buffer"].to(torch.float8_e4m3fn)
    args["v_buffer"] = args["v_buffer"].to(torch.float8_e4m3fn)
    with pytest.raises(OutOfContractError, match="kv_cache_dtype"):
        ops.decode_attention_cpu(**args)


def test_decode_indices_out_of_range():
    pool, args = decode_case([7], heads=4, heads_kv=4, d=64, dv=64, mla=False)
    args["loc"] = torch.tensor([SLOTS])
    before = pool.k_buffer.clone()
    with pytest.raises(OutOfRangeRead, match="loc"):  # the op writes there unchecked
        ops.decode_attention_cpu(**args)
    assert torch.equal(pool.k_buffer.nan_to_num(7.0), before.nan_to_num(7.0))  # nothing written
    pool, args = decode_case([7], heads=4, heads_kv=4, d=64, dv=64, mla=False)
    pool.req_to_token[pool.pool_rows[0], 2] = SLOTS  # the op's own check: slot < slots
    with pytest.raises(RuntimeError, match="token index out of scope!"):
        ops.decode_attention_cpu(**args)
    pool.req_to_token[pool.pool_rows[0], 2] = -3  # unchecked: a foreign row
    with pytest.raises(OutOfRangeRead, match="req_to_token"):
        ops.decode_attention_cpu(**args)
    _, args = decode_case([7], heads=4, heads_kv=4, d=64, dv=64, mla=False)
    args["seq_lens"] = torch.tensor([MAX_CTX + 1])
    with pytest.raises(RuntimeError, match="seq_len_kv out of scope!"):
        ops.decode_attention_cpu(**args)


# ---- extend ------------------------------------------------------------------------------------------------


def extend_case(prefixes, extends, *, heads, heads_kv, d, dv, max_len_extend=None, index_dtype=torch.int32,
                seed=0):
    lens = [p + e for p, e in zip(prefixes, extends)]
    pool = Pool(lens, heads_kv=heads_kv, d=d, dv=dv, mla=False, index_dtype=index_dtype, seed=seed)
    total = sum(extends)
    q = pool.rand(total, heads, d)
    k_ext, v_ext = pool.rand(total, heads_kv, d), pool.rand(total, heads_kv, dv)
    starts, at = [], 0
    for i, (p, e) in enumerate(zip(prefixes, extends)):
        pool.fill(i, p)  # the prefix is cached; the extend rows stay NaN in the cache
        for j in range(e):
            pool.place(i, p + j, k_ext[at + j], v_ext[at + j])
        starts.append(at)
        at += e
    args = dict(q_extend=q, k_extend=k_ext, v_extend=v_ext, o_extend=poisoned((total, heads, dv), q.dtype),
                k_buffer=pool.k_buffer, v_buffer=pool.v_buffer, key_scale=1.0, value_scale=1.0,
                req_to_token=pool.req_to_token, req_pool_indices=pool.pool_rows.to(torch.int64),
                seq_lens=torch.tensor(lens, dtype=torch.int64),
                extend_seq_lens=torch.tensor(extends, dtype=index_dtype),
                extend_start_loc=torch.tensor(starts, dtype=index_dtype),
                max_len_extend=max(extends) if max_len_extend is None else max_len_extend, sm_scale=d ** -0.5,
                logit_cap=0.0, is_cross_attn=False, sliding_window_size=0, encoder_lens=None, sinks=None,
                tree_mask=None, is_causal=True)
    return pool, args, lens, starts


def check_extend(pool, args, extends, lens, starts, *, scale=None, rows=None):
    scale = args["sm_scale"] if scale is None else scale
    for i, (e, n, at) in enumerate(zip(extends, lens, starts)):
        ref_out, _ = pool.reference(i, args["q_extend"][at:at + e], n, scale)
        r = e if rows is None else min(e, rows)
        assert_close(f"o[{i}]", args["o_extend"][at:at + r], ref_out[0, :r].to(torch.float32), TOL)


@pytest.mark.parametrize(("heads", "heads_kv", "d", "dv"), [(8, 8, 64, 64), (8, 2, 128, 128), (16, 1, 576, 512)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_extend_prefix_from_the_cache_extend_rows_causal_bottom_right(heads, heads_kv, d, dv, index_dtype):
    prefixes, extends = [0, 5, 40], [3, 1, 17]
    pool, args, lens, starts = extend_case(prefixes, extends, heads=heads, heads_kv=heads_kv, d=d, dv=dv,
                                           index_dtype=index_dtype, seed=d)
    cache_before = pool.k_buffer.clone()
    assert ops.extend_attention_cpu(**args) is None
    check_extend(pool, args, extends, lens, starts)
    assert torch.equal(pool.k_buffer.nan_to_num(7.0), cache_before.nan_to_num(7.0))  # extend never writes the cache


def test_extend_mla_prefill_skips_the_latent_cache_and_refuses_a_prefix():
    heads, d, dv = 4, 192, 128  # DeepSeek's non-absorbed prefill: k_extend per head, the cache one 576-wide head
    g = torch.Generator().manual_seed(11)
    extends = [6, 35]
    total = sum(extends)
    q, k, v = (torch.randn(total, heads, n, generator=g).to(torch.bfloat16) for n in (d, d, dv))
    k_buffer = poisoned((SLOTS, 1, 576), torch.bfloat16)
    req_to_token = torch.full((MAX_REQS, MAX_CTX), POISON_SLOT, dtype=torch.int32)
    args = dict(q_extend=q, k_extend=k, v_extend=v, o_extend=poisoned((total, heads, dv), torch.bfloat16),
                k_buffer=k_buffer, v_buffer=k_buffer[..., :512], key_scale=1.0, value_scale=1.0,
                req_to_token=req_to_token, req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor(extends),
                extend_seq_lens=torch.tensor(extends, dtype=torch.int32),
                extend_start_loc=torch.tensor([0, 6], dtype=torch.int32), max_len_extend=35, sm_scale=0.1,
                logit_cap=0.0)
    ops.extend_attention_cpu(**args)
    for i, (at, e) in enumerate(zip([0, 6], extends)):
        cache = k[at:at + e].reshape(e, 1, heads, d)
        ref_out, _ = ref_mla_decode(q[at:at + e][None], cache, torch.arange(e, dtype=torch.int32)[None],
                                    torch.tensor([e], dtype=torch.int32), dv, softmax_scale=0.1, causal=True,
                                    v_cache=v[at:at + e].reshape(e, 1, heads, dv))
        assert_close(f"o[{i}]", args["o_extend"][at:at + e], ref_out[0].float(), TOL)
    args["seq_lens"] = torch.tensor([8, 35])
    with pytest.raises(RuntimeError, match="expect seq_len_prefix to be 0, got 2"):
        ops.extend_attention_cpu(**args)


def test_extend_rows_past_the_blocks_of_max_len_extend_stay_unwritten():
    # max_len_extend 10 -> one block of 32 rows: a 40-row sequence gets rows 0..31 only
    pool, args, lens, starts = extend_case([4], [40], heads=2, heads_kv=2, d=64, dv=64, max_len_extend=10)
    ops.extend_attention_cpu(**args)
    check_extend(pool, args, [40], lens, starts, rows=32)
    assert bool(args["o_extend"][32:].isnan().all())


def test_planted_fault_a_wrong_extend_scale_fails_the_check():
    prefixes, extends = [10, 0], [7, 20]
    pool, args, lens, starts = extend_case(prefixes, extends, heads=8, heads_kv=2, d=128, dv=128, seed=4)
    true_scale = args["sm_scale"]
    args["sm_scale"] = true_scale * 1.05
    ops.extend_attention_cpu(**args)
    with pytest.raises(AssertionError):
        check_extend(pool, args, extends, lens, starts, scale=true_scale)


def test_planted_fault_extend_rows_read_from_the_cache_fail_the_check():
    """Were the extend keys read from the (NaN) cache rather than ``k_extend``, the output would be NaN."""
    prefixes, extends = [3], [5]
    pool, args, lens, starts = extend_case(prefixes, extends, heads=2, heads_kv=2, d=64, dv=64, seed=8)
    slots = pool.slots[0][3:8]
    args["k_extend"] = pool.k_buffer[slots]  # what reading the extend rows from the cache would see
    ops.extend_attention_cpu(**args)
    with pytest.raises(AssertionError):
        check_extend(pool, args, extends, lens, starts)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"k_extend": None}, RuntimeError, "k_extend and v_extend are required for non-cross attention"),
    ({"extend_seq_lens": "int64"}, RuntimeError, "same dtype as req_to_token"),
    ({"seq_lens": torch.tensor([2], dtype=torch.int64)}, RuntimeError, "prefix len < 0!"),
    ({"tree_mask": torch.ones(9, dtype=torch.bool)}, OutOfContractError, "tree_mask"),
    ({"is_causal": False}, OutOfContractError, "is_causal"),
    ({"logit_cap": 30.0}, OutOfContractError, "logit_cap"),
    ({"value_scale": 2.0}, OutOfContractError, "value_scale"),
])
def test_extend_argument_checks(change, error, message):
    _, args, _, _ = extend_case([4], [3], heads=2, heads_kv=2, d=64, dv=64)
    for key, value in change.items():
        args[key] = args[key].to(torch.int64) if value == "int64" else value
    with pytest.raises(error, match=message):
        ops.extend_attention_cpu(**args)


def test_extend_head_sizes_must_be_multiples_of_32():
    _, args, _, _ = extend_case([4], [3], heads=2, heads_kv=2, d=48, dv=64)
    with pytest.raises(RuntimeError, match="invalid head_size 48"):
        ops.extend_attention_cpu(**args)


def test_extend_prefix_slot_outside_the_cache_is_out_of_range():
    pool, args, _, _ = extend_case([4], [3], heads=2, heads_kv=2, d=64, dv=64)
    pool.req_to_token[pool.pool_rows[0], 1] = SLOTS + 5
    with pytest.raises(OutOfRangeRead, match="req_to_token"):
        ops.extend_attention_cpu(**args)


def test_registered_under_the_ops_names():
    assert EMULATIONS["torch.ops.sgl_kernel:decode_attention_cpu"] is ops.decode_attention_cpu
    assert EMULATIONS["torch.ops.sgl_kernel:extend_attention_cpu"] is ops.extend_attention_cpu
