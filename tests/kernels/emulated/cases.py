"""Inputs and checks of the emulation tests: seeded MLA inputs from ``kernels/inputs.py`` and the float64 reference.

Every expectation comes from ``reference.ref_mla_decode`` (natural-log LSE,
``-inf`` where nothing is visible, causal aligned bottom-right), never from
the emulations' own glue.
"""

from __future__ import annotations

import math

import torch

from pytest_mla.kernels.compare import TOLERANCES, Tolerance, check_close
from pytest_mla.kernels.inputs import UNUSED_PAGE, gen_decode_inputs
from pytest_mla.kernels.reference import ref_mla_decode

D_QK, D_V = 576, 512
TOL = TOLERANCES["bf16"].out
#: The emulations compute in float64 and round once to the output dtype: bf16 half-ulp plus the fp32 LSE.
LSE_TOL = Tolerance(abs=1e-5, rel=1e-6)
LOG2E = 1.0 / math.log(2.0)


def make_case(seqlens, *, s_q=1, h_q=16, page_size=64, dtype="bf16", kv_dtype="auto", kv_scale=None, seed=0):
    """Seeded MLA decode inputs (NaN past every length, shuffled block table, ``UNUSED_PAGE`` past the last page)."""
    return gen_decode_inputs(seqlens, s_q=s_q, h_q=h_q, d_qk=D_QK, d_v=D_V, page_size=page_size, dtype=dtype,
                             kv_dtype=kv_dtype, kv_scale=kv_scale, seed=seed)


def reference(case, *, causal=True):
    """``(out [b, s_q, h, 512], lse [b, h, s_q])`` float64, natural log, ``-inf`` where nothing is visible."""
    args = case.ref_args()
    args["causal"] = causal
    return ref_mla_decode(**args)


def assert_close(name, ans, ref, tol=TOL):
    result = check_close(name, ans, ref, tol)
    assert result.ok, result.message


def poisoned(shape, dtype):
    return torch.full(shape, math.nan, dtype=dtype)


__all__ = ["D_QK", "D_V", "LOG2E", "LSE_TOL", "TOL", "UNUSED_PAGE", "assert_close", "make_case", "poisoned",
           "reference"]


def dense_rows(case, i):
    """Request ``i``'s cached rows ``[n, 1, 576]`` as stored (read through the block table)."""
    n = int(case.cache_seqlens[i])
    ps = case.kv_cache.shape[1]
    pages = case.block_table[i, : -(-n // ps)].long()
    return case.kv_cache[pages].reshape(-1, *case.kv_cache.shape[2:])[:n]


def rank_cache(case, rank, world, page_size, seed=1):
    """Rank ``rank``'s cyclic DCP shard of ``case``: ``(cache, block_table, local_lens)`` (global token ``t`` on rank ``t % world``)."""
    from pytest_mla.kernels.inputs import gen_generator, gen_paged_cache

    rows = [dense_rows(case, i)[rank::world] for i in range(case.q.shape[0])]
    sample = case.kv_cache
    fill = [r if r.shape[0] else torch.empty(0, *sample.shape[2:], dtype=sample.dtype) for r in rows]
    cache, _, table = gen_paged_cache([r.to(torch.float32) for r in fill], page_size, gen_generator(seed + rank))
    cache = cache.to(sample.dtype)
    lens = torch.tensor([r.shape[0] for r in rows], dtype=torch.int32)
    return cache, table, lens


def natural_with(lse, empty):
    """The reference's natural-log LSE with its ``-inf`` (nothing visible) replaced by a library's ``empty`` value."""
    return torch.where(torch.isneginf(lse), empty, lse)
