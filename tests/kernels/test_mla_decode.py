"""The project's Triton MLA / GQA decode kernel against the float64 reference.

Runs everywhere: under ``TRITON_INTERPRET=1`` on CPU (set by ``triton_mla`` on
import when torch sees no GPU), on the GPU when there is one. Every case is
seeded (the seed is in its id; ``PYTEST_MLA_SEED`` shifts all seeds for a fresh
draw), uses a shuffled block table with NaN past each sequence's length and
huge indices in unused entries, and writes into a NaN-poisoned ``out``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import sys
import zlib

import pytest
import torch

from pytest_mla.kernels import triton_mla
from pytest_mla.kernels.compare import TOLERANCES, check_close, tolerance_for
from pytest_mla.kernels.dcp import gen_dcp_shards
from pytest_mla.kernels.inputs import (
    DecodeInputs,
    gen_decode_inputs,
    gen_generator,
    gen_poisoned_out,
    gen_uniform_values,
)
from pytest_mla.kernels.reference import ref_attend, ref_kernel, ref_merge, ref_mla_decode
from pytest_mla.kernels.triton_mla import (
    default_num_splits,
    merge_attention_states,
    merge_attention_states_torch,
    mla_decode,
)

MODE = triton_mla.TRITON_MODE  # "interpreter", "sm90", ... or "cpu" (nothing can run)
DEVICE = "cpu" if MODE in ("interpreter", "cpu") else "cuda"
SEED_BASE = int(os.environ.get("PYTEST_MLA_SEED", "0"))

pytestmark = pytest.mark.skipif(MODE == "cpu", reason="no GPU and TRITON_INTERPRET=0: Triton cannot run here")


def seed_of(name: str) -> int:
    """Stable per-case seed (same on every xdist worker), shifted by PYTEST_MLA_SEED."""
    return (zlib.crc32(name.encode()) + SEED_BASE) % 2**31


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    seqlens: tuple[int, ...]  # tokens per request (global S; per-rank lengths follow from dcp)
    s_q: int  # query tokens per request (1 = plain decode, >1 = speculative verify)
    h_q: int  # query heads
    d_qk: int  # kv_lora_rank + qk_rope_head_dim (MLA) or head_dim (GQA)
    d_v: int  # kv_lora_rank (MLA) or head_dim (GQA)
    h_kv: int = 1  # 1 for MLA; > 1 for GQA with a separate v_cache
    page_size: int = 16
    dtype: str = "bf16"  # q dtype
    kv_dtype: str = "auto"  # "auto" = q dtype, or "fp8_e4m3"
    num_splits: int | None = None  # None = default_num_splits
    causal: bool = True
    tree: tuple[int, int] | None = None  # (topk, steps) draft tree; s_q = 1 + topk * steps
    dcp: tuple[int, int] | None = None  # (world, interleave)

    @property
    def mla(self) -> bool:
        return self.h_kv == 1

    @property
    def id(self) -> str:
        kind = f"mla{self.d_v}+{self.d_qk - self.d_v}" if self.mla else f"gqa{self.h_kv}x{self.d_qk}"
        kv = "-fp8kv" if self.kv_dtype == "fp8_e4m3" else ""
        parts = [kind, f"{self.dtype}{kv}", f"p{self.page_size}", f"sq{self.s_q}", f"h{self.h_q}",
                 "len" + ",".join(map(str, self.seqlens))]
        if self.num_splits is not None:
            parts.append(f"split{self.num_splits}")
        if not self.causal:
            parts.append("noncausal")
        if self.tree:
            parts.append(f"tree{self.tree[0]}x{self.tree[1]}")
        if self.dcp:
            parts.append(f"dcp{self.dcp[0]}i{self.dcp[1]}")
        name = "-".join(parts)
        return f"{name}-s{seed_of(name)}"

    @property
    def seed(self) -> int:
        return int(self.id.rsplit("-s", 1)[1])

    def inputs(self) -> DecodeInputs:
        topk, steps = self.tree or (1, 0)
        x = gen_decode_inputs(self.seqlens, s_q=self.s_q, h_q=self.h_q, d_qk=self.d_qk, d_v=self.d_v,
                              h_kv=self.h_kv, mla=self.mla, page_size=self.page_size, dtype=self.dtype,
                              kv_dtype=self.kv_dtype, spec_topk=topk, spec_steps=steps, seed=self.seed)
        return dataclasses.replace(x, causal=self.causal).to(DEVICE)


def lengths_for(page: int, s_q: int, causal: bool = True) -> tuple[int, ...]:
    """0, 1, page-1, page+1 (and a multi-page one), bumped to >= s_q where causal needs it."""
    raw = (0, 1, max(page - 1, 2), page + 1, 2 * page + 3)
    return tuple(n if (n == 0 or n >= s_q or not causal) else n + s_q for n in raw)


HEADS = (1, 3, 16, 20, 128)
SPLITS = (None, 1, 3, 7)

# Small-dim MLA (64 + 16) sweep: every dtype x page size x s_q; heads and splits rotate through
# their values so that each appears with every dtype.
SWEEP_CASES = [
    Case(seqlens=lengths_for(page, s_q)[: 3 if h_q == 128 else 5], s_q=s_q, h_q=h_q, d_qk=80, d_v=64,
         page_size=page, dtype=dtype, num_splits=splits)
    for n, (dtype, page, s_q) in enumerate(itertools.product(("fp32", "fp16", "bf16"), (1, 16, 32, 64, 128), (1, 2, 4)))
    for h_q, splits in [(HEADS[n % len(HEADS)], SPLITS[(n // 2) % len(SPLITS)])]
]

GQA_CASES = [
    Case(seqlens=lengths_for(page, s_q)[1:], s_q=s_q, h_q=h_q, d_qk=d, d_v=d, h_kv=h_kv, page_size=page,
         dtype=dtype, num_splits=splits)
    for (dtype, page, s_q, h_kv, h_q, d, splits) in [
        ("fp32", 16, 1, 2, 8, 64, None),
        ("bf16", 1, 2, 4, 8, 64, 3),
        ("fp16", 32, 4, 8, 32, 128, None),
        ("bf16", 64, 1, 4, 64, 128, 2),
        ("fp32", 128, 2, 3, 12, 32, 5),
        ("bf16", 16, 4, 2, 2, 32, None),  # one query head per KV head
    ]
] + [  # GQA with d_qk > d_v: the tail of K is scored but never used as V
    Case(seqlens=(5, 40), s_q=2, h_q=4, d_qk=96, d_v=64, h_kv=2, page_size=16, dtype="fp32"),
]

FP8_CASES = [
    Case(seqlens=lengths_for(page, s_q)[: 3 if h_q == 128 else 5], s_q=s_q, h_q=h_q, d_qk=80, d_v=64,
         page_size=page, dtype=dtype, kv_dtype="fp8_e4m3", num_splits=splits)
    for (dtype, page, s_q, h_q, splits) in [
        ("bf16", 64, 1, 16, None), ("fp16", 16, 2, 20, 3), ("fp32", 1, 4, 3, None), ("bf16", 128, 1, 128, 2),
    ]
] + [Case(seqlens=(33, 0), s_q=2, h_q=8, d_qk=64, d_v=64, h_kv=2, page_size=16, dtype="bf16", kv_dtype="fp8_e4m3")]

REAL_MLA_CASES = [  # DeepSeek-V3 dims: kv_lora_rank 512 + rope 64
    Case(seqlens=(300, 257), s_q=1, h_q=16, d_qk=576, d_v=512, page_size=64, dtype="bf16"),
    Case(seqlens=(65, 0, 17), s_q=2, h_q=128, d_qk=576, d_v=512, page_size=64, dtype="bf16", num_splits=2),
    Case(seqlens=(100, 31), s_q=4, h_q=16, d_qk=576, d_v=512, page_size=32, dtype="fp32", num_splits=4),
    Case(seqlens=(200, 9), s_q=1, h_q=16, d_qk=576, d_v=512, page_size=64, dtype="bf16", kv_dtype="fp8_e4m3"),
    Case(seqlens=(40,), s_q=1, h_q=16, d_qk=576, d_v=512, page_size=1, dtype="fp16"),
]

SPLIT_CASES = [  # forcing num_splits: 1, many, more splits than tokens (empty splits merge to nothing)
    Case(seqlens=lens, s_q=s_q, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp32", num_splits=splits)
    for lens, s_q, splits in [((130, 7), 1, 1), ((130, 7), 1, 9), ((5, 3), 2, 64), ((0, 0), 1, 4), ((1,), 1, 24)]
]

MASK_CASES = [
    Case(seqlens=(5, 40, 17), s_q=5, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="bf16", tree=(2, 2)),
    Case(seqlens=(12, 64), s_q=7, h_q=3, d_qk=80, d_v=64, page_size=1, dtype="fp32", tree=(3, 2), num_splits=3),
    Case(seqlens=(30, 10), s_q=10, h_q=20, d_qk=80, d_v=64, page_size=32, dtype="fp16", tree=(3, 3)),
    Case(seqlens=(70,), s_q=64, h_q=1, d_qk=80, d_v=64, page_size=16, dtype="fp32", tree=(7, 9)),  # 64 drafts: bit 63
    Case(seqlens=(0, 3, 40), s_q=4, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp32", causal=False),
    Case(seqlens=(3, 9), s_q=2, h_q=8, d_qk=64, d_v=64, h_kv=2, page_size=1, dtype="bf16", causal=False,
         num_splits=3),
]

DCP_CASES = [  # per-rank local caches; every rank checked against the DCP-aware reference, then merged
    Case(seqlens=(37, 2, 0), s_q=1, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp32", dcp=(2, 1)),
    Case(seqlens=(37, 5), s_q=4, h_q=16, d_qk=80, d_v=64, page_size=1, dtype="fp32", dcp=(4, 1)),
    Case(seqlens=(50, 6), s_q=3, h_q=3, d_qk=80, d_v=64, page_size=16, dtype="bf16", dcp=(2, 4), num_splits=3),
    Case(seqlens=(41, 9), s_q=5, h_q=16, d_qk=80, d_v=64, page_size=32, dtype="fp32", dcp=(4, 2), tree=(2, 2)),
    Case(seqlens=(33,), s_q=2, h_q=8, d_qk=64, d_v=64, h_kv=2, page_size=16, dtype="fp16", dcp=(3, 1)),
    Case(seqlens=(3, 1), s_q=1, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp32", dcp=(8, 1)),  # empty ranks
]

KERNEL_CASES = SWEEP_CASES + GQA_CASES + FP8_CASES + REAL_MLA_CASES + SPLIT_CASES + MASK_CASES


# --------------------------------------------------------------------------- helpers


def run_kernel(x: DecodeInputs, num_splits=None, *, kernel=None, **dcp):
    """``kernel`` (default mla_decode) into a NaN-poisoned out; checks the out buffer is the one returned."""
    b, s_q, h_q, _ = x.q.shape
    out = gen_poisoned_out(b, s_q, h_q, x.head_dim_v, x.q.dtype, device=x.q.device)
    o, lse = (kernel or mla_decode)(x.q, x.kv_cache, x.block_table, x.cache_seqlens, x.head_dim_v, x.softmax_scale,
                        x.causal, x.kv_scale, num_splits, v_cache=x.v_cache, tree_mask=x.tree_mask, out=out, **dcp)
    assert o is out
    assert o.dtype == x.q.dtype and lse.dtype == torch.float32
    assert tuple(lse.shape) == (b, h_q, s_q)
    return o, lse


def assert_close(case: Case, out, lse, ref_out, ref_lse, what: str = ""):
    tol = tolerance_for(case.dtype, case.kv_dtype)
    results = [check_close(f"{what}out", out, ref_out, tol.out), check_close(f"{what}lse", lse, ref_lse, tol.lse)]
    bad = [r.message for r in results if not r.ok]
    assert not bad, f"{case.id} (seed {case.seed}): " + " | ".join(bad)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), f"{case.id}: NaN in the result"
    return results


# --------------------------------------------------------------------------- kernel vs reference


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.id)
def test_mla_decode_matches_reference(case: Case):
    x = case.inputs()
    out, lse = run_kernel(x, case.num_splits)
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    assert_close(case, out, lse, ref_out, ref_lse)
    empty = (x.cache_seqlens == 0).cpu()
    assert (out.cpu()[empty] == 0).all() and torch.isneginf(lse.cpu()[empty]).all(), "empty request: out 0, lse -inf"


@pytest.mark.parametrize("case", DCP_CASES, ids=lambda c: c.id)
def test_mla_decode_dcp_ranks(case: Case):
    """Each rank masks by global positions g(j); the LSE merge of all ranks equals the unsharded reference."""
    x = case.inputs()
    world, interleave = case.dcp
    shards = gen_dcp_shards(x, world, interleave, seed=case.seed)
    outs, lses = [], []
    for shard in shards:
        dcp = dict(dcp_rank=shard.rank, dcp_world_size=world, dcp_interleave=interleave,
                   global_seqlens=shard.global_seqlens.to(DEVICE))
        out, lse = run_kernel(shard.inputs, case.num_splits, **dcp)
        local = shard.inputs
        ref_out, ref_lse = ref_kernel(local.q, local.kv_cache, local.block_table, local.cache_seqlens,
                                      local.head_dim_v, local.softmax_scale, local.causal, local.kv_scale,
                                      v_cache=local.v_cache, tree_mask=local.tree_mask, **dcp)
        assert_close(case, out, lse, ref_out, ref_lse, what=f"rank{shard.rank}.")
        outs.append(out)
        lses.append(lse)
    merged_out, merged_lse = merge_attention_states(outs, lses)
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    assert_close(case, merged_out, merged_lse, ref_out, ref_lse, what="merged.")


def test_dcp_positions_by_hand():
    """Rank 1 of 2 with interleave 2 holds global tokens 2,3,6,7,10 of an 11-token request: listed by hand."""
    g = gen_generator(seed_of("dcp-by-hand"))
    s_q, h_q, d_qk, d_v, total = 3, 16, 80, 64, 11
    key_pos = torch.tensor([2, 3, 6, 7, 10])
    q = gen_uniform_values((1, s_q, h_q, d_qk), g)  # [1, s_q, h_q, d_qk]
    k = gen_uniform_values((len(key_pos), 1, d_qk), g)  # [5, 1, d_qk]
    kv_cache = torch.full((3, 2, 1, d_qk), math.nan)  # 3 pages of 2 slots; slot 1 of page 0 stays NaN
    kv_cache[2], kv_cache[1], kv_cache[0, 0] = k[0:2], k[2:4], k[4]
    block_table = torch.tensor([[2, 1, 0, 1 << 30]], dtype=torch.int32)
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)  # draft 2 does not see draft 1
    for tree_mask in (None, tree):
        mask = None if tree_mask is None else tree_mask.to(DEVICE)
        out, lse = mla_decode(q.to(DEVICE), kv_cache.to(DEVICE), block_table.to(DEVICE),
                              torch.tensor([5], dtype=torch.int32, device=DEVICE), d_v, tree_mask=mask,
                              dcp_rank=1, dcp_world_size=2, dcp_interleave=2,
                              global_seqlens=torch.tensor([total], dtype=torch.int32, device=DEVICE))
        ref_out, ref_lse = ref_attend(q[0].double(), k.double(), k[..., :d_v].double(), key_pos, total,
                                      1 / math.sqrt(d_qk), True, None if tree_mask is None else tree[0])
        tol = TOLERANCES["fp32"]
        for r in (check_close("out", out[0], ref_out, tol.out), check_close("lse", lse[0], ref_lse, tol.lse)):
            assert r.ok, f"tree={tree_mask is not None}: {r.message}"
    # the first query sits at position 8: it must see 2, 3, 6, 7 and not 10 (draft 2, hidden by the tree too)
    masked_out, _ = ref_attend(q[0, :1].double(), k[:4].double(), k[:4, :, :d_v].double(), key_pos[:4], total - 2,
                               1 / math.sqrt(d_qk))
    assert torch.allclose(out[0, :1].cpu().double(), masked_out, atol=1e-5)


def test_num_splits_agree():
    """One split (no stage 2) and many splits give the same answer up to fp32 rounding."""
    case = Case(seqlens=(257, 64, 2), s_q=2, h_q=20, d_qk=80, d_v=64, page_size=32, dtype="fp32")
    x = case.inputs()
    base_out, base_lse = run_kernel(x, 1)
    for splits in (2, 5, 12):
        out, lse = run_kernel(x, splits)
        torch.testing.assert_close(out, base_out, atol=2e-6, rtol=1e-5, msg=lambda m: f"splits={splits}: {m}")
        torch.testing.assert_close(lse, base_lse, atol=2e-6, rtol=1e-6, msg=lambda m: f"splits={splits}: {m}")


def test_out_none_and_return_lse_false():
    case = Case(seqlens=(20, 3), s_q=1, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="bf16")
    x = case.inputs()
    out = mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, x.head_dim_v, x.softmax_scale,
                     return_lse=False)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 1, 16, 64) and out.dtype == torch.bfloat16
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    assert check_close("out", out, ref_out, TOLERANCES["bf16"].out).ok


def test_nan_in_unused_pages_and_slots_does_not_leak():
    """Overwrite every slot that is not a live token (and the q of nothing) with NaN / inf: result unchanged."""
    case = Case(seqlens=(17, 0, 33), s_q=1, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp32", num_splits=3)
    x = case.inputs()
    out1, lse1 = run_kernel(x)
    live = torch.zeros(x.kv_cache.shape[:2], dtype=torch.bool)
    for i, n in enumerate(x.cache_seqlens.tolist()):
        for t in range(n):
            live[int(x.block_table[i, t // 16]), t % 16] = True
    kv = x.kv_cache.clone()
    kv[~live.to(kv.device)] = math.inf
    out2, lse2 = run_kernel(dataclasses.replace(x, kv_cache=kv))
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


# --------------------------------------------------------------------------- the harness catches a broken kernel


def causal_off_by_one(q, kv_cache, block_table, cache_seqlens, *args, **kwargs):
    """Every query also sees the next position: the kernel told the request is one token longer."""
    return mla_decode(q, kv_cache, block_table, cache_seqlens, *args, global_seqlens=cache_seqlens + 1, **kwargs)


def rope_tail_dropped(q, kv_cache, block_table, cache_seqlens, head_dim_v, *args, **kwargs):
    """Scores without the rope part of the head dim (the kernel sees zeros there)."""
    q = q.clone()
    q[..., head_dim_v:] = 0
    return mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, *args, **kwargs)


@pytest.mark.parametrize("fault,case", [
    (causal_off_by_one, Case(seqlens=(9, 40), s_q=4, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="bf16")),
    (rope_tail_dropped, Case(seqlens=(9, 40), s_q=1, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="bf16")),
], ids=["causal-off-by-one", "rope-tail-dropped"])
def test_broken_kernel_is_caught(fault, case):
    x = case.inputs()
    ref_out, ref_lse = ref_mla_decode(**x.ref_args())
    tol = tolerance_for(case.dtype)
    out, lse = run_kernel(x, kernel=fault)
    results = [check_close("out", out, ref_out, tol.out), check_close("lse", lse, ref_lse, tol.lse)]
    assert not all(r.ok for r in results), f"{fault.__name__} went unnoticed by check_close"
    out, lse = run_kernel(x)
    assert_close(case, out, lse, ref_out, ref_lse)


# --------------------------------------------------------------------------- validation


def _base_args():
    x = Case(seqlens=(20, 3), s_q=2, h_q=4, d_qk=80, d_v=64, page_size=16, dtype="fp32").inputs()
    return dict(q=x.q, kv_cache=x.kv_cache, block_table=x.block_table, cache_seqlens=x.cache_seqlens,
                head_dim_v=x.head_dim_v)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


BAD_ARGS = [  # (id, change to the base kwargs, regex the ValueError must match)
    ("q-3d", lambda a: a.update(q=a["q"][0]), r"q must be a 4-D"),
    ("q-int", lambda a: a.update(q=a["q"].to(torch.int32)), r"q dtype"),
    ("kv-dtype", lambda a: a.update(kv_cache=a["kv_cache"].half()), r"kv_cache dtype"),
    ("kv-dim", lambda a: a.update(kv_cache=a["kv_cache"][..., :72]), r"kv_cache head dim 72 != q head dim 80"),
    ("fp8-no-scale", lambda a: a.update(kv_cache=a["kv_cache"].to(torch.float8_e4m3fn)), r"kv_scale is required"),
    ("bad-scale", lambda a: a.update(kv_scale=-1.0), r"kv_scale must be a positive"),
    ("bt-int64", lambda a: a.update(block_table=a["block_table"].long()), r"block_table dtype"),
    ("seqlens-int64", lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), r"cache_seqlens dtype"),
    ("seqlens-b", lambda a: a.update(cache_seqlens=_i32(20)), r"must have b = 2 rows"),
    ("hq-not-multiple", lambda a: a.update(kv_cache=a["kv_cache"].expand(-1, -1, 3, -1)), r"h_q \(4\).*h_kv \(3\)"),
    ("dv-too-big", lambda a: a.update(head_dim_v=96), r"head_dim_v \(96\) must be <= .* \(80\)"),
    ("dv-zero", lambda a: a.update(head_dim_v=0), r"head_dim_v must be >= 1"),
    ("v-cache-shape", lambda a: a.update(v_cache=a["kv_cache"][..., :32]), r"v_cache shape"),
    ("bt-narrow", lambda a: a.update(block_table=a["block_table"][:, :1]), r"block_table has 1 columns"),
    ("page-out-of-range", lambda a: a["block_table"].__setitem__((0, 1), 10_000), r"block_table\[0, 1\] = 10000"),
    ("seqlen-negative", lambda a: a.update(cache_seqlens=_i32(20, -1)), r"cache_seqlens must be >= 0"),
    ("sq-gt-seqlen", lambda a: a.update(cache_seqlens=_i32(20, 1)), r"s_q=2 .* request 1 has 1"),
    ("tree-noncausal", lambda a: a.update(tree_mask=torch.ones(2, 2, 2, dtype=torch.bool, device=DEVICE),
                                          causal=False), r"tree_mask needs causal=True"),
    ("tree-shape", lambda a: a.update(tree_mask=torch.ones(2, 3, 3, dtype=torch.bool, device=DEVICE)),
     r"tree_mask shape \(2, 3, 3\)"),
    ("tree-diagonal", lambda a: a.update(tree_mask=torch.zeros(2, 2, 2, dtype=torch.bool, device=DEVICE)),
     r"tree_mask diagonal"),
    ("dcp-rank", lambda a: a.update(dcp_rank=2, dcp_world_size=2, global_seqlens=_i32(40, 6)), r"dcp_rank \(2\)"),
    ("dcp-no-global", lambda a: a.update(dcp_world_size=2), r"global_seqlens is required"),
    ("dcp-too-many-local", lambda a: a.update(dcp_world_size=2, global_seqlens=_i32(30, 6)),
     r"cache_seqlens\[0\] = 20 .* global_seqlens\[0\] = 30"),
    ("splits-zero", lambda a: a.update(num_splits=0), r"num_splits must be >= 1"),
    ("out-shape", lambda a: a.update(out=torch.empty(2, 2, 4, 80, device=DEVICE)), r"out must be"),
    ("out-dtype", lambda a: a.update(out=torch.empty(2, 2, 4, 64, dtype=torch.half, device=DEVICE)), r"out must be"),
]


@pytest.mark.parametrize("change,match", [(c, m) for _, c, m in BAD_ARGS], ids=[i for i, _, _ in BAD_ARGS])
def test_mla_decode_rejects(change, match):
    args = _base_args()
    change(args)
    with pytest.raises(ValueError, match=match):
        mla_decode(**args)


def test_tree_mask_needs_at_most_64_queries():
    x = Case(seqlens=(70,), s_q=65, h_q=1, d_qk=32, d_v=32, page_size=16, dtype="fp32").inputs()
    tree = torch.eye(65, dtype=torch.bool, device=DEVICE)[None]
    with pytest.raises(ValueError, match=r"s_q <= 64, got s_q=65"):
        mla_decode(x.q, x.kv_cache, x.block_table, x.cache_seqlens, 32, tree_mask=tree)


# --------------------------------------------------------------------------- merge_attention_states


MERGE_CASES = [
    (parts, shape, dtype)
    for parts, shape, dtype in [
        (1, (2, 1, 16, 64), "fp32"), (2, (3, 2, 16, 512), "bf16"), (5, (2, 4, 3, 64), "fp16"),
        (8, (1, 1, 128, 32), "fp32"), (3, (4, 13, 20, 16), "bf16"),
    ]
]


@pytest.mark.parametrize("parts,shape,dtype", MERGE_CASES,
                         ids=[f"r{p}-{'x'.join(map(str, s))}-{d}" for p, s, d in MERGE_CASES])
def test_merge_attention_states(parts, shape, dtype):
    name = f"merge-{parts}-{shape}-{dtype}"
    g = gen_generator(seed_of(name))
    b, s_q, h, d_v = shape
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    outs = [gen_uniform_values(shape, g).mul(10).to(torch_dtype) for _ in range(parts)]
    lses = [torch.randn(b, h, s_q, generator=g) * 3 for _ in range(parts)]
    for o, l in zip(outs, lses):
        dead = torch.rand(b, h, s_q, generator=g) < 0.1  # ~10% empty partials, their out is NaN
        l[dead] = -math.inf
        o[dead.permute(0, 2, 1)] = math.nan
    lses[0][0, 0, 0] = -math.inf  # one row empty in every partial
    for o, l in zip(outs, lses):
        l[0, 0, 0] = -math.inf
        o[0, 0, 0] = math.nan
    outs = [o.to(DEVICE) for o in outs]
    lses = [l.to(DEVICE) for l in lses]

    ref_out, ref_lse = ref_merge(outs, lses)
    tol = TOLERANCES[dtype]
    for impl in (merge_attention_states, merge_attention_states_torch):
        out, lse = impl(outs, lses)
        assert out.dtype == torch_dtype and lse.dtype == torch.float32
        for r in (check_close("out", out, ref_out, tol.out), check_close("lse", lse, ref_lse, tol.lse)):
            assert r.ok, f"{impl.__name__} {name} (seed {seed_of(name)}): {r.message}"
        assert (out[0, 0, 0] == 0).all() and torch.isneginf(lse[0, 0, 0])


def test_merge_attention_states_rejects():
    o = torch.zeros(2, 1, 4, 8, device=DEVICE)
    l = torch.zeros(2, 4, 1, device=DEVICE)
    with pytest.raises(ValueError, match="equal length"):
        merge_attention_states([o, o], [l])
    with pytest.raises(ValueError, match=r"lses\[0\] must be"):
        merge_attention_states([o], [l.transpose(1, 2)])


# --------------------------------------------------------------------------- mode and heuristics


def test_mode_and_lazy_import():
    from pytest_mla.kernels import _mode

    assert _mode.is_interpreter() == (MODE == "interpreter")
    code = ("import sys, pytest_mla.kernels as k; assert 'torch' not in sys.modules and 'triton' not in sys.modules; "
            "f = k.mla_decode; assert 'triton' in sys.modules; print(k.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the subprocess decides again
    subprocess.run([sys.executable, "-c", code], check=True, env=env,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_default_num_splits():
    assert default_num_splits(2, 16, 300, interpreter=True) == 1
    big = default_num_splits(128, 16, 8192, num_sms=132, interpreter=False)
    assert 2 <= big <= 8  # b=128 already gives one program per SM; a little splitting helps occupancy
    assert default_num_splits(1, 16, 8192, num_sms=132, interpreter=False) >= 64  # one request: split the length
    assert default_num_splits(1, 16, 10, num_sms=132, interpreter=False) == 1  # never less than a tile per split
    assert default_num_splits(0, 16, 0, interpreter=False) == 1


def test_strided_views():
    """q, caches, block table and out as non-contiguous views: the kernel honours every stride."""
    case = Case(seqlens=(40, 9), s_q=2, h_q=16, d_qk=80, d_v=64, page_size=16, dtype="fp16", num_splits=2)
    x = case.inputs()
    b, s_q, h_q, d_qk = x.q.shape
    q_big = torch.full((b, s_q, h_q, 2 * d_qk), math.nan, dtype=x.q.dtype, device=DEVICE)
    q_big[..., ::2] = x.q
    kv_big = torch.full((*x.kv_cache.shape[:3], d_qk + 16), math.nan, dtype=x.kv_cache.dtype, device=DEVICE)
    kv_big[..., 16:] = x.kv_cache
    table_big = torch.full((x.block_table.shape[1], b), 1 << 30, dtype=torch.int32, device=DEVICE)
    table_big[:] = x.block_table.T
    out_big = torch.full((b, h_q, s_q, 64 + 8), math.nan, dtype=x.q.dtype, device=DEVICE)
    out = out_big[..., :64].transpose(1, 2)  # [b, s_q, h_q, d_v], strided
    strided = dataclasses.replace(x, q=q_big[..., ::2], kv_cache=kv_big[..., 16:], block_table=table_big.T)
    o, lse = mla_decode(strided.q, strided.kv_cache, strided.block_table, x.cache_seqlens, 64, x.softmax_scale,
                        num_splits=2, out=out)
    assert o is out and torch.isnan(out_big[..., 64:]).all(), "wrote outside the out view"
    assert_close(case, o, lse, *ref_mla_decode(**x.ref_args()))


_AOT_SCRIPT = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "0"  # real JIT functions: compile for a GPU target without a GPU
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pytest_mla.kernels import triton_mla as m

target = GPUTarget("cuda", 90, 32)

def stage1(qdt, kvdt, cfg, **flags):
    names = m._mla_decode_stage1_kernel.arg_names
    ptrs = dict(q_ptr="*" + qdt, k_ptr="*" + kvdt, v_ptr="*" + kvdt, block_table_ptr="*i32",
                cache_seqlens_ptr="*i32", global_seqlens_ptr="*i32", tree_bits_ptr="*i64", o_ptr="*" + qdt,
                lse_ptr="*fp32")
    consts = dict(PAGE_SIZE=64, BLOCK_DV=512, BLOCK_DT=64, HAS_TAIL=True, SHARED_KV=True, CAUSAL=True,
                  HAS_TREE=False, HAS_DCP=False, HAS_GLOBAL_SEQLENS=False, UPCAST=False, DOT_PRECISION="ieee",
                  BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"])
    consts.update(flags)
    sig = {n: ptrs.get(n) or ("constexpr" if n in consts else "fp32" if n in ("qk_scale_log2", "v_scale") else "i32")
           for n in names}
    src = ASTSource(m._mla_decode_stage1_kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    triton.compile(src, target=target, options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))

mla16, mla128 = m._stage1_config(16, 512, False), m._stage1_config(128, 512, False)
stage1("bf16", "bf16", mla16)
stage1("bf16", "fp8e4nv", mla128, HAS_TREE=True, HAS_DCP=True, HAS_GLOBAL_SEQLENS=True, PAGE_SIZE=1)
stage1("fp32", "fp32", m._stage1_config(8, 128, False), BLOCK_DV=128, BLOCK_DT=16, HAS_TAIL=False, SHARED_KV=False)
names = m._merge_states_kernel.arg_names
sig = {n: ("*fp32" if n.endswith("ptr") else "constexpr" if n.startswith("BLOCK") else "i32") for n in names}
sig["o_ptr"] = "*bf16"
triton.compile(ASTSource(m._merge_states_kernel, sig, constexprs={(names.index("BLOCK_R"),): 8,
                                                                 (names.index("BLOCK_DV"),): 512}),
               target=target, options=dict(num_warps=4))
print("compiled")
'''


@pytest.mark.skipif(MODE != "interpreter", reason="the GPU run covers the compiled path")
def test_gpu_path_compiles_for_sm90():
    """The non-interpreter path (bf16/fp8 tl.dot operands, launch configs) compiles for sm90 without a GPU."""
    nvidia = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia")
    if not os.path.isdir(nvidia):
        pytest.skip("triton has no nvidia backend here")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
