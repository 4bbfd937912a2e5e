"""FlashMLA dense decode, emulated in float64: sgl-flash-mla 1.0.0's and sglang-kernel's Python APIs, vLLM's ops.

Emulated callables (see ``EMULATIONS`` at the bottom):

* ``flash_mla:get_mla_metadata``, ``flash_mla:get_mla_decoding_metadata``,
  ``flash_mla:flash_mla_with_kvcache`` and the ``FlashMLASchedMeta`` class as
  sgl-flash-mla 1.0.0 defines them (``flash_mla/flash_mla_interface.py`` in
  its wheel), the dense paths only;
* ``sgl_kernel.flash_mla:get_mla_metadata`` and
  ``sgl_kernel.flash_mla:flash_mla_with_kvcache`` as sglang-kernel 0.4.9 and
  0.4.10 define them (``sgl_kernel/flash_mla.py`` in their wheels, the same
  file; SGLang 0.5.22 calls them): metadata given as tensors (the legacy
  ``get_mla_decoding_metadata[_dense_fp8]`` schedule, the bf16 op
  ``fwd_kvcache_mla`` or, for an fp8 query, ``fwd_kvcache_mla_fp8``) or as a
  ``FlashMLASchedMeta`` (``dense_decode_fwd``), the dense paths only;
* vLLM 0.34.0's compiled ops under its vendored interface
  (``vllm/third_party/flashmla/flash_mla_interface.py``,
  ``vllm/v1/attention/ops/flashmla.py``): ``torch.ops._flashmla_C.dense_decode_fwd``,
  ``torch.ops._flashmla_extension_C.fwd_kvcache_mla_fp8`` and
  ``torch.ops._flashmla_extension_C.get_mla_decoding_metadata_dense_fp8``.

The contract, all in one place (sources in brackets):

* Layouts: ``q [b, s_q, h_q, d]``, ``d`` 576 (or 512 for bf16/fp16; another width, or a ``head_dim_v``
  other than 512, fails the library's ``TORCH_CHECK``: kept, a ``RuntimeError`` as on the GPU);
  ``k_cache [num_blocks, 64, h_k, d]`` with ``page_block_size == 64``; V is the
  first ``head_dim_v == 512`` columns of each K row; ``h_q % h_k == 0``;
  ``block_table [b, max_blocks]`` and ``cache_seqlens [b]`` int32.
  [FlashMLA csrc/api/dense_decode.h: the TORCH_CHECKs]
* Output ``out [b, s_q, h_q, 512]`` in q's dtype (bf16/fp16), **bf16** when q is
  fp8 [run_mha_fwd_splitkv_mla<float_e4m3_t, bfloat16_t, 576>, FlashMLA PR 54 as
  vLLM/sgl-kernel vendor it]; ``lse [b, h_q, s_q]`` float32, **natural log** of
  the scaled scores. [FlashMLA tests/test_flash_mla_dense_decoding.py reference_torch]
* Scores are ``softmax_scale · q·k`` (default ``d ** -0.5``).
* Causal (multi-token queries): aligned bottom-right, key ``j`` visible to
  query ``i`` iff ``j <= seqlen_k - s_q + i`` (``mask.tril(diagonal=s_k - s_q)``);
  with ``s_q == 1`` causal is ignored. [reference_torch; dense_decode.h]
* A query that sees no key (``cache_seqlens == 0``, or ``seqlen_k < s_q`` under
  causal) gets ``out = 0`` and ``lse = +inf`` ("lonely_q_mask") — note the sign:
  ``+inf``, not the ``-inf`` an LSE merge wants. [reference_torch]
* fp8 (``is_fp8_kvcache`` / the dense fp8 op): q **and** the cache are
  ``float8_e4m3fn``, head dim 576 (a cache whose dtype differs from q's fails the
  library's ``TORCH_CHECK(kcache.dtype() == q_dtype, "query and key must have the
  same dtype")``: kept, a ``RuntimeError`` as on the GPU); values are ``q·descale_q``, ``k·descale_k``
  and ``v·descale_k`` (per-tensor ``[1]`` float32 tensors).
  [sgl-kernel tests/test_flash_mla.py::test_flash_mla_fp8 ref_mla]
* Scheduling metadata: the split schedule is computed from ``cache_seqlens``
  and may be reused "only when the tensor shapes and the values of
  cache_seqlens ... remain the same" [vLLM's vendored flash_mla_interface.py
  docstring]. The emulated metadata are real int32 tensors of the library's
  shapes (``[num_sm_parts, 8]``, ``[b + 1]``) that carry a fingerprint of the
  lengths they were built for; a decode whose ``cache_seqlens`` differ raises
  ``OutOfContractError("tile_scheduler_metadata", ...)`` (the real kernel
  would silently skip or re-read splits). ``num_q_tokens_per_head_k`` is not
  checked (it only sizes ``num_sm_parts``, which needs the GPU's SM count).
* Out-of-range page ids in the pages a sequence needs raise; entries past a
  sequence's last page are never read.
* Not modelled (raise): sparse attention (``indices``, ``topk``, ``attn_sink``,
  extra caches), ``enable_batch_invariant``, ``kv_format``.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Optional

import torch

from .glue import OutOfContractError, as_float64, attend, bottom_right_visible, check_dtype, gather_pages, write_out

__all__ = [
    "EMULATIONS",
    "FlashMLASchedMeta",
    "dense_decode_fwd",
    "flash_mla_with_kvcache",
    "fwd_kvcache_mla_fp8",
    "get_mla_decoding_metadata",
    "get_mla_decoding_metadata_dense_fp8",
    "get_mla_metadata",
    "sgl_kernel_flash_mla_with_kvcache",
    "sgl_kernel_get_mla_metadata",
]

PAGE_BLOCK_SIZE = 64
HEAD_DIM_V = 512
_MAGIC = 0x0E1A  # first word of an emulated tile_scheduler_metadata row


@dataclasses.dataclass
class FlashMLASchedMeta:
    """sgl-flash-mla 1.0.0's ``FlashMLASchedMeta`` (same fields), filled by the first decode call."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]
        enable_batch_invariant: bool

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None  # [num_sm_parts, 8] int32
    num_splits: Optional[torch.Tensor] = None  # [b + 1] int32


# --------------------------------------------------------------------------------------------
# Scheduling metadata: real int32 tensors that remember which lengths they were built for
# --------------------------------------------------------------------------------------------


def _fingerprint(seqlens: torch.Tensor) -> tuple[int, int, int]:
    values = seqlens.detach().to("cpu", torch.int64)
    crc = zlib.crc32(values.numpy().tobytes())
    return int(values.numel()), int(values.sum()), crc


def _schedule(seqlens: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, total, crc = _fingerprint(seqlens)
    tsm = torch.zeros(1, 8, dtype=torch.int32)
    tsm[0, :6] = torch.tensor([_MAGIC, b, total & 0x7FFFFFFF, crc & 0xFFFF, crc >> 16, int(fp8)], dtype=torch.int32)
    num_splits = torch.arange(b + 1, dtype=torch.int32)  # one split per request, cumulative as the kernel's
    return tsm.to(seqlens.device), num_splits.to(seqlens.device)


def _check_schedule(tsm: Optional[torch.Tensor], num_splits: Optional[torch.Tensor], seqlens: torch.Tensor,
                    fp8: bool) -> None:
    if tsm is None or num_splits is None:
        raise OutOfContractError("tile_scheduler_metadata", "missing: the dense fp8 kernel needs the schedule from "
                                                            "get_mla_decoding_metadata before the call")
    row = tsm.detach().to("cpu", torch.int64).flatten()
    if row.numel() < 6 or int(row[0]) != _MAGIC:
        raise OutOfContractError("tile_scheduler_metadata", "not built by the emulated get_mla_*metadata "
                                                            "(cannot tell which lengths it schedules)")
    b, total, crc = _fingerprint(seqlens)
    built = (int(row[1]), int(row[2]), int(row[3]) | (int(row[4]) << 16))
    if built != (b, total & 0x7FFFFFFF, crc):
        raise OutOfContractError("tile_scheduler_metadata", f"built for other cache_seqlens than this call's "
                                                            f"{seqlens.tolist()}: FlashMLA reuses a schedule only for "
                                                            "the same lengths")
    if int(row[5]) != int(fp8):
        raise OutOfContractError("tile_scheduler_metadata", "built for the other kernel (bf16 vs dense fp8)")
    if num_splits.numel() != b + 1:
        raise OutOfContractError("num_splits", f"has {num_splits.numel()} entries, the kernel expects b + 1 = {b + 1}")


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """``flash_mla.get_mla_metadata``: an empty schedule the first decode call fills."""
    return FlashMLASchedMeta(), None


def get_mla_decoding_metadata(
    seqlens_k: torch.Tensor,
    num_q_tokens_per_head_k: int,
    h_k: int,
    h_q: Optional[int] = None,
    is_fp8_kvcache: bool = False,
    topk: Optional[int] = None,
    use_legacy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_mla.get_mla_decoding_metadata`` (dense): ``(tile_scheduler_metadata, num_splits)``."""
    if topk is not None:
        raise OutOfContractError("topk", "sparse decoding schedules are not modelled")
    if is_fp8_kvcache:
        assert use_legacy, "dense fp8 decoding exists only on the legacy side"  # as the wheel asserts
    _check_lengths(seqlens_k)
    return _schedule(seqlens_k, bool(is_fp8_kvcache))


def get_mla_decoding_metadata_dense_fp8(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int,
                                        num_heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops._flashmla_extension_C.get_mla_decoding_metadata_dense_fp8``."""
    _check_lengths(cache_seqlens)
    return _schedule(cache_seqlens, True)


# --------------------------------------------------------------------------------------------
# The decode itself
# --------------------------------------------------------------------------------------------


def _check_lengths(seqlens: torch.Tensor) -> None:
    check_dtype("cache_seqlens", seqlens, (torch.int32,))
    if bool((seqlens < 0).any()):
        raise OutOfContractError("cache_seqlens", f"negative length in {seqlens.tolist()}")


def _dense_decode(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal, *,
                  descale_q=None, descale_k=None, out=None):
    """``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])`` per the contract above."""
    fp8 = q.dtype == torch.float8_e4m3fn
    if k_cache.dtype != q.dtype and k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16,
                                                      torch.float16):
        # the library's own check (csrc/api: TORCH_CHECK(kcache.dtype() == q_dtype, ...)): kept, so an
        # engine handing FlashMLA a cache of another dtype fails here as it would on the GPU
        raise RuntimeError("query and key must have the same dtype")
    if fp8:
        check_dtype("k_cache", k_cache, (torch.float8_e4m3fn,))
        if descale_q is None or descale_k is None:
            raise OutOfContractError("descale_q", "the dense fp8 kernel needs descale_q and descale_k")
        out_dtype = torch.bfloat16
    else:
        check_dtype("q", q, (torch.bfloat16, torch.float16))
        if k_cache.dtype != q.dtype:
            raise OutOfContractError("k_cache", f"dtype {k_cache.dtype} differs from q's {q.dtype}")
        out_dtype = q.dtype
    check_dtype("block_table", block_table, (torch.int32,))
    _check_lengths(cache_seqlens)
    if q.dim() != 4 or k_cache.dim() != 4:
        raise OutOfContractError("q", f"expects q [b, s_q, h_q, d] and k_cache [blocks, 64, h_k, d], got "
                                      f"{tuple(q.shape)} and {tuple(k_cache.shape)}")
    b, s_q, h_q, d = q.shape
    _, page, h_k, d_k = k_cache.shape
    if d_k != d:
        raise OutOfContractError("head_dim", f"q head dim {d}, cache {d_k}: the emulation models one width for both")
    # The library's own dimension checks (csrc/api/dense_decode.h: TORCH_CHECK(head_size_k == 576 || head_size_k ==
    # 512, ...), the fp8 op's head_size_k == 576, head_size_v == 512): kept, so a model whose latent is not DeepSeek's
    # (Mistral Small 4's 320, MiniCPM3's 288) fails here as it does on the GPU instead of going unchecked.
    if d not in ((576,) if fp8 else (576, 512)):
        raise RuntimeError("Only head_size_k == 576 is supported" if fp8 else
                           "Only head_size_k == 576 or 512 is supported")
    if head_dim_v != HEAD_DIM_V:
        raise RuntimeError("Only head_size_v == 512 is supported")
    if page != PAGE_BLOCK_SIZE:
        raise OutOfContractError("page_block_size", f"{page}: the kernel supports pages of 64 tokens only")
    if h_q % h_k:
        raise OutOfContractError("num_heads", f"h_q {h_q} is not a multiple of h_k {h_k}")
    if block_table.shape[0] != b or cache_seqlens.shape[0] != b:
        raise OutOfContractError("block_table", f"block_table {tuple(block_table.shape)} / cache_seqlens "
                                                f"{tuple(cache_seqlens.shape)} do not have b = {b} rows")
    scale = float(softmax_scale) if softmax_scale is not None else d ** -0.5
    is_causal = bool(causal) and s_q > 1
    res = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)  # +inf: nothing attended
    group = h_q // h_k
    for i in range(b):
        n = int(cache_seqlens[i])
        if n == 0:
            continue
        rows = gather_pages(k_cache, block_table[i], n, flag="block_table")  # [n, h_k, d]
        k = as_float64(rows, descale_k if fp8 else None).repeat_interleave(group, dim=1)  # [n, h_q, d]
        qi = as_float64(q[i], descale_q if fp8 else None)  # [s_q, h_q, d]
        scores = torch.einsum("qhd,nhd->hqn", qi, k) * scale
        visible = bottom_right_visible(s_q, torch.arange(n), n, causal=is_causal)
        o, l = attend(scores, k[..., :head_dim_v], visible)
        res[i] = o
        lse[i] = torch.where(torch.isneginf(l), math.inf, l)
    return write_out(res, out, out_dtype, q.device), lse.to(torch.float32).to(q.device)


def dense_decode_fwd(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
                     tile_scheduler_metadata=None, num_splits=None, out=None):
    """``torch.ops._flashmla_C.dense_decode_fwd``: ``(out, lse, tile_scheduler_metadata, num_splits)``.

    Without metadata the schedule is built from this call's lengths (and
    returned, as the op does); with it, it must have been built for them.
    """
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata, num_splits = _schedule(cache_seqlens, False)
    else:
        _check_schedule(tile_scheduler_metadata, num_splits, cache_seqlens, False)
    o, lse = _dense_decode(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal, out=out)
    return o, lse, tile_scheduler_metadata, num_splits


def fwd_kvcache_mla_fp8(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
                        tile_scheduler_metadata, num_splits, descale_q, descale_k):
    """``torch.ops._flashmla_extension_C.fwd_kvcache_mla_fp8``: dense fp8 decode, ``(out bf16, lse)``."""
    check_dtype("q", q, (torch.float8_e4m3fn,))
    _check_schedule(tile_scheduler_metadata, num_splits, cache_seqlens, True)
    return _dense_decode(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
                         descale_q=descale_q, descale_k=descale_k)


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: Optional[bool] = None,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    enable_batch_invariant: bool = False,
    use_legacy: bool = False,
    kv_format: Optional[str] = None,
    descale_q: Optional[torch.Tensor] = None,
    descale_k: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_mla.flash_mla_with_kvcache`` of sgl-flash-mla 1.0.0, dense decode only; ``(out, lse)``."""
    # The wheel's own Python checks, in its order and with its exception type.
    assert isinstance(tile_scheduler_metadata, FlashMLASchedMeta), \
        "tile_scheduler_metadata must be of type FlashMLASchedMeta"
    assert num_splits is None, "num_splits must be None"
    for flag, value in (("indices", indices), ("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache), ("topk_length", topk_length),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise OutOfContractError(flag, "sparse decoding is not modelled")
    if enable_batch_invariant:
        raise OutOfContractError("enable_batch_invariant", "not modelled")
    if is_fp8_kvcache is None:
        is_fp8_kvcache = False  # the wheel infers it from `indices`, None here
    assert use_legacy, ("Sparse attention is required: `indices` must be provided. Dense MLA decoding was "
                        "removed from the current kernels; pass use_legacy=True to reach the legacy one")
    assert kv_format is None, "kv_format does not apply to dense decoding"
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    sched = tile_scheduler_metadata
    if is_fp8_kvcache:
        assert sched.tile_scheduler_metadata is not None, (
            "dense fp8 decoding needs metadata from get_mla_decoding_metadata(..., "
            "is_fp8_kvcache=True, use_legacy=True) before the first call")
        return fwd_kvcache_mla_fp8(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
                                   sched.tile_scheduler_metadata, sched.num_splits, descale_q, descale_k)
    assert descale_q is None and descale_k is None, "descale_q/descale_k apply to the dense fp8 path only"
    out, lse, sched.tile_scheduler_metadata, sched.num_splits = dense_decode_fwd(
        q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
        sched.tile_scheduler_metadata, sched.num_splits)
    return out, lse


# --------------------------------------------------------------------------------------------
# sglang-kernel's flash_mla module (0.4.9 / 0.4.10): the same kernels behind an older Python API
# --------------------------------------------------------------------------------------------


def sgl_kernel_get_mla_metadata(
    cache_seqlens: Optional[torch.Tensor] = None,
    num_q_tokens_per_head_k: Optional[int] = None,
    num_heads_k: Optional[int] = None,
    num_heads_q: Optional[int] = None,
    is_fp8_kvcache: bool = False,
    topk: Optional[int] = None,
):
    """``sgl_kernel.flash_mla.get_mla_metadata``: tensors for given lengths, else an empty ``FlashMLASchedMeta``."""
    if cache_seqlens is None:
        return FlashMLASchedMeta(), None
    assert num_q_tokens_per_head_k is not None
    assert num_heads_k is not None
    if topk is not None:
        raise OutOfContractError("topk", "sparse decoding schedules are not modelled")
    if is_fp8_kvcache:  # the wheel: get_mla_decoding_metadata_dense_fp8 when topk is None
        return get_mla_decoding_metadata_dense_fp8(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)
    _check_lengths(cache_seqlens)
    return _schedule(cache_seqlens, False)


def sgl_kernel_flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: Optional[torch.Tensor],
    cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int,
    tile_scheduler_metadata,
    num_splits: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    descale_q: Optional[torch.Tensor] = None,
    descale_k: Optional[torch.Tensor] = None,
    is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None,
    attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None,
    extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    extra_topk_length: Optional[torch.Tensor] = None,
    kv_format: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sgl_kernel.flash_mla.flash_mla_with_kvcache``, dense decode only; ``(out, lse)``.

    The wheel's own assertions are kept in its order. Tensor metadata: an
    fp8 query (``element_size() == 1``) goes to the dense fp8 op with the
    descales, any other to the bf16 op, both with the schedule the caller
    built (``is_fp8_kvcache`` with a bf16 query is that op's sparse/packed
    cache mode: not modelled). ``FlashMLASchedMeta``: the first call fixes the
    shapes, later calls must match them, and the schedule is (re)built by
    the op as ``dense_decode_fwd`` does.
    """
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    for flag, value in (("indices", indices), ("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices_in_kvcache), ("topk_length", topk_length),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise OutOfContractError(flag, "sparse decoding is not modelled")
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        sched = tile_scheduler_metadata
        assert num_splits is None, "num_splits must be None with FlashMLASchedMeta"
        shape = (q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache)
        if not sched.have_initialized:
            sched.have_initialized = True
            sched.config = FlashMLASchedMeta.Config(*shape, topk=None, extra_page_block_size=None, extra_topk=None,
                                                    enable_batch_invariant=False)
        else:
            c = sched.config
            assert c is not None
            assert (c.b, c.s_q, c.h_q, c.page_block_size, c.h_k, c.causal, c.is_fp8_kvcache) == shape, (
                " Input arguments are inconsistent with FlashMLASchedMeta. Reuse a "
                "scheduler only for matching tensor shapes and sparse settings.")
        assert kv_format is None, "kv_format only applies to sparse attention"
        assert block_table is not None and cache_seqlens is not None
        out, lse, sched.tile_scheduler_metadata, sched.num_splits = dense_decode_fwd(
            q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
            sched.tile_scheduler_metadata, sched.num_splits)
        return out, lse
    assert num_splits is not None
    assert block_table is not None
    assert cache_seqlens is not None
    assert (descale_q is None) == (descale_k is None), (
        "descale_q and descale_k should be both None or both not None")
    assert kv_format is None, "kv_format only applies to sparse attention"
    if q.element_size() == 1:
        return fwd_kvcache_mla_fp8(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal,
                                   tile_scheduler_metadata, num_splits, descale_q, descale_k)
    if is_fp8_kvcache:
        raise OutOfContractError("is_fp8_kvcache", "with a 16-bit query (the op's packed fp8 cache) is not modelled")
    if descale_q is not None:
        raise OutOfContractError("descale_q", "the bf16 op takes no descales")
    _check_schedule(tile_scheduler_metadata, num_splits, cache_seqlens, False)
    return _dense_decode(q, k_cache, head_dim_v, cache_seqlens, block_table, softmax_scale, causal)


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "flash_mla:get_mla_metadata": get_mla_metadata,
    "flash_mla:get_mla_decoding_metadata": get_mla_decoding_metadata,
    "flash_mla:flash_mla_with_kvcache": flash_mla_with_kvcache,
    "flash_mla.flash_mla_interface:FlashMLASchedMeta": FlashMLASchedMeta,
    "torch.ops._flashmla_C:dense_decode_fwd": dense_decode_fwd,
    "torch.ops._flashmla_extension_C:fwd_kvcache_mla_fp8": fwd_kvcache_mla_fp8,
    "torch.ops._flashmla_extension_C:get_mla_decoding_metadata_dense_fp8": get_mla_decoding_metadata_dense_fp8,
    "sgl_kernel.flash_mla:get_mla_metadata": sgl_kernel_get_mla_metadata,
    "sgl_kernel.flash_mla:flash_mla_with_kvcache": sgl_kernel_flash_mla_with_kvcache,
}
