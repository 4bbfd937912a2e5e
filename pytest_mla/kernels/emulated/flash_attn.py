"""flash-attention (FA3, as sgl-kernel 0.4.10 and vLLM 0.34.0's vllm_flash_attn expose it) and sgl-kernel's merge, in float64.

Emulated callables: ``sgl_kernel.flash_attn:flash_attn_with_kvcache``,
``sgl_kernel:merge_state_v2``, ``vllm.vllm_flash_attn:flash_attn_varlen_func``
(FA2 and FA3) and FA3's ahead-of-time scheduler (``vllm.vllm_flash_attn:get_scheduler_metadata``,
``sgl_kernel.flash_attn:get_scheduler_metadata``).
The contract, all in one place:

* Scores ``softmax_scale · (q·k + qv·v)`` (``qv`` is FA3's fused second query,
  MLA passes ``q_rope`` as ``q``, the rope cache as ``k``, ``q_nope`` as ``qv``
  and the latent cache as ``v``); ``softmax_scale`` defaults to
  ``(d + dv) ** -0.5`` with ``qv``, ``d ** -0.5`` without [hopper/test_util.py
  attention_ref; sgl_kernel/flash_attn.py].
* GQA: query head ``h`` reads KV head ``h // (H / H_k)`` [flash_attn_with_kvcache doc].
* Causal is aligned bottom-right per request: query ``i`` of ``seqlen_q`` sees
  key ``j`` iff ``j <= i + seqlen_k - seqlen_q``; ``window_size = (left, right)``
  bounds ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]``;
  "If the row of the mask is all zero, the output will be zero" [docstrings;
  hopper/test_util.py construct_local_mask].
* fp8: q, k and v are all fp8 (one dtype, as FA3 requires); ``q_descale``,
  ``k_descale``, ``v_descale`` are ``[batch, H_k]`` float32, values are
  ``x · descale`` (q's and qv's by their KV head's q_descale); a missing descale
  is 1; the output is bf16 [hopper/test_util.py attention_ref].
* LSE: **natural log** of the scaled scores. FA3 writes ``-inf`` for a row that
  sees nothing (hopper/softmax.h since "Big refactor", Jan 2025), FA4 too
  (vllm_flash_attn/cute/softmax.py ``Softmax.finalize``: ``(row_max·scale_log2 +
  log2 row_sum)·ln 2``, ``-inf`` for an empty row); FA2 ``+inf``
  (the note in vLLM's and SGLang's merge kernels: "FA3 returns -inf here while
  FA2 returns inf"). Layout: ``[b, H, seqlen_q]`` for batched q,
  ``[H, total_q]`` with ``cu_seqlens_q`` [docstrings; FA4: cute/interface.py
  ``_flash_attn_fwd`` ``lse_shape``].
* ``fa_version=2``: vLLM's wrapper passes no descales to ``varlen_fwd``
  (they are dropped; all three with a ``scheduler_metadata`` raise its
  ``NotImplementedError``); ``q_v`` and context parallelism raise.
* ``fa_version=4`` (vLLM's wrapper calls FA4's ``_flash_attn_fwd``): modelled
  for bf16/fp16 inputs with the FA3 semantics above (the wrapper drops the
  descales of non-fp8 inputs); it forwards no context-parallel arguments to
  FA4, so context parallelism and fp8 are not modelled (raise). Head-dim limits are not modelled for any version (FA3 takes at
  most 256, FA4 on SM90 512): a caller's head dims are not checked.
* Paged KV: ``k_cache [num_pages, page_size, H_k, d]``, ``page_table [b, max_pages]``
  int32; only the pages holding a request's ``cache_seqlens`` / ``seqused_k``
  tokens are read, each must be a valid page id.
* ``cu_seqlens_k_new`` is read only with ``k`` / ``v`` new tokens (hopper
  flash_api.cpp mha_fwd reads it inside the ``k_new`` branch), so it is ignored
  here, where appending new tokens is not modelled.
* vLLM's context-parallel extension (``cp_world_size > 1``, FA3, causal): local
  key ``j`` is global position ``j·cp_world_size + cp_rank``; it is visible iff
  that position is ``<= i + cp_tot_seqused_k - seqlen_q`` and
  ``< cp_tot_seqused_k`` [vllm-project/flash-attention hopper/mask.h].
* ``merge_state_v2(v_a, s_a, v_b, s_b)``: ``v [tokens, H, d]``, ``s [tokens, H]``
  natural log (cast to float32); the op's shape checks are kept and raise its
  ``RuntimeError`` (``CHECK_DIM``, ``CHECK_SHAPE``, ``CHECK_EQ(v_a.size(0),
  s_a.size(0))``, ``CHECK_EQ(v_a.size(1), s_b.size(1))``): an LSE handed over in
  another layout is refused on a GPU too; any infinite LSE is treated as ``-inf``
  (``isinf(x) ? -INFINITY : x``), then ``s = log(e^{s_a-m} + e^{s_b-m}) + m`` with
  ``m = max``; **both sides empty gives NaN** (``-inf - -inf``) — the CUDA
  kernel's arithmetic, reproduced [sgl-kernel csrc merge_attn_states.cu, from
  vLLM]. ``v_merged`` keeps ``v_a``'s dtype.
* Not modelled (raise): appending ``k`` / ``v``, rotary, ``cache_batch_idx``,
  ``cache_leftpad``, non-paged ``k_cache`` in ``flash_attn_with_kvcache``,
  softcap, sinks, attention chunks, ``only_qv``, score_mod, FA4, dropout,
  alibi, ``s_aux``, mask_mod and the FA4-only arguments. ``num_splits``,
  ``pack_gqa``, ``sm_margin`` and ``scheduler_metadata`` only schedule the work
  and are not checked.
* ``get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q,
  num_heads_kv, headdim, cache_seqlens, ...)``: FA3's split schedule for a later
  call with the same shapes, an int32 tensor of ``1 + round_up(batch_size, 4) ·
  4`` entries (a tile-count semaphore, then four vectors per batch entry:
  hopper/flash_api.cpp ``mha_fwd_get_scheduler_metadata``). The emulation
  returns zeros of that size: the varlen emulation reads no schedule, so a
  stale or wrong one is not detected (see "What an emulation cannot check").

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .glue import OutOfContractError, as_float64, attend, bottom_right_visible, check_dtype, gather_pages, write_out

__all__ = ["EMULATIONS", "flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata", "merge_state_v2",
           "sgl_get_scheduler_metadata"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _descale_rows(descale: Optional[torch.Tensor], i: int, h_k: int, group: int) -> Optional[torch.Tensor]:
    """Request ``i``'s descale per query head ``[H, 1]`` (``group`` query heads per KV head), or None."""
    if descale is None:
        return None
    d = as_float64(descale)
    if d.dim() != 2 or d.shape[1] != h_k:
        raise OutOfContractError("descale", f"shape {tuple(descale.shape)}: expects [batch, {h_k}]")
    return d[i].repeat_interleave(group)[:, None]


def _attend_request(q, qv, k, v, *, seqlen_k, key_pos, causal, window, scale, descales, i, cp_bound=None):
    """One request: ``q [sq, H, d]``, ``qv [sq, H, dv]`` or None, ``k [n, H_k, d]``, ``v [n, H_k, dv]``."""
    sq, h, _ = q.shape
    n, h_k, _ = k.shape
    group = h // h_k
    qd, kd, vd = (_descale_rows(x, i, h_k, 1 if j else group) for j, x in enumerate(descales))
    q64 = as_float64(q) * (qd if qd is not None else 1.0)
    k64 = (as_float64(k) * (kd[None] if kd is not None else 1.0)).repeat_interleave(group, dim=1)  # [n, H, d]
    v64 = (as_float64(v) * (vd[None] if vd is not None else 1.0)).repeat_interleave(group, dim=1)  # [n, H, dv]
    scores = torch.einsum("qhd,nhd->hqn", q64, k64)
    if qv is not None:
        scores = scores + torch.einsum("qhd,nhd->hqn", as_float64(qv) * (qd if qd is not None else 1.0), v64)
    scores = scores * scale
    if cp_bound is not None:  # vLLM's FA3 context parallelism: causal on global positions
        visible = bottom_right_visible(sq, key_pos, cp_bound, causal=True) & (key_pos < cp_bound)[None, :]
    else:
        visible = bottom_right_visible(sq, key_pos, seqlen_k, causal=causal, window=window)
    return attend(scores, v64, visible)


def _check_common(q, k, v, softcap, sinks, fp8_allowed=True):
    if softcap:
        raise OutOfContractError("softcap", f"{softcap}: soft-capping is not modelled")
    if sinks is not None:
        raise OutOfContractError("sinks", "attention sinks are not modelled")
    allowed = (torch.bfloat16, torch.float16) + (_FP8 if fp8_allowed else ())
    check_dtype("q", q, allowed)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise OutOfContractError("k_cache", f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}: FA3 takes one dtype")
    return torch.bfloat16 if q.dtype in _FP8 else q.dtype


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, page_table=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
    max_seqlen_q=None, rotary_seqlens=None, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
    causal=False, window_size=(-1, -1), attention_chunk=None, softcap=0.0, rotary_interleaved=True,
    scheduler_metadata=None, num_splits=0, pack_gqa=None, only_qv=False, sm_margin=0, return_softmax_lse=False,
    sinks=None, score_mod=None, aux_tensors=None, ver=3, out=None,
):
    """``sgl_kernel.flash_attn.flash_attn_with_kvcache`` (FA3, paged cache): ``out`` or ``(out, lse)``."""
    for flag, value in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("rotary_seqlens", rotary_seqlens), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("score_mod", score_mod), ("aux_tensors", aux_tensors)):
        if value is not None:
            raise OutOfContractError(flag, "not modelled")
    if only_qv:
        raise OutOfContractError("only_qv", "not modelled")
    if attention_chunk:
        raise OutOfContractError("attention_chunk", f"{attention_chunk}: not modelled")
    if ver != 3:
        raise OutOfContractError("ver", f"{ver}: only FA3 is modelled")
    if page_table is None:
        raise OutOfContractError("page_table", "only a paged KV cache is modelled")
    if v_cache is None:
        raise ValueError("v_cache must be provided")
    out_dtype = _check_common(q, k_cache, v_cache, softcap, sinks)
    check_dtype("page_table", page_table, (torch.int32,))
    if softmax_scale is None:
        softmax_scale = (q.shape[-1] + (qv.shape[-1] if qv is not None else 0)) ** -0.5
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((page_table.shape[0],), cache_seqlens, dtype=torch.int32)
    if cache_seqlens is None:
        raise OutOfContractError("cache_seqlens", "required with a paged cache")
    check_dtype("cache_seqlens", cache_seqlens, (torch.int32,))
    lens = cache_seqlens.to("cpu", torch.int64)
    if cu_seqlens_q is not None:
        check_dtype("cu_seqlens_q", cu_seqlens_q, (torch.int32,))
        cu = cu_seqlens_q.to("cpu", torch.int64)
        batch = cu.numel() - 1
        segments = [(int(cu[i]), int(cu[i + 1] - cu[i])) for i in range(batch)]
        if max_seqlen_q is not None and any(n > max_seqlen_q for _, n in segments):
            raise OutOfContractError("max_seqlen_q", f"{max_seqlen_q} is below a request's query length")
        q_rows, qv_rows = q, qv
    else:
        batch, sq = q.shape[:2]
        segments = [(i * sq, sq) for i in range(batch)]
        q_rows = q.reshape(batch * sq, *q.shape[2:])
        qv_rows = qv.reshape(batch * sq, *qv.shape[2:]) if qv is not None else None
    if lens.numel() != batch or page_table.shape[0] != batch:
        raise OutOfContractError("cache_seqlens", f"{lens.numel()} lengths / {page_table.shape[0]} page-table rows "
                                                  f"for {batch} requests")
    total, h = q_rows.shape[:2]
    dv = v_cache.shape[-1]
    res = torch.zeros(total, h, dv, dtype=torch.float64)
    lse = torch.full((h, total), -math.inf, dtype=torch.float64)
    window = tuple(int(w) for w in window_size)
    for i, (r0, sq) in enumerate(segments):
        n = int(lens[i])
        if sq == 0 or n == 0:
            continue
        kk = gather_pages(k_cache, page_table[i], n, flag="page_table")
        vv = gather_pages(v_cache, page_table[i], n, flag="page_table")
        o, l = _attend_request(q_rows[r0:r0 + sq], qv_rows[r0:r0 + sq] if qv_rows is not None else None, kk, vv,
                               seqlen_k=n, key_pos=torch.arange(n), causal=bool(causal), window=window,
                               scale=float(softmax_scale), descales=(q_descale, k_descale, v_descale), i=i)
        res[r0:r0 + sq] = o
        lse[:, r0:r0 + sq] = l
    if cu_seqlens_q is None:
        res = res.reshape(batch, -1, h, dv)
        lse = lse.reshape(h, batch, -1).permute(1, 0, 2)  # [b, H, sq]
    o = write_out(res, out, out_dtype, q.device)
    return (o, lse.to(torch.float32).to(q.device)) if return_softmax_lse else o


def flash_attn_varlen_func(
    q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None, q_v=None,
    dropout_p=0.0, softmax_scale=None, causal=False, window_size=None, softcap=0.0, alibi_slopes=None,
    deterministic=False, return_attn_probs=False, block_table=None, return_softmax_lse=False, out=None,
    scheduler_metadata=None, q_descale=None, k_descale=None, v_descale=None, num_splits=0, output_scale=None,
    fa_version=3, s_aux=None, cp_world_size=1, cp_rank=0, cp_tot_seqused_k=None, mask_mod=None,
    block_sparse_tensors=None, aux_tensors=None, aux_tensor_leading_dims=None, dynamic_causal=None,
    gather_kv_indices=None, gather_kv_valid_length=None,
):
    """``vllm.vllm_flash_attn.flash_attn_varlen_func`` (FA2 / FA3): ``out`` or ``(out, lse [H, total_q])``."""
    assert cu_seqlens_k is not None or seqused_k is not None, "cu_seqlens_k or seqused_k must be provided"
    assert cu_seqlens_k is None or seqused_k is None, "cu_seqlens_k and seqused_k cannot be provided at the same time"
    assert block_table is None or seqused_k is not None, "seqused_k must be provided if block_table is provided"
    if fa_version not in (2, 3, 4):
        raise OutOfContractError("fa_version", f"{fa_version}: FA2, FA3 and FA4 are modelled")
    if fa_version == 4:
        if cp_world_size > 1 or v.dtype in _FP8:  # vLLM's wrapper forwards no context-parallel arguments to FA4
            raise OutOfContractError("fa_version", "FA4 with context parallelism or fp8 inputs is not modelled")
        q_descale = k_descale = v_descale = None  # the wrapper drops the descales of non-fp8 inputs
    for flag, value in (("alibi_slopes", alibi_slopes), ("output_scale", output_scale), ("s_aux", s_aux),
                        ("mask_mod", mask_mod), ("block_sparse_tensors", block_sparse_tensors),
                        ("aux_tensors", aux_tensors), ("dynamic_causal", dynamic_causal),
                        ("gather_kv_indices", gather_kv_indices)):
        if value is not None:
            raise OutOfContractError(flag, "not modelled")
    if dropout_p:
        raise OutOfContractError("dropout_p", f"{dropout_p}: not modelled")
    if return_attn_probs:
        raise OutOfContractError("return_attn_probs", "not modelled")
    if fa_version == 2:
        if scheduler_metadata is not None and all(x is not None for x in (q_descale, k_descale, v_descale)):
            raise NotImplementedError("FA2 does not support scheduler_metadata, q_descale, k_descale, v_descale")
        if q_v is not None or cp_world_size > 1:
            raise OutOfContractError("fa_version", "FA2 takes no q_v or context parallelism")
        q_descale = k_descale = v_descale = None  # the wrapper passes no descales to FA2's varlen_fwd
    window = tuple(int(w) for w in window_size) if window_size is not None else (-1, -1)
    if cp_world_size > 1:
        if not 0 <= cp_rank < cp_world_size:
            raise OutOfContractError("cp_rank", f"{cp_rank} outside [0, {cp_world_size})")
        if cp_tot_seqused_k is None:
            raise RuntimeError("cp_tot_seqused_k_ must be provided when context parallelism is enabled.")
        if window != (-1, -1):
            raise RuntimeError("Local attention (sliding window) is not currently supported with context "
                               "parallelism (cp_world_size > 1).")
    elif cp_rank != 0:
        raise RuntimeError("When context parallelism is disabled, cp_rank must be zero")
    out_dtype = _check_common(q, k, v, softcap, None, fp8_allowed=fa_version == 3)
    if softmax_scale is None:
        softmax_scale = (q.shape[-1] + (q_v.shape[-1] if q_v is not None else 0)) ** -0.5
    check_dtype("cu_seqlens_q", cu_seqlens_q, (torch.int32,))
    cu = cu_seqlens_q.to("cpu", torch.int64)
    batch = cu.numel() - 1
    if block_table is not None:
        check_dtype("block_table", block_table, (torch.int32,))
    if seqused_k is not None:
        check_dtype("seqused_k", seqused_k, (torch.int32,))
        kl = seqused_k.to("cpu", torch.int64)
    else:
        check_dtype("cu_seqlens_k", cu_seqlens_k, (torch.int32,))
        cuk = cu_seqlens_k.to("cpu", torch.int64)
        kl = cuk[1:] - cuk[:-1]
    tot = cp_tot_seqused_k.to("cpu", torch.int64) if cp_world_size > 1 else None
    total, h = q.shape[:2]
    dv = v.shape[-1]
    res = torch.zeros(total, h, dv, dtype=torch.float64)
    empty_lse = math.inf if fa_version == 2 else -math.inf
    lse = torch.full((h, total), -math.inf, dtype=torch.float64)
    for i in range(batch):
        r0, sq = int(cu[i]), int(cu[i + 1] - cu[i])
        n = int(kl[i])
        if sq == 0 or n == 0:
            continue
        if block_table is not None:
            kk = gather_pages(k, block_table[i], n, flag="block_table")
            vv = gather_pages(v, block_table[i], n, flag="block_table")
        elif seqused_k is not None:  # batched, unpaged k [b, max_k, H_k, d]
            if k.dim() != 4:
                raise OutOfContractError("seqused_k", "without block_table expects k [batch, seqlen_k, H_k, d]")
            kk, vv = k[i, :n], v[i, :n]
        else:
            k0 = int(cuk[i])
            kk, vv = k[k0:k0 + n], v[k0:k0 + n]
        pos = torch.arange(n, dtype=torch.int64)
        bound = None
        if tot is not None and causal:
            pos = pos * cp_world_size + cp_rank
            bound = int(tot[i])
        o, l = _attend_request(q[r0:r0 + sq], q_v[r0:r0 + sq] if q_v is not None else None, kk, vv,
                               seqlen_k=n, key_pos=pos, causal=bool(causal), window=window,
                               scale=float(softmax_scale), descales=(q_descale, k_descale, v_descale), i=i,
                               cp_bound=bound)
        res[r0:r0 + sq] = o
        lse[:, r0:r0 + sq] = l
    lse = torch.where(torch.isneginf(lse), empty_lse, lse)
    o = write_out(res, out, out_dtype, q.device)
    return (o, lse.to(torch.float32).to(q.device)) if return_softmax_lse else o


def merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
    """``sgl_kernel.merge_state_v2``: merge two partial attention states by their natural-log LSE."""
    check_dtype("v_a", v_a, (torch.bfloat16, torch.float16, torch.float32))
    if v_b.dtype != v_a.dtype:
        raise OutOfContractError("v_b", f"{v_b.dtype} differs from v_a {v_a.dtype}")
    # the op's own checks (merge_attn_states.cu merge_state_v2: CHECK_DIM, CHECK_SHAPE, CHECK_EQ), raised as it does
    for name, t, dim in (("v_a", v_a, 3), ("s_a", s_a, 2), ("v_b", v_b, 3), ("s_b", s_b, 2)):
        if t.dim() != dim:
            raise RuntimeError(f"{name} must be a {dim}D tensor")
    if v_a.shape != v_b.shape or s_a.shape != s_b.shape:
        raise RuntimeError(f"v_a {tuple(v_a.shape)} / v_b {tuple(v_b.shape)}, s_a {tuple(s_a.shape)} / s_b "
                           f"{tuple(s_b.shape)}: CHECK_SHAPE failed")
    for what, x, y in (("v_a.size(0), s_a.size(0)", v_a.shape[0], s_a.shape[0]),
                       ("v_a.size(1), s_b.size(1)", v_a.shape[1], s_b.shape[1])):
        if x != y:
            raise RuntimeError(f"CHECK_EQ({what}) failed. {x} vs {y}")
    a = as_float64(s_a.to(torch.float32))
    b = as_float64(s_b.to(torch.float32))
    a = torch.where(torch.isinf(a), -math.inf, a)
    b = torch.where(torch.isinf(b), -math.inf, b)
    m = torch.maximum(a, b)
    ea, eb = torch.exp(a - m), torch.exp(b - m)  # NaN where both are -inf, as in the kernel
    total = ea + eb
    merged = (as_float64(v_a) * (ea / total)[..., None] + as_float64(v_b) * (eb / total)[..., None])
    s = torch.log(total) + m
    vm = write_out(merged, v_merged, v_a.dtype, v_a.device)
    sm = write_out(s, s_merged, torch.float32, v_a.device)
    return vm, sm


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                           cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), has_softcap=False, num_splits=0, pack_gqa=None,
                           sm_margin=0):
    """FA3's ``get_scheduler_metadata`` (``vllm.vllm_flash_attn``, ``sgl_kernel.flash_attn``): a schedule of the
    library's size (see the contract)."""
    check_dtype("cache_seqlens", cache_seqlens, (torch.int32,))
    if cache_seqlens.numel() != int(batch_size):
        raise OutOfContractError("cache_seqlens", f"{cache_seqlens.numel()} lengths for batch_size {batch_size}")
    size = 1 + -(-int(batch_size) // 4) * 4 * 4
    return torch.zeros(size, dtype=torch.int32, device=cache_seqlens.device)


def sgl_get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads, num_heads_k, headdim,
                               cache_seqlens, **schedule):
    """``sgl_kernel.flash_attn.get_scheduler_metadata``: FA3's scheduler as sgl-kernel exposes it, the head
    counts named ``num_heads`` / ``num_heads_k`` (the names SGLang 0.5.23 passes; the sgl-kernel release it
    pins was not readable here, the upstream FA3 names are ``num_heads_q`` / ``num_heads_kv``). The rest as
    ``get_scheduler_metadata``."""
    return get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads, num_heads_k, headdim,
                                  cache_seqlens, **schedule)


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "sgl_kernel.flash_attn:flash_attn_with_kvcache": flash_attn_with_kvcache,
    "sgl_kernel:merge_state_v2": merge_state_v2,
    "vllm.vllm_flash_attn:flash_attn_varlen_func": flash_attn_varlen_func,
    "vllm.vllm_flash_attn:get_scheduler_metadata": get_scheduler_metadata,
    # sgl-kernel's FA3 build exposes the same scheduler (sgl_kernel/flash_attn.py wraps the hopper op)
    "sgl_kernel.flash_attn:get_scheduler_metadata": sgl_get_scheduler_metadata,
}
