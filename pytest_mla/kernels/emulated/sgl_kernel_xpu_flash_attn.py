"""sgl-kernel-xpu's ``flash_attn_with_kvcache`` (the XPU build of ``sgl_kernel.flash_attn``), emulated in float64.

SGLang's ``intel_xpu`` backend (``xpu_backend.py``) runs a model without MLA
through ``from sgl_kernel.flash_attn import flash_attn_with_kvcache``: on
XPU that name is sgl-kernel-xpu's, which shares the CUDA FA3 wrapper's name
and most of its signature but not its contract. So it is registered for the
XPU platform only (``PLATFORM_EMULATIONS["xpu"]``; the package's
``EMULATIONS`` keeps the CUDA FA3 emulation under the same name), and the
per-request attention reuses ``flash_attn._attend_request`` (FA3's float64
core: GQA head ``h`` reads KV head ``h // (H / H_k)``, bottom-right causal,
``x · descale``), where the two contracts agree.

Read from sgl-kernel-xpu (github.com/sgl-project/sgl-kernel-xpu), commit
``9cf16bf9`` (2026-08-21): ``python/sgl_kernel/flash_attn.py`` (the wrapper),
``src/sycl/flash_attention.cpp`` (``mha_fwd``'s dispatch and the ``decode``,
``prefill`` and ``chunkprefill`` entries with their ``TORCH_CHECK``s),
``kernels/flash_attention_v2/xe_fmha_fwd_decode_dispatch.hpp`` and
``xe_fmha_fwd_prefill_dispatch.hpp`` (page sizes, head dims, fp8 query), and
``tests/test_flash_attention.py`` (``attention_ref``: bottom-right causal,
``x · descale``); and a later sgl-kernel-xpu test of
``bidirectional_block_ids`` (the keyword SGLang passes from its extend path;
the commit read has no such parameter: a ``TypeError`` there).

The contract, and where it differs from the CUDA FA3 emulation (``flash_attn.py``):

* **Layout.** q ragged ``[total_q, H, d]`` with ``cu_seqlens_q``, or batched
  ``[b, s, H, d]`` (the wrapper flattens it and sets ``max_seqlen_q = s``);
  **the output is always ragged** ``[total_q, H, dv]`` in q's dtype (FA3's is
  ``[b, s, H, dv]`` for a batched q). ``k_cache`` / ``v_cache`` ``[num_pages,
  page_size, H_k, d]``, ``page_table [b, pages]`` int32, ``cache_seqlens``
  ``[b]`` int32: request ``b`` reads its first ``cache_seqlens[b]`` tokens.
  The wrapper asserts ``cache_seqlens.size(0) + 1 == cu_seqlens_q.size(0)``
  (an int ``cache_seqlens`` is widened to ``k_cache.shape[0]`` entries, the
  page count, so it fails there: ``AssertionError``, reproduced); no
  ``cache_seqlens`` is not modelled; a non-paged cache is not modelled.
* **Dispatch.** ``max_seqlen_q == 1``: the decode kernel; else with one
  request the prefill kernel; else (``chunkprefill``) both, decode for the
  requests with at most one query token, prefill for the rest. The wrapper's
  default ``max_seqlen_q`` is 0. A decode request with more than one query
  token is not modelled.
* **Scores.** ``softmax_scale · q·k`` (default ``d ** -0.5``), natural-exp
  softmax in float64. Decode: no causal mask (one query at the end of the
  cache sees every cached token); prefill: causal aligned bottom-right (query
  ``i`` of ``q_len`` sees keys ``<= seqlen_k - q_len + i``), as the wrapper's
  docstring and the library's ``attention_ref`` state. ``q_len > seqlen_k``
  and a zero ``cache_seqlens`` are not modelled.
* **Window.** ``window_size[0] >= seqlen_k - 1`` counts as unbounded (the
  op's normalisation, ``seqlen_k`` from ``max_seqlen_k`` or the page table's
  width); a left window inside the cache, or a right window on a non-causal
  prefill, is not modelled.
* **Page sizes and head dims.** Decode: page size 64 or 128, head dim 64, 96,
  128, 192, 256 or 512, at most 16 query heads per KV head (after rounding to
  a power of two) — each a ``RuntimeError`` naming the value, as the op's.
  Prefill: the same head dims (``RuntimeError``); the page sizes the library
  tests (64, 128), others not modelled (the prefill dispatch has no page-size
  check in the commit read). Head dims must be multiples of 8 and ``H`` a
  multiple of ``H_k`` (``RuntimeError``).
* **dtypes, fp8, descales.** q fp16 or bf16 (an fp8 q is the op's
  ``RuntimeError``: "mha_fwd only supports Half and BFloat16", unlike FA3,
  which takes an all-fp8 q/k/v). A non-fp8 cache has q's dtype. An fp8 cache
  (``float8_e4m3fn`` or ``float8_e5m2``, K and V alike) needs a bf16 q and
  both ``k_descale`` and ``v_descale``, each float32 and **per-tensor** (one
  element, or one value expanded with stride 0, as SGLang's
  ``k_scale.expand(batch, H_k)``); values are ``x · descale``. Each refusal is
  the op's ``RuntimeError``. ``q_descale`` is not modelled (``chunkprefill``
  refuses it: ``RuntimeError``), nor descales with a non-fp8 cache.
* **LSE.** The decode and prefill entries allocate an ``[H, total_q]``
  float32 LSE whose base and empty-row value were not read:
  ``return_softmax_lse=True`` is not modelled there. ``chunkprefill`` returns
  empty ``[0]`` float32 placeholders for it (``(out, lse, accum, accum)``),
  reproduced.
* **out.** A caller's ``out`` must have q's dtype, shape ``[total_q, H, dv]``
  and a contiguous last dim (``RuntimeError``), and needs a page table; it is
  written in place and returned.
* **Indices.** A page id outside the cache, or a length beyond the row's
  pages, raises ``OutOfRangeRead``; only the pages holding each request's
  tokens are read.
* **Not modelled** (``OutOfContractError``): appending ``k`` / ``v`` (the
  wrapper does not pass them on), ``qv`` (the op: "q_v is not supported
  yet"), rotary, ``cache_batch_idx``, ``cache_leftpad``, softcap, ``sinks``
  (head dim 64 only in the op), a non-None ``bidirectional_block_ids``.
  ``num_splits``, ``pack_gqa``, ``sm_margin`` and ``scheduler_metadata``
  only schedule the work (the split-KV reduction order) and are not checked,
  except that ``chunkprefill`` refuses ``scheduler_metadata``.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

from typing import Any

import torch

from .flash_attn import _attend_request
from .glue import OutOfContractError, OutOfRangeRead, gather_pages

__all__ = ["EMULATIONS", "PLATFORM_EMULATIONS", "flash_attn_with_kvcache"]

DECODE_PAGE_SIZES = (64, 128)
PREFILL_PAGE_SIZES = (64, 128)  # the library's tests; the prefill dispatch read checks none
HEAD_DIMS = (64, 96, 128, 192, 256, 512)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_ATEN = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float",
         torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2"}


def _per_tensor(descale: Any, name: str) -> float:
    """``get_per_tensor_descale_ptr``: a float32 tensor of one value (possibly expanded with stride 0)."""
    if not isinstance(descale, torch.Tensor) or descale.dtype != torch.float32:
        raise RuntimeError(f"{name} must be float32")
    if descale.numel() == 0:
        raise RuntimeError(f"{name} must not be empty")
    if descale.numel() != 1 and any(size > 1 and stride != 0 for size, stride in zip(descale.shape, descale.stride())):
        raise RuntimeError(f"fp8 KV cache uses a per-tensor descale: {name} must hold one value, got shape "
                           f"{tuple(descale.shape)}")
    return float(descale.reshape(-1)[0])


def _check_entry(q, k, v, k_descale, v_descale, *, entry: str, page_size: int, head_size: int):
    """The dtype, fp8, head-dim and page-size checks of the ``decode`` / ``prefill`` entry; the descales."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"mha_fwd only supports Half and BFloat16, got{_ATEN.get(q.dtype, q.dtype)}")
    fp8 = k.dtype in _FP8
    if fp8:
        if v.dtype != k.dtype:
            raise RuntimeError("fp8 KV cache requires key and value to have the same fp8 dtype (both float8_e4m3fn "
                               "or both float8_e5m2)")
        if k_descale is None or v_descale is None:
            raise RuntimeError("fp8 KV cache decode requires k_descale and v_descale" if entry == "decode" else
                               "fp8 KV cache requires k_descale and v_descale")
        descales = (_per_tensor(k_descale, "k_descale"), _per_tensor(v_descale, "v_descale"))
    else:
        if k.dtype != q.dtype:
            raise RuntimeError("query and key must have the same dtype")
        if v.dtype != q.dtype:
            raise RuntimeError("query and value must have the same dtype")
        if k_descale is not None or v_descale is not None:
            raise OutOfContractError("k_descale", "descales with a non-fp8 cache are not modelled")
        descales = None
    if head_size not in HEAD_DIMS:
        raise RuntimeError(f"Unsupported head size for paged {entry} attention: {head_size}")
    if fp8 and q.dtype != torch.bfloat16:
        raise RuntimeError(f"fp8 KV cache {entry} only supports a bf16 query")
    if entry == "decode" and page_size not in DECODE_PAGE_SIZES:
        raise RuntimeError(f"Unsupported page_size for decode attention: {page_size}")
    if entry == "prefill" and page_size not in PREFILL_PAGE_SIZES:
        raise OutOfContractError("page_size", f"{page_size}: the prefill kernel's handling of page sizes other than "
                                              f"{PREFILL_PAGE_SIZES} is not modelled")
    return descales


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
    cache_batch_idx=None, cache_leftpad=None, page_table=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
    max_seqlen_q=0, max_seqlen_k=0, rotary_seqlens=None, q_descale=None, k_descale=None, v_descale=None,
    softmax_scale=None, sinks=None, causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
    scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0, return_softmax_lse=False, out=None,
    bidirectional_block_ids=None,
):
    """sgl-kernel-xpu's ``sgl_kernel.flash_attn.flash_attn_with_kvcache``: ``out [total_q, H, dv]`` or a tuple."""
    assert k_cache.stride(-1) == 1, "k_cache must have contiguous last dimension"
    assert v_cache.stride(-1) == 1, "v_cache must have contiguous last dimension"
    for flag, value in (("k", k), ("v", v), ("qv", qv), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad), ("sinks", sinks),
                        ("bidirectional_block_ids", bidirectional_block_ids), ("q_descale", q_descale)):
        if value is not None:
            raise OutOfContractError(flag, "not modelled")
    if softcap:
        raise OutOfContractError("softcap", f"{softcap}: soft-capping is not modelled")
    if page_table is None:
        raise OutOfContractError("page_table", "only a paged KV cache is modelled")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    if isinstance(cache_seqlens, int):  # the wrapper's widening: one entry per page, not per request
        cache_seqlens = torch.full((k_cache.shape[0],), cache_seqlens, dtype=torch.int32)
    if cu_seqlens_q is None:
        cu_seqlens_q = torch.arange(0, q.size(0) + 1, dtype=torch.int32) * q.size(1)
        max_seqlen_q = q.size(1)
        q = q.reshape(-1, q.size(-2), q.size(-1))
    if cache_seqlens is None:
        raise OutOfContractError("cache_seqlens", "required (the wrapper reads it as the key lengths)")
    assert cache_seqlens.size(0) + 1 == cu_seqlens_q.size(0)

    if q.dim() != 3:
        raise RuntimeError("query must be in ragged format (total_q, h, d)")
    total_q, h, d = q.shape
    num_pages, page_size, h_k, _ = k_cache.shape
    dv = v_cache.shape[-1]
    if out is not None:
        if out.dtype != q.dtype:
            raise RuntimeError("out dtype must match q dtype")
        if tuple(out.shape) != (total_q, h, dv):
            raise RuntimeError("out shape must be [total_q, num_heads, head_size_v]")
        if out.stride(-1) != 1:
            raise RuntimeError("out must have a contiguous last dimension")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cache_seqlens), ("page_table", page_table)):
        if t.dtype != torch.int32:
            raise RuntimeError(f"{name} must have dtype torch.int32")
    if page_table.stride(-1) != 1:
        raise RuntimeError("page_table must have contiguous last dimension")
    batch = cu_seqlens_q.numel() - 1
    if page_table.shape[0] != batch:
        raise RuntimeError("batch_size must be equal to batch_size_k")
    if d > 512:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 512")
    if h % h_k:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if tuple(k_cache.shape) != (num_pages, page_size, h_k, d) or \
            tuple(v_cache.shape[:3]) != (num_pages, page_size, h_k):
        raise RuntimeError(f"k_cache / v_cache must have shape [{num_pages}, {page_size}, {h_k}, ...] with head "
                           f"size {d} for k")
    if d % 8 or dv % 8:
        raise RuntimeError("head_size should be a multiple of 8")

    cu = cu_seqlens_q.to("cpu", torch.int64)
    lens = cache_seqlens.to("cpu", torch.int64)
    seqlen_k = int(max_seqlen_k) if int(max_seqlen_k or 0) > 0 else page_table.shape[1] * page_size
    left, right = (int(w) for w in window_size)
    if left >= seqlen_k - 1:
        left = -1
    if causal:
        right = 0
    if max_seqlen_q == 1:
        entries, chunked = ["decode"] * batch, False
    elif batch == 1:
        entries, chunked = ["prefill"], False
    else:  # chunkprefill: the decode kernel skips the prefill requests, the prefill kernel the rest
        if scheduler_metadata is not None:
            raise RuntimeError("chunkprefill two-launch path does not yet support q_v / rotary / q_descale / "
                               "scheduler_metadata.")
        entries = ["prefill" if int(cu[i + 1] - cu[i]) > 1 else "decode" for i in range(batch)]
        chunked = True
    descales = {}
    for entry in sorted(set(entries)):
        descales[entry] = _check_entry(q, k_cache, v_cache, k_descale, v_descale, entry=entry, page_size=page_size,
                                       head_size=d)
    if "decode" in entries and _next_pow2(h // h_k) > 16:
        raise RuntimeError(f"Unsupported q_group_size for decode attention: {h // h_k}")
    if left >= 0:
        raise OutOfContractError("window_size", f"{tuple(window_size)}: local attention is not modelled")
    if return_softmax_lse and not chunked:
        raise OutOfContractError("return_softmax_lse", "the decode and prefill entries' LSE (base, empty rows) is "
                                                       "not modelled")

    res = torch.zeros(total_q, h, dv, dtype=torch.float64)
    for i in range(batch):
        r0, sq, n = int(cu[i]), int(cu[i + 1] - cu[i]), int(lens[i])
        if sq == 0:
            continue
        entry = entries[i]
        if entry == "decode" and sq > 1:
            raise OutOfContractError("max_seqlen_q", f"1 with request {i} holding {sq} query tokens: not modelled")
        if entry == "prefill" and not causal and right >= 0:
            raise OutOfContractError("window_size", f"{tuple(window_size)}: a right window is not modelled")
        if n == 0 or sq > n:
            raise OutOfContractError("cache_seqlens", f"request {i}: {sq} query tokens over {n} cached tokens "
                                                      "is not modelled")
        if n > page_table.shape[1] * page_size:
            raise OutOfRangeRead("cache_seqlens", f"request {i}: {n} tokens need {-(-n // page_size)} pages of "
                                                  f"{page_size}, its page-table row holds {page_table.shape[1]}")
        kk = gather_pages(k_cache, page_table[i], n, flag="page_table")
        vv = gather_pages(v_cache, page_table[i], n, flag="page_table")
        scales = descales[entry]
        ds = (None, None, None) if scales is None else (
            None, torch.full((batch, h_k), scales[0], dtype=torch.float64),
            torch.full((batch, h_k), scales[1], dtype=torch.float64))
        o, _ = _attend_request(q[r0:r0 + sq], None, kk, vv, seqlen_k=n, key_pos=torch.arange(n),
                               causal=entry == "prefill" and bool(causal), window=(-1, -1),
                               scale=float(softmax_scale), descales=ds, i=i)
        res[r0:r0 + sq] = o
    value = res.to(q.dtype).to(q.device)
    if out is not None:
        out.copy_(value)
        value = out
    if not return_softmax_lse:
        return value
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    return value, empty, empty, empty


#: Keyed like the CUDA emulations, but for the XPU platform's checks only (the name is FA3's on CUDA).
PLATFORM_EMULATIONS = {"xpu": {"sgl_kernel.flash_attn:flash_attn_with_kvcache": flash_attn_with_kvcache}}
#: Nothing here stands in for a CUDA callable.
EMULATIONS: dict[str, Any] = {}
