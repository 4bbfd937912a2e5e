"""CUTLASS MLA decode (SM100) as vLLM 0.34.0 binds it, in float64: ``vllm._custom_ops.sm100_cutlass_mla_*``.

Read from vLLM's ``csrc/libtorch_stable/attention/mla/sm100_cutlass_mla_kernel.cu``,
``csrc/attention/mla/cutlass_sm100_mla/device/sm100_mla.hpp`` and
``kernel/sm100_fmha_mla_reduction.hpp``. The contract, all in one place:

* ``sm100_cutlass_mla_decode(out, lse, q_nope, q_pe, kv_c_and_k_pe_cache,
  seq_lens, page_table, workspace, scale, num_kv_splits)`` writes into the
  caller's buffers and returns ``out``.
* ``q_nope [B, H, 512]``, ``q_pe [B, H, 64]`` (one query token per request);
  the problem shape's head count is the tile's **128**: ``out [B, 128, 512]``
  and ``lse [B, 128]`` (strides ``H·D_latent`` and ``H`` with ``H = 128``), so
  a caller with fewer heads must allocate 128 and slice; rows past ``q``'s
  heads are left untouched here (the kernel computes them from whatever
  memory lies past ``q``'s heads — garbage by contract).
* ``kv_c_and_k_pe_cache [num_pages, page_size, 576]``: the first 512 columns
  are the latent (V), the last 64 the rope part of K. ``page_table [B,
  pages_per_seq]`` int32, ``seq_lens [B]`` int32; only the pages holding a
  request's ``seq_lens`` tokens are read, each must be a valid page id.
* dtypes: q / cache fp16, bf16 (out in the same dtype) or ``float8_e4m3fn``
  (out **bf16**); q and cache share one dtype. No descale argument exists:
  an fp8 cache is read as its raw values (vLLM raises before the call for
  ``q_scale != 1`` or ``k_scale != 1``).
* Scores ``scale · (q_nope·c + q_pe·k_pe)``; ``lse`` is the **natural log**
  (``logf(sum) + max`` in the reduction kernel).
* An empty sequence gives ``out = 0`` and ``lse = +inf`` (the reduction's
  ``sum == 0 ? +inf``; the unsplit epilogue is assumed to agree — only an
  SM100 GPU test can confirm it).
* ``sm100_cutlass_mla_get_workspace_size(max_seq_len, num_batches, sm_count,
  num_kv_splits)``: vLLM's ``set_split_kv`` heuristic (``num_kv_splits <= 0``:
  ``min(16, ceil(max_seq_len / 128))`` splits, 1 when ``num_batches > 1``,
  wave-aware), times the float accumulators of the split (``split · B · 128 ·
  (512 + 1) · 4`` bytes, 0 for one split) — the accumulator layout of the
  reduction kernel. The decode does not check the workspace it is given: the
  exact size formula of the mainloop kernel was not read, so sizing bugs are
  outside what this emulation can catch.
"""

from __future__ import annotations

import math

import torch

from .glue import OutOfContractError, as_float64, attend, check_dtype, gather_pages

__all__ = ["EMULATIONS", "MAX_HEADS", "sm100_cutlass_mla_decode", "sm100_cutlass_mla_get_workspace_size"]

MAX_HEADS = 128
D_LATENT = 512
D_ROPE = 64


def _split_kv(max_seq_len: int, num_batches: int, sm_count: int, num_kv_splits: int) -> int:
    if num_kv_splits >= 1:
        return int(num_kv_splits)
    max_splits = min(16, -(-int(max_seq_len) // 128))
    if num_batches > 1:
        max_splits = min(1, max_splits)
    sms_per_batch = max(1, sm_count // max(num_batches, 1))
    split_heur = max(1, min(max_splits, sms_per_batch))
    k_waves = -(-max_splits // split_heur)
    return max(1, -(-max_splits // max(k_waves, 1)))


def sm100_cutlass_mla_get_workspace_size(max_seq_len: int, num_batches: int, sm_count: int,
                                         num_kv_splits: int) -> int:
    """``vllm._custom_ops.sm100_cutlass_mla_get_workspace_size`` (see the module docstring)."""
    split = _split_kv(max_seq_len, num_batches, sm_count if sm_count > 0 else 148, num_kv_splits)
    if split <= 1:
        return 0
    return split * int(num_batches) * MAX_HEADS * (D_LATENT + 1) * 4


def sm100_cutlass_mla_decode(out, lse, q_nope, q_pe, kv_c_and_k_pe_cache, seq_lens, page_table, workspace,
                             scale, num_kv_splits):
    """``vllm._custom_ops.sm100_cutlass_mla_decode``: fills ``out`` (and ``lse`` when defined), returns ``out``."""
    check_dtype("q_nope", q_nope, (torch.float16, torch.bfloat16, torch.float8_e4m3fn))
    if q_pe.dtype != q_nope.dtype or kv_c_and_k_pe_cache.dtype != q_nope.dtype:
        raise OutOfContractError("q_pe", f"dtypes q_nope {q_nope.dtype}, q_pe {q_pe.dtype}, cache "
                                         f"{kv_c_and_k_pe_cache.dtype}: one dtype is required")
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    check_dtype("page_table", page_table, (torch.int32,))
    if q_nope.dim() != 3 or q_nope.shape[-1] != D_LATENT or q_pe.shape[-1] != D_ROPE:
        raise OutOfContractError("q_nope", f"expects q_nope [B, H, 512] and q_pe [B, H, 64], got "
                                           f"{tuple(q_nope.shape)} / {tuple(q_pe.shape)}")
    b, h, _ = q_nope.shape
    if h > MAX_HEADS:
        raise OutOfContractError("q_nope", f"{h} heads: the kernel's tile holds {MAX_HEADS}")
    cache = kv_c_and_k_pe_cache
    if cache.dim() != 3 or cache.shape[-1] != D_LATENT + D_ROPE:
        raise OutOfContractError("kv_c_and_k_pe_cache", f"expects [pages, page_size, 576], got {tuple(cache.shape)}")
    out_dtype = torch.bfloat16 if q_nope.dtype == torch.float8_e4m3fn else q_nope.dtype
    if tuple(out.shape) != (b, MAX_HEADS, D_LATENT) or out.dtype != out_dtype:
        raise OutOfContractError("out", f"{out.dtype} {tuple(out.shape)}: the kernel writes {out_dtype} "
                                        f"[{b}, {MAX_HEADS}, {D_LATENT}] (heads padded to the tile)")
    has_lse = lse is not None and lse.numel() > 0
    if has_lse and (tuple(lse.shape) != (b, MAX_HEADS) or lse.dtype != torch.float32):
        raise OutOfContractError("lse", f"{lse.dtype} {tuple(lse.shape)}: the kernel writes float32 [{b}, {MAX_HEADS}]")
    if page_table.dim() != 2 or page_table.shape[0] != b or seq_lens.shape[0] != b:
        raise OutOfContractError("page_table", f"page_table {tuple(page_table.shape)} / seq_lens "
                                               f"{tuple(seq_lens.shape)} for {b} requests")
    lens = seq_lens.to("cpu", torch.int64)
    if bool((lens < 0).any()):
        raise OutOfContractError("seq_lens", f"negative length in {lens.tolist()}")
    capacity = cache.shape[1] * page_table.shape[1]
    if b and int(lens.max()) > capacity:
        raise OutOfContractError("seq_lens", f"a length above page_size x pages_per_seq = {capacity}, the kernel's "
                                             "max_seq_len")
    res = torch.zeros(b, h, D_LATENT, dtype=torch.float64)
    lse_e = torch.full((b, h), math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        rows = as_float64(gather_pages(cache, page_table[i], n, flag="page_table"))  # [n, 576]
        scores = (torch.einsum("hd,nd->hn", as_float64(q_nope[i]), rows[:, :D_LATENT])
                  + torch.einsum("hd,nd->hn", as_float64(q_pe[i]), rows[:, D_LATENT:])) * float(scale)
        o, l = attend(scores[:, None, :], rows[:, None, :D_LATENT].expand(n, h, D_LATENT),
                      torch.ones(1, n, dtype=torch.bool))
        res[i] = o[0]
        lse_e[i] = l[:, 0]
    out[:, :h].copy_(res.to(out_dtype).to(out.device))
    if has_lse:
        lse[:, :h].copy_(lse_e.to(torch.float32).to(lse.device))
    return out


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "vllm._custom_ops:sm100_cutlass_mla_decode": sm100_cutlass_mla_decode,
    "vllm._custom_ops:sm100_cutlass_mla_get_workspace_size": sm100_cutlass_mla_get_workspace_size,
}
