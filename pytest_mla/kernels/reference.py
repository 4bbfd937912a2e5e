"""Float64 references for MLA / GQA decode and the LSE merge (plain torch).

Conventions shared with ``triton_mla.mla_decode``:

* ``lse`` is the natural-log log-sum-exp of the scaled scores, ``[b, h_q, s_q]``.
* A query with nothing to attend (empty sequence, empty DCP rank, causal window
  before the first token) gets ``out = 0`` and ``lse = -inf`` on purpose, never
  NaN, so that an LSE merge drops it. (FlashMLA returns ``lse = +inf`` there;
  we use ``-inf`` because it is the identity of ``logsumexp``.)
* Masking: query ``i`` of a request with ``S`` tokens sits at position
  ``S - s_q + i``. Causal: key ``g`` is visible iff ``g <= S - s_q + i``. With a
  ``tree_mask [b, s_q, s_q]`` the keys ``g >= S - s_q`` are draft tokens
  ``t = g - (S - s_q)``, visible iff ``tree_mask[b, i, t]``; the prefix is
  always visible (the tree mask replaces the causal rule).
* Sparse attention: ``topk_indices [b, s_q, K]`` (request-relative positions,
  ``-1`` = none, in any order) restricts each query token to the tokens it
  names, within the mask above; an index outside ``[-1, S)`` raises.

``ref_mla_decode`` reads an unsharded paged cache. ``ref_kernel`` is a float64
stand-in with the kernel's full signature (DCP positions included), used to
test plumbing (sharding, merging, multi-process exchange) without Triton.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ref_attend", "ref_gather", "ref_kernel", "ref_merge", "ref_mla_decode", "ref_global_positions"]


def ref_gather(cache: torch.Tensor, block_table_row: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Dense rows of one request: ``[num_tokens, h, d]`` from a paged ``[pages, page_size, h, d]`` cache.

    Reads only the pages that hold the first ``num_tokens`` tokens, so the
    huge indices in unused block-table entries are never touched.
    """
    page_size = cache.shape[1]
    num_pages = -(-num_tokens // page_size)
    pages = block_table_row[:num_pages].long()
    return cache[pages].reshape(num_pages * page_size, *cache.shape[2:])[:num_tokens]


def _dequant(x: torch.Tensor, kv_scale: float | None) -> torch.Tensor:
    x = x.to(torch.float64)
    return x * float(kv_scale) if kv_scale is not None else x


def ref_global_positions(num_local: int, rank: int, world: int, interleave: int) -> torch.Tensor:
    """Global position of each local token on a DCP rank: ``(j//I)*(N*I) + r*I + j%I``."""
    j = torch.arange(num_local, dtype=torch.int64)
    return (j // interleave) * (world * interleave) + rank * interleave + (j % interleave)


def ref_attend(
    q: torch.Tensor,  # [s_q, h_q, d_qk] float64
    k: torch.Tensor,  # [s_k, h_kv, d_qk] float64
    v: torch.Tensor,  # [s_k, h_kv, d_v] float64
    key_pos: torch.Tensor,  # [s_k] int64 global position of each key
    seqlen: int,  # S: global length of the request (queries sit at S - s_q + i)
    softmax_scale: float,
    causal: bool = True,
    tree_mask: torch.Tensor | None = None,  # [s_q, s_q] bool
    topk_indices: torch.Tensor | None = None,  # [s_q, K] request-relative positions each query attends, -1 = none
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one request over explicit keys: ``(out [s_q, h_q, d_v], lse [h_q, s_q])``.

    ``topk_indices``: a sparse selection; query ``i`` attends only the keys whose position it names.
    """
    s_q, h_q, _ = q.shape
    s_k, h_kv, d_v = v.shape
    group = h_q // h_kv
    k_h = k.repeat_interleave(group, dim=1)  # [s_k, h_q, d_qk]
    v_h = v.repeat_interleave(group, dim=1)  # [s_k, h_q, d_v]
    scores = torch.einsum("ihd,jhd->hij", q, k_h) * softmax_scale  # [h_q, s_q, s_k]

    first_draft = seqlen - s_q
    q_pos = first_draft + torch.arange(s_q, dtype=torch.int64)  # [s_q]
    if tree_mask is not None:
        draft = key_pos - first_draft  # [s_k]; < 0 for the prefix
        is_prefix = draft < 0
        tree_vis = tree_mask.to(torch.bool)[:, draft.clamp(min=0, max=s_q - 1)]  # [s_q, s_k]
        visible = is_prefix[None, :] | tree_vis
    elif causal:
        visible = key_pos[None, :] <= q_pos[:, None]  # [s_q, s_k]
    else:
        visible = torch.ones(s_q, s_k, dtype=torch.bool)
    visible = visible & (key_pos < seqlen)[None, :]
    if topk_indices is not None:
        chosen = topk_indices.to(torch.int64)
        bad = (chosen < -1) | (chosen >= seqlen)
        if bool(bad.any()):
            raise ValueError(f"top-k index {int(chosen[bad][0])} out of range for a request of {seqlen} tokens")
        visible = visible & (key_pos[None, :, None] == chosen[:, None, :]).any(-1)  # -1 names no key

    scores = scores.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # [h_q, s_q]; -inf where nothing is visible
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])  # exp(-inf) = 0 for empty rows
    out = torch.einsum("hij,jhd->ihd", probs, v_h)  # [s_q, h_q, d_v]
    return out, lse


def _ref_paged(
    q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale, v_cache, tree_mask,
    positions_of, global_seqlens, topk_indices=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The reference computes on the CPU in float64 whatever device the inputs are on (a GPU test passes
    # CUDA tensors) and answers on the inputs' device.
    device = q.device

    def host(t):
        return t.cpu() if isinstance(t, torch.Tensor) else t

    q, kv_cache, block_table, cache_seqlens, v_cache, tree_mask, global_seqlens, topk_indices = map(
        host, (q, kv_cache, block_table, cache_seqlens, v_cache, tree_mask, global_seqlens, topk_indices))
    out, lse = _ref_paged_host(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale,
                               v_cache, tree_mask, positions_of, global_seqlens, topk_indices)
    return out.to(device), lse.to(device)


def _ref_paged_host(
    q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale, v_cache, tree_mask,
    positions_of, global_seqlens, topk_indices=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q, d_qk = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d_qk)
    out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float64)  # [b, s_q, h_q, d_v]
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64)  # [b, h_q, s_q]
    for i in range(b):
        n = int(cache_seqlens[i])
        k = _dequant(ref_gather(kv_cache, block_table[i], n), kv_scale)  # [n, h_kv, d_qk]
        if v_cache is None:
            v = k[..., :head_dim_v]  # MLA: V is the first d_v columns of the latent row
        else:
            v = _dequant(ref_gather(v_cache, block_table[i], n), kv_scale)  # [n, h_kv, d_v]
        seqlen = int(global_seqlens[i]) if global_seqlens is not None else n
        mask = tree_mask[i] if tree_mask is not None else None
        out[i], lse[i] = ref_attend(
            q[i].to(torch.float64), k, v, positions_of(n), seqlen, scale, causal, mask,
            topk_indices[i] if topk_indices is not None else None,
        )
    return out, lse


def ref_mla_decode(
    q: torch.Tensor,  # [b, s_q, h_q, d_qk]
    kv_cache: torch.Tensor,  # [num_pages, page_size, h_kv, d_qk]
    block_table: torch.Tensor,  # [b, max_pages] int32
    cache_seqlens: torch.Tensor,  # [b] int32
    head_dim_v: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    kv_scale: float | None = None,
    v_cache: torch.Tensor | None = None,  # [num_pages, page_size, h_kv, d_v] (GQA) or None (MLA)
    tree_mask: torch.Tensor | None = None,  # [b, s_q, s_q] bool
    topk_indices: torch.Tensor | None = None,  # [b, s_q, K] int sparse selection, -1 = none
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 decode on an unsharded paged cache: ``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])``.

    An fp8 cache is dequantised with ``kv_scale`` first, so quantisation error
    is not counted against the kernel. ``topk_indices``: each query token attends
    only the tokens it selects (sparse attention; see the module docstring).
    """
    def positions(n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.int64)

    return _ref_paged(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale,
                      v_cache, tree_mask, positions, None, topk_indices)


def ref_kernel(
    q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True, kv_scale=None,
    num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None, dcp_rank=0, dcp_world_size=1,
    dcp_interleave=1, global_seqlens=None, out=None,
):
    """Float64 stand-in with ``mla_decode``'s signature (DCP-aware); returns ``q.dtype`` out, fp32 lse."""
    if dcp_world_size > 1 and global_seqlens is None:
        raise ValueError("global_seqlens is required when dcp_world_size > 1")

    def positions(n: int) -> torch.Tensor:
        return ref_global_positions(n, dcp_rank, dcp_world_size, dcp_interleave)

    o, lse = _ref_paged(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale,
                        v_cache, tree_mask, positions, global_seqlens)
    o = o.to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse.to(torch.float32)


def ref_merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE merge in float64: ``lse = logsumexp_r lse_r``, ``out = Σ_r exp(lse_r - lse) · out_r``.

    ``outs[r]`` is ``[b, s_q, h_q, d_v]``, ``lses[r]`` is ``[b, h_q, s_q]``. Partials
    with ``lse = -inf`` contribute nothing (their ``out`` is ignored even if NaN);
    all ``-inf`` gives ``out = 0``, ``lse = -inf``.
    """
    lse_all = torch.stack([x.to(torch.float64) for x in lses])  # [N, b, h_q, s_q]
    lse = torch.logsumexp(lse_all, dim=0)  # [b, h_q, s_q]
    weight = torch.exp(lse_all - torch.where(torch.isneginf(lse), 0.0, lse))  # [N, b, h_q, s_q]; 0 for -inf
    out = torch.zeros_like(outs[0], dtype=torch.float64)
    for w, o in zip(weight, outs):
        w_q = w.permute(0, 2, 1)[..., None]  # [b, s_q, h_q, 1]
        out += torch.where(w_q > 0, w_q * o.to(torch.float64), 0.0)  # NaN in dropped partials stays out
    return out, lse
