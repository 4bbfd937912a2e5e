"""A tiny stand-in engine with its own DCP layout, attention and cross-rank merge.

It plays the part of SGLang or vLLM for the engine-check plumbing tests:
its layout is not ours (rank ``r`` keeps the tokens ``t % N == r`` as dense
rows), it computes in float32 with plain torch, and it merges the ranks the
way SGLang's ``cp_lse_ag_out_rs`` does: all-gather the LSEs, scale its own
partial, all-reduce, keep its own slice of heads. ``options`` select faults:
``merge="average"`` ignores the LSEs; ``raise_in="decode"`` raises inside
this "engine package" (``raise_in="cache-write"``: in its write of the cached tokens, before the decode); ``positions="local"`` masks by local positions; ``scratch="unwritten"`` combines a
partial output it allocated and never wrote with weight 0 (verify_splitkv's skipped splits);
``tail="unmasked"`` reads the value rows of a request's whole last page, free slots included, with
probability 0 (the shape of vLLM's XPU tensor-descriptor load: right on a zeroed cache, NaN on a poisoned one);
``tail="weighted"`` gives them weight 0.5 (wrong on any cache). ``splits_from=N`` gives it a split-KV
schedule: a request of which the rank holds at least N cached tokens is computed in 2 splits, fewer in 1, and the counts are
recorded (``RankResult.schedule``); ``split_merge="drop_last"`` then merges the splits without the last.
"""

from __future__ import annotations

import math

import torch

from pytest_mla.kernels.engine_check import RankResult

PACKAGE = __name__


def _dense(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    page = cache.shape[1]
    pages = table_row[: -(-n // page)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def decode_rank(q, rows, d_v, positions, seqlen, scale, tree_mask, raise_in):
    """Attention of one request over this rank's rows: ``(out [s_q, h, d_v], lse [h, s_q])``."""
    if raise_in == "decode":
        raise ValueError("too many values to unpack (expected 2)")
    if raise_in == "emulation":  # an emulated kernel the engine calls, asked for what it does not model
        from pytest_mla.kernels.emulated.glue import OutOfContractError

        raise OutOfContractError("page_size", "16: the kernel supports pages of 64 tokens only")
    if raise_in == "stub":  # a function of a library this host lacks, answered by an import stub
        from pytest_mla.engines.common.import_stubs import StubModule

        out, lse = StubModule("flashinfer_stand_in").trtllm_ragged_attention_deepseek(rows, q)
    if raise_in == "out-of-range":  # the engine handed an emulated kernel a page id outside the cache
        from pytest_mla.kernels.emulated.glue import OutOfRangeRead

        raise OutOfRangeRead("block_table", "index 77 at 3 is outside [0, 12)")
    s_q = q.shape[0]
    k = rows.float()  # [n, 1, d_qk]
    v = k[..., :d_v]  # MLA: V is the first d_v columns of the latent row
    scores = torch.einsum("ihd,jd->hij", q.float(), k[:, 0]) * scale  # [h, s_q, n]
    first = seqlen - s_q
    q_pos = first + torch.arange(s_q, device=positions.device)
    if tree_mask is not None:
        draft = positions - first
        visible = (draft < 0)[None, :] | tree_mask[:, draft.clamp(0, s_q - 1)]
    else:
        visible = positions[None, :] <= q_pos[:, None]
    scores = scores.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(scores, -1)  # [h, s_q]
    probs = torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return torch.einsum("hij,jd->ihd", probs, v[:, 0]), lse


def merge(out, lse, collectives, how):
    """SGLang-style: all-gather LSE, rescale, all-reduce the output (``how="average"`` is the fault)."""
    lses = torch.stack(collectives.all_gather(lse))  # [N, b, h, s_q]
    if how == "average":
        total = collectives.all_reduce(torch.nan_to_num(out)) / collectives.world
        return total, torch.logsumexp(lses, 0)
    glob = torch.logsumexp(lses, 0)
    w = torch.exp(lse - torch.where(torch.isneginf(glob), 0.0, glob))  # [b, h, s_q]
    mine = torch.where(w.permute(0, 2, 1)[..., None] > 0, w.permute(0, 2, 1)[..., None] * out, 0.0)
    return collectives.all_reduce(mine), glob


def write_cache(raise_in):
    """The engine's own write of the cached tokens, which a runner makes before the decode under test."""
    if raise_in == "cache-write":
        raise IndexError("index 41 is out of bounds for dimension 0 with size 26")


def run(inputs, ctx, options):
    from pytest_mla.core.records import CACHE_WRITE_STEP
    from pytest_mla.kernels.engine_runner import engine_step

    with engine_step(CACHE_WRITE_STEP):  # as SGLang's runner writes the cached tokens through the pool
        write_cache(options.get("raise_in"))
    b, s_q, h, _ = inputs.q.shape
    world, rank = ctx.world, ctx.rank
    device = inputs.q.device  # the harness moves the inputs to the GPU where there is one
    out = torch.zeros(b, s_q, h, inputs.head_dim_v, device=device)
    lse = torch.full((b, h, s_q), -math.inf, device=device)
    splits_from, splits_seen = options.get("splits_from"), set()
    for i in range(b):
        n = int(inputs.cache_seqlens[i])
        mine = torch.arange(n, device=device)[torch.arange(n, device=device) % world == rank]
        splits = 2 if splits_from and len(mine) >= splits_from else 1  # per rank, as vLLM's threshold
        splits_seen.add(splits)
        if splits > 1 and options.get("split_merge") == "drop_last":  # the second half's partial left out
            mine = mine[mine < -(-n // 2)]
        rows = _dense(inputs.kv_cache, inputs.block_table[i], n)[mine]
        if inputs.kv_scale is not None:
            rows = rows.float() * inputs.kv_scale
        positions = mine if options.get("positions") != "local" else torch.arange(len(mine), device=device)
        seqlen = n if options.get("positions") != "local" else len(mine)
        mask = inputs.tree_mask[i] if inputs.tree_mask is not None else None
        out[i], lse[i] = decode_rank(inputs.q[i], rows, inputs.head_dim_v, positions, seqlen, inputs.softmax_scale, mask,
                                     options.get("raise_in"))
        if options.get("tail") in ("unmasked", "weighted") and world == 1:  # P times the free slots' V rows
            page = inputs.kv_cache.shape[1]
            tail = _dense(inputs.kv_cache, inputs.block_table[i], -(-n // page) * page)[n:, 0, :inputs.head_dim_v]
            weight = 0.0 if options["tail"] == "unmasked" else 0.5  # "weighted": a wrong answer on any cache
            p = torch.full((s_q, h, tail.shape[0]), weight, device=device)  # each free slot's probability
            out[i] = (1 - weight * bool(tail.shape[0])) * out[i] + torch.einsum("ihj,jd->ihd", p, tail.float())
    if options.get("scratch") == "unwritten":  # a skipped split's partial, weight 0: 0 x whatever memory holds
        skipped = torch.empty_like(out)
        out = out + 0.0 * skipped
    if world > 1:
        out, lse = merge(out, lse, ctx.collectives, options.get("merge", "lse"))
    per = h // world
    heads = (rank * per, (rank + 1) * per) if world > 1 else None
    if heads is not None:
        out, lse = out[:, :, heads[0]:heads[1]], lse[:, heads[0]:heads[1]]
    functions = (f"{PACKAGE}:decode_rank",) + ((f"{PACKAGE}:merge",) if world > 1 else ())
    schedule = {"num_kv_splits": tuple(sorted(splits_seen))} if splits_from else {}
    return RankResult(out.to(inputs.q.dtype), lse, heads, functions, schedule=schedule)
