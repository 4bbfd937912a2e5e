"""FlashInfer's TRT-LLM paged GQA/MHA decode, emulated in float64: ``trtllm_batch_decode_with_kv_cache`` (XQA, trtllm-gen).

Read from flashinfer-python 0.7.2.post1 (``flashinfer/decode.py``
``trtllm_batch_decode_with_kv_cache`` and ``xqa_batch_decode_with_kv_cache``,
``flashinfer/xqa.py`` ``xqa``, ``flashinfer/jit/xqa.py`` ``gen_xqa_module``,
``flashinfer/utils.py`` ``_check_block_tables_shape``,
``_resolve_trtllm_gen_multi_ctas_kv_counter_buffer``), XQA's kernel
(``csrc/xqa/mha.cu`` ``applyMaskFromInput``, ``specDec.h``) and FlashInfer's
tests (``tests/attention/test_trtllm_gen_attention.py`` ``_test_trtllm_batch_decode``,
``generate_causal_mask``; ``tests/attention/test_xqa.py`` ``ref_attention``).
The contract, all in one place:

* **Backend.** ``backend="auto"`` is trtllm-gen on a device of compute
  capability 10.x (SM100/SM103) and XQA on any other (SM90, SM120), asked of
  ``torch.cuda.get_device_capability()`` — on a CPU host the driver states the
  cell's GPU there; ``backend="xqa"`` / ``"trtllm-gen"`` choose directly.
* **Layouts.** ``query [num_tokens, Hq, D]``, ``num_tokens = batch · q_len_per_req``
  (request ``i``'s queries are rows ``i·q_len .. i·q_len + q_len - 1``); or,
  trtllm-gen only, ``cum_seq_lens_q [batch + 1]`` with ``max_q_len`` (ragged).
  ``kv_cache``: a tuple ``(k, v)`` of ``[P, Hk, ps, D]`` (``kv_layout="HND"``,
  the default) or ``[P, ps, Hk, D]`` (``"NHD"``), or one ``[P, 1|2, ...]``
  tensor (1: K and V share it). ``block_tables [batch, max_pages]`` int32, one
  table for K and V; ``seq_lens [batch]`` the KV length of each request,
  **its new tokens included**. Page ids a request's ``seq_lens`` reaches must
  lie in ``[0, P)`` (else ``OutOfRangeRead``); entries past them are never read.
* **GQA.** ``Hq`` a multiple of ``Hk``; query head ``h`` reads KV head
  ``h // (Hq / Hk)``.
* **Scales.** Scores ``bmm1_scale · (q · k)`` on the values as stored (an fp8
  query or cache stays raw: q/k descales and the softmax scale are folded into
  ``bmm1_scale``); output ``bmm2_scale · softmax · v`` (the V descale over the
  output scale). Both a float or a one-element float32 tensor (the tests build
  ``bmm1 = q_scale·k_scale·sm_scale``, ``bmm2 = v_scale / o_scale``). XQA
  takes ``q_scale = bmm1 / (bmm2·o_scale) · √D`` and ``kv_scale = bmm2·o_scale``,
  ``rcp_out_scale = 1 / o_scale`` (``xqa_batch_decode_with_kv_cache``), which
  is the same result; ``o_scale`` other than 1 is refused.
* **Causal alignment.** Multi-token queries are causal, aligned bottom-right:
  query ``j`` of ``q_len`` sees key positions ``<= seq_len - q_len + j`` (the
  tests compare with ``BatchPrefillWithPagedKVCacheWrapper(causal=True)``).
  XQA takes the draft block's mask from ``mask`` (required when ``q_len > 1``):
  ``[batch, q_len, 2·ceil(q_len/32)]`` uint16, bit ``j`` (word ``j // 16``) of
  row ``i`` = query ``i`` sees key ``seq_len - q_len + j``; keys before the
  draft block are always visible (``applyMaskFromInput``). trtllm-gen ignores
  ``mask`` (the library hands it to XQA only).
* **Outputs.** ``out`` ``query.shape`` in ``out_dtype`` (default: ``out``'s,
  else the query's); trtllm-gen accepts the query's dtype, fp16 or bf16, XQA
  the query's. LSE (trtllm-gen only; XQA raises ``NotImplementedError``)
  ``[num_tokens, Hq]`` float32, **base 2** ("LSE is FP32 base-2, matching the
  existing TRT-LLM backend contract", the function's docstring).
* **Dtypes.** XQA: query fp16/bf16 (``ValueError`` otherwise, as its JIT
  raises), cache the query's dtype or ``float8_e4m3fn``. trtllm-gen: query
  and cache bf16/fp16 alike, bf16 query with an e4m3 cache, or e4m3 both.
  Any other cache dtype is refused (``kv_cache``): FlashInfer's tests run none,
  and XQA's JIT builds its plain-cache kernel (``CACHE_ELEM_ENUM=0``, the
  query's dtype) for an ``float8_e5m2`` cache, which would read the one-byte
  values as two-byte ones — a GPU answers garbage, no emulation can.
* **Lengths.** A request with ``seq_lens`` 0 has its rows left unwritten (NaN
  here: a caller that reads them shows); ``0 < seq_len < q_len`` is outside
  the tests (refused). trtllm-gen schedules ``max_seq_len`` tokens: a longer
  request is refused; XQA reads up to the table's width × page size.
* **Kept library checks** (the library's exception type): XQA's page sizes
  16/32/64/128 and head dims (multiple of 16 in [16, 512]), its K/V and
  output dtype asserts, the spec-decode mask assert, ``cum_seq_lens_q`` /
  LSE refusals; ``cp_world`` / ``cp_rank`` without ``causal_seqlens_kv_global``;
  ``block_tables`` rank; the multi-CTA counter buffer's size.
* **Not modelled** (``OutOfContractError`` naming the flag): sliding windows
  (``window_left``), ``sinks``, skip-softmax, NVFP4 caches (``kv_cache_sf``)
  and outputs (``o_sf_*``), fp8 outputs, ``o_scale`` != 1, separate K/V page
  tables, block-sparse attention, ``bmm1_scale_log2``, the bf16-q/fp8-KV
  transform modes, DCP speculative decode (``causal_seqlens_kv_global``), the
  cake backend and request ordering.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .flashinfer import _scalar, get_device_sm_count, get_trtllm_gen_multi_ctas_kv_counter_bytes
from .glue import OutOfContractError, as_float64, attend, bottom_right_visible, gather_pages, to_base2, write_out

__all__ = ["EMULATIONS", "trtllm_batch_decode_with_kv_cache", "unpack_xqa_mask"]

_HALF = (torch.float16, torch.bfloat16)
_E4M3 = torch.float8_e4m3fn


def _refuse(**flags: Any) -> None:
    for flag, (value, default) in flags.items():
        if value is not default and value != default:
            raise OutOfContractError(flag, f"{value!r} is not modelled")


def unpack_xqa_mask(mask: torch.Tensor, q_len: int) -> torch.Tensor:
    """XQA's packed draft-block mask ``[..., q_len, words]`` uint16 → bool ``[..., q_len, q_len]`` (bit ``j``
    of word ``j // 16``, little-endian within the word: query row sees draft key ``j``)."""
    words = mask.to("cpu").view(torch.int16).to(torch.int64) & 0xFFFF  # [..., q_len, words]
    j = torch.arange(q_len)
    return ((words[..., j // 16] >> (j % 16)) & 1).to(torch.bool)


def _backend(backend: str) -> str:
    if backend == "auto":
        major = torch.cuda.get_device_capability()[0]  # the library's get_compute_capability(query.device)
        return "trtllm-gen" if major == 10 else "xqa"
    if backend in ("cake",):
        raise OutOfContractError("backend", "the Cake FMHA product backend is not modelled")
    if backend not in ("xqa", "trtllm-gen"):
        raise KeyError(f"Backend {backend} not supported")
    return backend


def _caches(kv_cache: Any, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` as ``[P, Hk, ps, D]`` views."""
    if isinstance(kv_cache, tuple):
        k, v = kv_cache
    elif kv_cache.shape[1] == 1:
        k = v = kv_cache.squeeze(1)
    else:
        if kv_cache.shape[1] != 2:
            raise AssertionError("When kv_cache is a single tensor, the second dimension must be 1 or 2")
        k, v = kv_cache.unbind(dim=1)
    if kv_layout not in ("HND", "NHD"):
        raise OutOfContractError("kv_layout", f"{kv_layout!r} is not a layout")
    if k.dim() != 4 or v.dim() != 4:
        raise OutOfContractError("kv_cache", f"K {tuple(k.shape)} / V {tuple(v.shape)}: 4-D pages are modelled")
    if kv_layout == "NHD":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def trtllm_batch_decode_with_kv_cache(
    query: torch.Tensor,
    kv_cache: Any,
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    bmm1_scale: Any = 1.0,
    bmm2_scale: Any = 1.0,
    window_left: int = -1,
    out: Optional[torch.Tensor] = None,
    out_dtype: Any = None,
    o_sf_scale: Optional[float] = None,
    o_sf_vec_size: Optional[int] = None,
    sinks: Any = None,
    kv_layout: str = "HND",
    enable_pdl: Optional[bool] = None,
    backend: str = "auto",
    q_len_per_req: Optional[int] = 1,
    o_scale: Optional[float] = 1.0,
    mask: Optional[torch.Tensor] = None,
    max_q_len: Optional[int] = None,
    cum_seq_lens_q: Optional[torch.Tensor] = None,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    kv_cache_sf: Any = None,
    uses_shared_paged_kv_idx: bool = True,
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    bmm1_scale_log2: Optional[torch.Tensor] = None,
    multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None,
    enable_block_sparse_attention: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: Optional[torch.Tensor] = None,
    bf16q_fp8kv_transform_mode: Optional[str] = None,
    request_order: Optional[torch.Tensor] = None,
    request_order_plan: Any = None,
):
    """``flashinfer.decode.trtllm_batch_decode_with_kv_cache``; ``out`` or ``(out, lse)`` (see the module docstring)."""
    if request_order is not None or request_order_plan is not None:
        raise OutOfContractError("request_order", "request-ordered Cake FMHA decode is not modelled")
    if causal_seqlens_kv_global is None and (cp_world != 1 or cp_rank != 0):
        raise ValueError("cp_world/cp_rank require causal_seqlens_kv_global to enable the DCP speculative "
                         "decode path")
    _refuse(causal_seqlens_kv_global=(None if causal_seqlens_kv_global is None else "a tensor", None),
            window_left=(window_left, -1), sinks=(None if sinks is None else "given", None),
            skip_softmax_threshold_scale_factor=(skip_softmax_threshold_scale_factor, None),
            kv_cache_sf=(None if kv_cache_sf is None else "given", None), o_sf_scale=(o_sf_scale, None),
            o_sf_vec_size=(o_sf_vec_size, None), uses_shared_paged_kv_idx=(uses_shared_paged_kv_idx, True),
            enable_block_sparse_attention=(enable_block_sparse_attention, False),
            bmm1_scale_log2=(None if bmm1_scale_log2 is None else "a tensor", None),
            bf16q_fp8kv_transform_mode=(bf16q_fp8kv_transform_mode, None))
    if o_scale is not None and float(o_scale) != 1.0:
        raise OutOfContractError("o_scale", f"{o_scale}: only 1.0 (no output quantisation) is modelled")
    if isinstance(out_dtype, str):
        raise OutOfContractError("out_dtype", f"{out_dtype!r} (NVFP4 output) is not modelled")
    k_cache, v_cache = _caches(kv_cache, kv_layout)
    which = _backend(backend)
    b1, b2 = _scalar("bmm1_scale", bmm1_scale), _scalar("bmm2_scale", bmm2_scale)  # flashinfer.py's, one rule
    if k_cache.dtype != v_cache.dtype:
        raise AssertionError("K and V cache must have the same dtype")
    if query.dim() != 3:
        raise OutOfContractError("query", f"shape {tuple(query.shape)}: [num_tokens, num_heads, head_dim] is modelled")
    num_tokens, hq, d = query.shape
    hk, page_size = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[-1] != d or v_cache.shape[-1] != d:
        raise OutOfContractError("kv_cache", f"head dim {k_cache.shape[-1]} / {v_cache.shape[-1]} differs from the "
                                             f"query's {d}")
    if hq % hk:
        raise OutOfContractError("num_heads", f"{hq} query heads over {hk} KV heads")

    if which == "xqa":
        if out_dtype is None:
            out_dtype = out.dtype if out is not None else query.dtype
        if max_q_len is not None or cum_seq_lens_q is not None:
            raise ValueError("xqa backend does not support cum_seq_lens_q")
        if return_lse or lse is not None:
            raise NotImplementedError("xqa backend does not support return_lse/lse output")
        if query.dtype not in _HALF:
            raise ValueError(f"Invalid dtype: {query.dtype} for XQA, only float16 and bfloat16 input are supported")
        if k_cache.dtype not in (query.dtype, _E4M3):
            raise OutOfContractError("kv_cache", f"{k_cache.dtype} cache with {query.dtype} queries: XQA runs a "
                                                 "cache of the query's dtype or float8_e4m3fn (its JIT would build "
                                                 "the query-dtype cache kernel and misread the values)")
        if out_dtype == _E4M3:
            raise OutOfContractError("out_dtype", "fp8 output is not modelled")
        if out_dtype != query.dtype:
            raise AssertionError("Output and query must have the same dtype")
        if page_size not in (16, 32, 64, 128):
            raise ValueError(f"Invalid page_size: {page_size}, only 16, 32, 64, 128 are supported")
        if d % 16 != 0 or d > 512 or d < 16:
            raise ValueError(f"Invalid head_dim: {d}, must be divisible by 16 and in range [16, 512]")
        q_len = int(q_len_per_req or 1)
        if d > 256 and q_len > 1:
            raise ValueError(f"head_dim {d} > 256 does not support speculative decoding (q_seq_len > 1)")
        batch = num_tokens // q_len
        segments = [(i * q_len, q_len) for i in range(batch)]
        if q_len > 1 and mask is None:
            raise AssertionError("Mask is required for speculative decoding")
        xqa_mask = None
        if q_len > 1:
            words = -(-q_len // 32) * 2
            if mask.dtype != torch.uint16 or tuple(mask.shape) != (batch, q_len, words):
                raise OutOfContractError("mask", f"{mask.dtype} {tuple(mask.shape)}: XQA reads [batch, q_len, "
                                                 f"{words}] uint16 = [{batch}, {q_len}, {words}]")
            xqa_mask = unpack_xqa_mask(mask, q_len)  # [batch, q_len, q_len]
        readable = block_tables.shape[-1] * page_size  # XQA's max_seq_len: the table's width
    else:
        if out_dtype is None:
            out_dtype = out.dtype if out is not None else query.dtype
        if out_dtype not in (query.dtype, torch.float16, torch.bfloat16):
            raise ValueError(f"Unsupported out_dtype: {out_dtype}")
        if out_dtype not in _HALF:
            raise OutOfContractError("out_dtype", f"{out_dtype} output is not modelled")
        pair = (query.dtype, k_cache.dtype)
        if not (pair in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16), (_E4M3, _E4M3))
                or pair == (torch.bfloat16, _E4M3)):
            raise OutOfContractError("kv_cache", f"{k_cache.dtype} cache with {query.dtype} queries: the modelled "
                                                 "trtllm-gen kernels take a cache of the query's dtype (bf16, fp16, "
                                                 "e4m3) or bf16 queries over e4m3 (FlashInfer's tests run no other)")
        if q_len_per_req is not None:
            q_len = int(q_len_per_req)
            batch = num_tokens // q_len
            segments = [(i * q_len, q_len) for i in range(batch)]
        else:
            if max_q_len is None or cum_seq_lens_q is None:
                raise AssertionError("max_q_len and cum_seq_lens_q are required without q_len_per_req")
            cu = cum_seq_lens_q.to("cpu", torch.int64)
            batch = cu.numel() - 1
            segments = [(int(cu[i]), int(cu[i + 1] - cu[i])) for i in range(batch)]
            if int(cu[-1]) != num_tokens or any(n > int(max_q_len) for _, n in segments):
                raise OutOfContractError("cum_seq_lens_q", f"{cu.tolist()} with max_q_len {max_q_len} does not "
                                                           f"cover the {num_tokens} query rows")
        xqa_mask = None
        readable = int(max_seq_len)  # the kernel schedules max_seq_len tokens
        counter = multi_ctas_kv_counter_buffer
        if counter is not None:
            need = get_trtllm_gen_multi_ctas_kv_counter_bytes(batch, hq, get_device_sm_count())
            have = counter.numel() * counter.element_size()
            if have < need:
                raise ValueError(f"multi_ctas_kv_counter_buffer is too small: got {have} bytes, need {need} bytes")
    if block_tables.ndim != 2:
        raise ValueError(f"block_tables must be 2D for shared paged KV layout, got ndim={block_tables.ndim}")
    if block_tables.shape[0] < batch or seq_lens.shape[0] != batch:
        raise OutOfContractError("block_tables", f"{tuple(block_tables.shape)} / seq_lens {tuple(seq_lens.shape)} "
                                                 f"for a batch of {batch}")
    if sum(n for _, n in segments) != num_tokens:
        raise OutOfContractError("q_len_per_req", f"{q_len_per_req} does not divide the {num_tokens} query rows")

    lens = seq_lens.to("cpu", torch.int64)
    group = hq // hk
    res = torch.full((num_tokens, hq, d), math.nan, dtype=torch.float64)  # rows of empty requests: unwritten
    lse_e = torch.full((num_tokens, hq), math.nan, dtype=torch.float64)
    keys_of = k_cache.transpose(1, 2)  # [P, ps, Hk, D]
    vals_of = v_cache.transpose(1, 2)
    for i, (row0, q_len) in enumerate(segments):
        n = int(lens[i])
        if q_len == 0 or n == 0:
            continue
        if n < q_len:
            raise OutOfContractError("seq_lens", f"request {i} holds {n} tokens for {q_len} queries (the tests' "
                                                 "seq_lens include every query token)")
        if n > readable:
            raise OutOfContractError("max_seq_len", f"request {i} holds {n} tokens, the kernel reads at most "
                                                    f"{readable}")
        keys = as_float64(gather_pages(keys_of, block_tables[i], n, flag="block_tables"))  # [n, Hk, D]
        vals = as_float64(gather_pages(vals_of, block_tables[i], n, flag="block_tables"))
        keys, vals = keys.repeat_interleave(group, dim=1), vals.repeat_interleave(group, dim=1)  # [n, Hq, D]
        scores = torch.einsum("qhd,nhd->hqn", as_float64(query[row0:row0 + q_len]), keys) * b1
        visible = bottom_right_visible(q_len, torch.arange(n), n, causal=True)
        if xqa_mask is not None:
            visible = visible.clone()
            visible[:, n - q_len:] = xqa_mask[i]  # the draft block: the mask replaces the causal rule
        o, l = attend(scores, vals, visible)
        seen = ~torch.isneginf(l).T  # [q_len, Hq]
        res[row0:row0 + q_len] = torch.where(seen[..., None], o * b2, res[row0:row0 + q_len])
        lse_e[row0:row0 + q_len] = torch.where(seen, l.T, lse_e[row0:row0 + q_len])
    o = write_out(res, out, out_dtype, query.device)
    if not (return_lse or lse is not None):
        return o
    lse_t = write_out(to_base2(lse_e), lse, torch.float32, query.device)
    return (o, lse_t) if return_lse else o


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "flashinfer.decode:trtllm_batch_decode_with_kv_cache": trtllm_batch_decode_with_kv_cache,
}
