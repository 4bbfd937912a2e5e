"""FlashMLA's sparse attention (DeepSeek Sparse Attention, DeepSeek-V3.2), emulated in float64: vLLM 0.34.0's ops.

Emulated callables (see ``EMULATIONS`` at the bottom):

* ``torch.ops._flashmla_C:sparse_prefill_fwd``: the token-level sparse
  "prefill" kernel over a flat bf16 KV (vLLM's FLASHMLA_SPARSE calls it, via
  its vendored ``flash_mla_sparse_fwd``, for every row of a bf16 cache and for
  the prefill rows of an fp8 cache after upconverting them);
* ``torch.ops._flashmla_C:sparse_decode_fwd``: the sparse decode kernel over
  the FP8 ("FP8 with scale", 656 bytes per token) paged cache (vLLM's vendored
  ``flash_mla_with_kvcache(..., indices=..., is_fp8_kvcache=True)``);
* ``flash_mla:flash_mla_sparse_fwd``: FlashMLA's own Python entry to the
  prefill kernel (no ``out`` argument).

vLLM's Python around them (``vllm/third_party/flashmla/flash_mla_interface.py``,
``FlashMLASchedMeta``, its asserts) is vLLM's vendored code and runs as is.

The contract, all in one place (sources in brackets; FlashMLA at
9241ae3e, 2026-04-29, and vLLM 0.34.0's vendored ``flash_mla_interface.py``):

* **Prefill** ``sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, attn_sink,
  topk_length, out)``: ``q [s_q, h_q, d_qk]`` bf16, ``kv [s_kv, h_kv, d_qk]``
  bf16 with ``h_kv == 1``, ``indices [s_q, h_kv, topk]`` int32, ``d_qk`` 576
  or 512, ``d_v == 512`` (V is the first 512 columns of each KV row). Query
  ``i`` attends the KV rows ``indices[i, 0, :]``; an entry is **invalid when
  ``< 0`` or ``>= s_kv``** (any such value, e.g. ``-1``, ``-2**31``, ``2**31-1``:
  masked, never read; so no out-of-range read is possible here) and, with
  ``topk_length [s_q]``, when its position ``j >= topk_length[i]``. Duplicate
  valid entries count once each. Returns ``(out [s_q, h_q, 512] bf16,
  max_logits [s_q, h_q] f32, lse [s_q, h_q] f32)``, all **natural-log units**:
  ``max_logits = max_j sm_scale·q·k_j``, ``lse = log Σ_j exp(sm_scale·q·k_j)``.
  [csrc/api/sparse_fwd.h (checks, shapes); csrc/sm90/prefill/sparse/phase1.cuh:485
  ``is_cur_token_valid = t >= 0 && t < s_kv``, :448-449 ``max_logits = rM·ln2``,
  ``lse = logf(rL) + rM·ln2``; tests/ref.py ``ref_sparse_attn_fwd``; tests/lib.py's
  invalid candidates. The README's "equivalent PyTorch" gives a base-2 LSE: it
  contradicts the kernel and the test, which agree on the natural log.]
  ``h_q`` 64 or 128, or 8/16/32 (vLLM's vendored build: SM90 takes them, SM100
  only 64/128 — the emulation accepts all five); ``out`` (optional) is the
  caller's bf16 ``[s_q, h_q, 512]`` buffer, written and returned.
* **Decode** ``sparse_decode_fwd(q, k_cache, indices, topk_length, attn_sink,
  tile_scheduler_metadata, num_splits, extra_k_cache, extra_indices,
  extra_topk_length, head_dim_v, softmax_scale, out, enable_batch_invariant)``:
  ``q [b, s_q, h_q, 576]`` bf16 with ``h_q`` 64 or 128; ``k_cache
  [num_blocks, page_block_size, 1, 656]`` uint8/int8/e4m3 bytes, each page
  contiguous (``stride(1) == 656``); ``indices [b, s_q, topk]`` int32 of **flat
  token rows of the paged cache**: ``block · page_block_size + offset`` (no
  block table is read). Only ``-1`` is invalid (masked, never read); any other
  entry outside ``[0, num_blocks · page_block_size)`` raises ``OutOfRangeRead``
  (the kernel's ``(uint32)token / page_block_size`` would read foreign memory).
  With ``topk_length [b]``, positions ``j >= topk_length[batch]`` are never read
  (garbage there is ignored; vLLM passes it on SM100 only, the SM90 V3.2 kernel
  rejects it — not modelled: accepted). Returns ``(out [b, s_q, h_q, 512] bf16,
  lse [b, h_q, s_q] f32`` natural log (the kernel's ``[b, s_q, h_q]`` buffer
  transposed, as the op returns it), ``tile_scheduler_metadata, num_splits)``.
  [csrc/api/sparse_decode.h; csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:340
  ``lse = logf(L) + M/log2e``, :534-615 ``token_index == -1``; tests/ref.py
  ``ref_sparse_attn_decode``; README "Sparse Attention (indices tensor)"]
* **The 656-byte token** (V3.2 "FP8 with scale"): bytes ``[0, 512)`` are 512
  e4m3 NoPE values, ``[512, 528)`` four little-endian float32 scales (scale
  ``t`` multiplies NoPE values ``[128t, 128t+128)``), ``[528, 656)`` 64 bf16
  RoPE values (unscaled). The key row is ``[e4m3 · scale (512), rope (64)]``, V
  its first 512 values, dequantised exactly in float64 (the kernel rounds to
  bf16 before its MMA: numerics, not modelled). [README "FP8 KV Cache";
  tests/quant.py ``quantize_k_cache`` / ``dequantize_k_cache`` (V32_FP8Sparse)]
* **Scale**: scores ``softmax_scale · q·k`` with the caller's scale (the
  Python wrappers default it to ``d_qk ** -0.5``; the ops take it as given).
* **A row with no valid entry** (all ``-1``, or ``topk_length == 0``): ``out =
  0``, ``lse = +inf`` (not ``-inf``), prefill ``max_logits = -inf``.
  [phase1.cuh:447-449; splitkv_mla.cuh:340; tests/ref.py ``lonely_q_mask``]
* **Attention sink** ``attn_sink [h_q]`` f32: ``out ·= 1 / (1 + exp(sink_h -
  lse))`` (``+inf`` zeroes the row, ``-inf`` has no effect); ``lse`` and
  ``max_logits`` unchanged. [interface docstrings; tests/ref.py]
* **Decode schedule**: ``tile_scheduler_metadata`` / ``num_splits`` built by the
  op when ``None`` (and returned, for the caller's ``FlashMLASchedMeta``) and
  otherwise reused only for "the same tensor shapes and the values of ...
  topk_length" [vendored docstring]: the emulated schedule carries a
  fingerprint of ``(b, s_q, h_q, topk, topk_length)`` and a mismatch raises
  ``OutOfContractError("tile_scheduler_metadata")``.
* The library's ``TORCH_CHECK``s on dtypes, ranks, shapes, ``h_kv``, ``d_qk``,
  ``d_v``, ``h_q`` are kept as ``RuntimeError`` (an engine that trips them fails
  on a GPU too).
* Not modelled (raise ``OutOfContractError`` naming the flag): the other cache
  formats FlashMLA infers from the bytes per token (``kv_format``: V4 584, V4.1
  528/288, NVFP4 352), ``extra_k_cache`` / ``extra_indices`` /
  ``extra_topk_length``, ``enable_batch_invariant``, an ``out`` of another shape
  or dtype.
"""

from __future__ import annotations

import math
import zlib
from typing import Optional

import torch

from .glue import OutOfContractError, OutOfRangeRead, write_out

__all__ = [
    "EMULATIONS",
    "V32_BYTES_PER_TOKEN",
    "dequantize_v32",
    "flash_mla_sparse_fwd",
    "sparse_decode_fwd",
    "sparse_prefill_fwd",
]

HEAD_DIM_V = 512
D_NOPE, D_ROPE, TILE, NUM_TILES = 512, 64, 128, 4
V32_BYTES_PER_TOKEN = D_NOPE + NUM_TILES * 4 + 2 * D_ROPE  # 656
_OTHER_FORMATS = {584: "V4 (584 bytes)", 528: "V4.1 (528 bytes)", 288: "V4.1 fp4 (288 bytes)",
                  352: "NVFP4 (352 bytes)"}
_MAGIC = 0x5DA  # first word of an emulated sparse decode schedule row
_PREFILL_HEADS = (8, 16, 32, 64, 128)
_DECODE_HEADS = (64, 128)


def _check(cond: bool, message: str) -> None:
    """The library's ``TORCH_CHECK``: a ``RuntimeError``, as on the GPU."""
    if not cond:
        raise RuntimeError(message)


# --------------------------------------------------------------------------------------------
# The 656-byte V3.2 token
# --------------------------------------------------------------------------------------------


def dequantize_v32(rows: torch.Tensor) -> torch.Tensor:
    """``[n, 656]`` cache bytes (any 1-byte dtype) -> ``[n, 576]`` float64 key rows (V: the first 512)."""
    raw = rows.detach().to("cpu").contiguous().view(torch.uint8)
    _check(raw.shape[-1] == V32_BYTES_PER_TOKEN, f"expects {V32_BYTES_PER_TOKEN} bytes per token")
    nope = raw[:, :D_NOPE].contiguous().view(torch.float8_e4m3fn).to(torch.float64)  # [n, 512]
    scales = raw[:, D_NOPE:D_NOPE + 4 * NUM_TILES].contiguous().view(torch.float32).to(torch.float64)  # [n, 4]
    rope = raw[:, D_NOPE + 4 * NUM_TILES:].contiguous().view(torch.bfloat16).to(torch.float64)  # [n, 64]
    nope = (nope.view(-1, NUM_TILES, TILE) * scales[:, :, None]).view(-1, D_NOPE)
    return torch.cat([nope, rope], dim=-1)


# --------------------------------------------------------------------------------------------
# One query row: attention over its selected keys
# --------------------------------------------------------------------------------------------


def _attend_rows(q: torch.Tensor, keys: torch.Tensor, scale: float, sink: Optional[torch.Tensor]):
    """q ``[h, d]``, keys ``[n, d]`` (float64) -> ``(out [h, 512], max_logit [h], lse [h])``, natural log."""
    h = q.shape[0]
    if keys.shape[0] == 0:
        return (torch.zeros(h, HEAD_DIM_V, dtype=torch.float64), torch.full((h,), -math.inf, dtype=torch.float64),
                torch.full((h,), math.inf, dtype=torch.float64))
    scores = (q @ keys.T) * scale  # [h, n]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[:, None]) @ keys[:, :HEAD_DIM_V]
    if sink is not None:
        out = out * torch.sigmoid(lse - sink)[:, None]  # 1 / (1 + exp(sink - lse)); +inf -> 0, -inf -> 1
    return out, scores.max(dim=-1).values, lse


def _as_sink(attn_sink: Optional[torch.Tensor], h_q: int) -> Optional[torch.Tensor]:
    if attn_sink is None:
        return None
    _check(attn_sink.dim() == 1 and attn_sink.shape[0] == h_q, "attn_sink must have shape [h_q]")
    _check(attn_sink.dtype == torch.float32, "attn_sink must have dtype float32")
    return attn_sink.detach().to("cpu", torch.float64)


# --------------------------------------------------------------------------------------------
# Prefill: flat bf16 KV, invalid = outside [0, s_kv)
# --------------------------------------------------------------------------------------------


def sparse_prefill_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                       attn_sink: Optional[torch.Tensor] = None, topk_length: Optional[torch.Tensor] = None,
                       out: Optional[torch.Tensor] = None):
    """``torch.ops._flashmla_C.sparse_prefill_fwd``: ``(out, max_logits, lse)`` per the contract above."""
    _check(q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3, "q, kv and indices must be 3-D")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    topk = indices.shape[2]
    _check(d_qk in (576, 512), f"Invalid d_qk: {d_qk}")
    _check(d_v == HEAD_DIM_V, f"Invalid d_v{d_v}")
    _check(q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, "q and kv must have dtype bfloat16")
    _check(indices.dtype == torch.int32, "indices must have dtype int32")
    _check(tuple(kv.shape) == (s_kv, h_kv, d_qk), "kv must have shape [s_kv, h_kv, d_qk]")
    _check(tuple(indices.shape) == (s_q, h_kv, topk), "indices must have shape [s_q, h_kv, topk]")
    _check(h_kv == 1, "h_kv must be 1")
    _check(h_q in _PREFILL_HEADS, f"Unsupported h_q: {h_q}")
    if topk_length is not None:
        _check(topk_length.dtype == torch.int32 and tuple(topk_length.shape) == (s_q,),
               "topk_length must be int32 of shape [s_q]")
    sink = _as_sink(attn_sink, h_q)
    scale = float(sm_scale)
    idx = indices.detach().to("cpu", torch.int64)[:, 0, :]  # [s_q, topk]
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk)[None, :] < topk_length.detach().to("cpu", torch.int64)[:, None]
    kv64 = kv.detach().to("cpu", torch.float64)[:, 0, :]  # [s_kv, d]
    q64 = q.detach().to("cpu", torch.float64)
    res = torch.empty(s_q, h_q, HEAD_DIM_V, dtype=torch.float64)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float64)
    lse = torch.empty(s_q, h_q, dtype=torch.float64)
    for i in range(s_q):
        res[i], max_logits[i], lse[i] = _attend_rows(q64[i], kv64[idx[i][valid[i]]], scale, sink)
    return (write_out(res, out, torch.bfloat16, q.device), max_logits.to(torch.float32).to(q.device),
            lse.to(torch.float32).to(q.device))


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                         attn_sink: Optional[torch.Tensor] = None, topk_length: Optional[torch.Tensor] = None):
    """``flash_mla.flash_mla_sparse_fwd`` (FlashMLA's Python entry): the prefill op, ``(out, max_logits, lse)``."""
    return sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


# --------------------------------------------------------------------------------------------
# Decode: paged FP8 (656-byte) cache, invalid = -1, a schedule reused only for its lengths
# --------------------------------------------------------------------------------------------


def _fingerprint(b: int, s_q: int, h_q: int, topk: int, topk_length: Optional[torch.Tensor]) -> int:
    lengths = b"" if topk_length is None else topk_length.detach().to("cpu", torch.int64).numpy().tobytes()
    return zlib.crc32(repr((b, s_q, h_q, topk, topk_length is None)).encode() + lengths) & 0x7FFFFFFF


def _schedule(b: int, fingerprint: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    tsm = torch.zeros(1, 8, dtype=torch.int32)
    tsm[0, 0], tsm[0, 1], tsm[0, 2] = _MAGIC, b, fingerprint
    return tsm.to(device), torch.arange(b + 1, dtype=torch.int32).to(device)


def _check_schedule(tsm: torch.Tensor, num_splits: Optional[torch.Tensor], b: int, fingerprint: int) -> None:
    row = tsm.detach().to("cpu", torch.int64).flatten()
    if row.numel() < 3 or int(row[0]) != _MAGIC:
        raise OutOfContractError("tile_scheduler_metadata", "not built by the emulated sparse decode (cannot tell "
                                                            "which shapes and topk_length it schedules)")
    if int(row[1]) != b or int(row[2]) != fingerprint:
        raise OutOfContractError("tile_scheduler_metadata", "built for other shapes or topk_length than this call's: "
                                                            "FlashMLA reuses a schedule only when they stay the same")
    if num_splits is None or num_splits.numel() != b + 1:
        raise OutOfContractError("num_splits", f"missing or not of b + 1 = {b + 1} entries")


def sparse_decode_fwd(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor,
                      topk_length: Optional[torch.Tensor] = None, attn_sink: Optional[torch.Tensor] = None,
                      tile_scheduler_metadata: Optional[torch.Tensor] = None,
                      num_splits: Optional[torch.Tensor] = None, extra_k_cache: Optional[torch.Tensor] = None,
                      extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                      extra_topk_length: Optional[torch.Tensor] = None, head_dim_v: int = 512,
                      softmax_scale: float = 576 ** -0.5, out: Optional[torch.Tensor] = None,
                      enable_batch_invariant: bool = False):
    """``torch.ops._flashmla_C.sparse_decode_fwd``: ``(out, lse, tile_scheduler_metadata, num_splits)``."""
    for flag, value in (("extra_k_cache", extra_k_cache), ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            raise OutOfContractError(flag, "the extra KV scope (DeepSeek V4 layouts) is not modelled")
    if enable_batch_invariant:
        raise OutOfContractError("enable_batch_invariant", "not modelled")
    _check(q.dim() == 4 and k_cache.dim() == 4 and indices.dim() == 3, "q, kv must be 4-D and indices 3-D")
    b, s_q, h_q, d_qk = q.shape
    num_blocks, page_block_size, h_kv, bytes_per_token = k_cache.shape
    topk = indices.shape[2]
    _check(b > 0 and s_q > 0 and h_q > 0 and topk > 0, "b, s_q, h_q and topk must be positive")
    _check(h_kv == 1, "Currently only MQA (i.e. h_kv == 1) is supported for sparse decoding")
    _check(d_qk in (576, 512), "Only head_size_k == 576 or 512 is supported for sparse decoding")
    _check(head_dim_v == HEAD_DIM_V, "Only head_size_v == 512 is supported for sparse decoding")
    _check(q.dtype == torch.bfloat16, "q must have dtype bfloat16")
    _check(k_cache.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8),
           "key must have dtype fp8_e4m3fn, int8 or uint8")
    _check(indices.dtype == torch.int32, "indices must have dtype int32")
    if d_qk != 576 or bytes_per_token != V32_BYTES_PER_TOKEN:
        raise OutOfContractError("kv_format", f"d_qk {d_qk} with {bytes_per_token} bytes per token "
                                              f"({_OTHER_FORMATS.get(bytes_per_token, 'unknown')}): only "
                                              "DeepSeek-V3.2's 656-byte FP8 format is modelled")
    _check(k_cache.stride(1) == bytes_per_token,
           "The whole block must be contiguous when is_fp8_cache is True for kv cache")
    _check(tuple(indices.shape) == (b, s_q, topk), "indices must have shape [b, s_q, topk]")
    if topk_length is not None:
        _check(topk_length.dtype == torch.int32 and tuple(topk_length.shape) == (b,),
               "topk_length must be int32 of shape [b]")
    _check(h_q in _DECODE_HEADS, f"Unsupported h_q: {h_q}")
    sink = _as_sink(attn_sink, h_q)
    fingerprint = _fingerprint(b, s_q, h_q, topk, topk_length)
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata, num_splits = _schedule(b, fingerprint, q.device)
    else:
        _check(tile_scheduler_metadata.dtype == torch.int32, "tile_scheduler_metadata must have dtype int32")
        _check_schedule(tile_scheduler_metadata, num_splits, b, fingerprint)

    idx = indices.detach().to("cpu", torch.int64)  # [b, s_q, topk]
    read = torch.ones_like(idx, dtype=torch.bool)
    if topk_length is not None:
        read &= torch.arange(topk)[None, None, :] < topk_length.detach().to("cpu", torch.int64)[:, None, None]
    read &= idx != -1
    total_rows = num_blocks * page_block_size
    bad = read & ((idx < 0) | (idx >= total_rows))
    if bool(bad.any()):
        where = tuple(int(v) for v in bad.nonzero()[0])
        raise OutOfRangeRead("indices", f"index {int(idx[where])} at {where} is outside [0, {total_rows}) "
                                        f"({num_blocks} blocks of {page_block_size}) and is not -1: the kernel "
                                        "would read unmapped or foreign rows")
    used = torch.unique(idx[read])  # the rows the kernel reads, dequantised once
    pages = k_cache.detach()[:, :, 0, :]
    blocks = torch.div(used, page_block_size, rounding_mode="floor")
    keys = dequantize_v32(pages[blocks.to(pages.device), (used % page_block_size).to(pages.device)])
    row_of = {int(t): r for r, t in enumerate(used.tolist())}
    q64 = q.detach().to("cpu", torch.float64)
    scale = float(softmax_scale)
    res = torch.empty(b, s_q, h_q, HEAD_DIM_V, dtype=torch.float64)
    lse = torch.empty(b, s_q, h_q, dtype=torch.float64)
    for i in range(b):
        for s in range(s_q):
            rows = [row_of[int(t)] for t in idx[i, s][read[i, s]].tolist()]
            res[i, s], _, lse[i, s] = _attend_rows(q64[i, s], keys[rows], scale, sink)
    lse_out = lse.to(torch.float32).to(q.device).transpose(1, 2)  # the op returns its [b, s_q, h_q] buffer transposed
    return write_out(res, out, torch.bfloat16, q.device), lse_out, tile_scheduler_metadata, num_splits


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "torch.ops._flashmla_C:sparse_prefill_fwd": sparse_prefill_fwd,
    "torch.ops._flashmla_C:sparse_decode_fwd": sparse_decode_fwd,
    "flash_mla:flash_mla_sparse_fwd": flash_mla_sparse_fwd,
}
