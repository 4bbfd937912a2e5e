"""vLLM's compiled MLA-prefill helpers, emulated in float64: the context gathers and the state merge of ``vllm._custom_ops``.

vLLM sends the rows its MLA metadata builder classes as prefills (speculative
verify rows under DCP, or on a backend whose decode takes one token) through
``MLACommonBaseImpl.forward_mha``: the new tokens' attention (flash-attention's
varlen kernel, ``flash_attn.py``), the cached context gathered from the paged
cache by one of the two gather ops here, attended with the varlen kernel too,
and the two partial states merged by ``merge_attn_states``. Emulated callables
(see ``EMULATIONS`` at the bottom): ``vllm._custom_ops:cp_gather_cache``,
``vllm._custom_ops:gather_and_maybe_dequant_cache`` and
``vllm._custom_ops:merge_attn_states``.

Read from vLLM's ``tests/kernels/attention/test_cache.py``
(``test_cp_gather_cache_mla``, ``test_gather_and_maybe_dequant_cache_mla``:
the references the CUDA kernels are held to), the op schemas in
``vllm/_custom_ops.py`` and the docstring of
``vllm/v1/attention/ops/merge_attn_states.py``. The contract, all in one place:

* Gathers: ``src_cache [num_blocks, block_size, entry]`` (MLA: one latent row
  of ``kv_lora_rank + qk_rope_head_dim`` per token), ``dst [total_tokens,
  entry]``, ``block_table [batch, max_blocks]`` int32, ``cu_seq_lens [batch +
  1]`` int32. Request ``b`` copies its tokens ``seq_starts[b] + i`` for ``i`` in
  ``[0, cu_seq_lens[b+1] - cu_seq_lens[b])`` (``seq_starts`` absent: 0) from
  ``block_table[b, p // block_size]``, offset ``p % block_size``, to
  ``dst[cu_seq_lens[b] + i]``. Rows of ``dst`` past ``cu_seq_lens[-1]`` are left
  untouched. Only the blocks holding those tokens are read; each must be a
  valid block id (raises otherwise).
* ``cp_gather_cache`` copies the values as stored (``dst`` has the cache's
  dtype; an fp8 cache stays raw). ``gather_and_maybe_dequant_cache`` writes
  ``dst``'s dtype: ``kv_cache_dtype == "auto"`` copies, an fp8 cache
  (``"fp8"`` / ``"fp8_e4m3"``, stored as e4m3 bytes) is dequantised as
  ``raw · scale`` (``scale`` a ``[1]`` float32 tensor), vLLM's ``convert_fp8``.
  Its ``token_to_seq`` and ``num_tokens`` must agree with ``cu_seq_lens`` (checked).
* ``merge_attn_states(output, prefix_output, prefix_lse, suffix_output,
  suffix_lse, output_lse=None, prefill_tokens_with_context=None,
  output_scale=None)``: outputs ``[tokens, heads, head_size]``, LSEs ``[heads,
  tokens]`` **natural log**; an LSE of ``+inf`` (FA2's "nothing attended") counts
  as ``-inf``; tokens from ``prefill_tokens_with_context`` on copy the suffix;
  the others are ``Σ exp(lse_x - max) · out_x / Σ exp(lse_x - max)`` and
  ``output_lse = log Σ exp(lse_x)``. A token whose two states are both empty is
  not modelled (raises; the CUDA kernel's result for it was not read).
  ``output_scale`` (fp8 output) is not modelled (raises).
* ``concat_mla_q(ql_nope, q_pe, q_out)`` (the sparse MLA backends' query
  packing, FLASHMLA_SPARSE's ``forward_mqa``): ``q_out[t, h, :512] = ql_nope[t,
  h]``, ``q_out[t, h, 512:576] = q_pe[t, h]`` for the ``num_tokens × num_heads``
  of ``ql_nope``, bit for bit (no LSE, no scale); ``q_out`` may be strided in
  tokens and heads and have more heads (the rest untouched); the kernel is
  instantiated for a 512-wide NoPE and a 64-wide RoPE part in bf16 / fp16, all
  three of one dtype (others raise). [vLLM ``csrc/concat_mla_q.cuh``
  ``ConcatMLAQKernel``; ``tests/kernels/test_concat_mla_q.py``]
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .glue import OutOfContractError, as_float64, check_dtype, check_index_range

__all__ = ["EMULATIONS", "concat_mla_q", "cp_gather_cache", "gather_and_maybe_dequant_cache", "merge_attn_states"]

_FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")


def _gather_rows(src_cache: torch.Tensor, block_table: torch.Tensor, cu_seq_lens: torch.Tensor, batch_size: int,
                 seq_starts: Optional[torch.Tensor]) -> list[tuple[int, torch.Tensor]]:
    """``(dst row, rows [n, entry])`` per request, as stored in ``src_cache``."""
    check_dtype("block_table", block_table, (torch.int32,))
    check_dtype("cu_seq_lens", cu_seq_lens, (torch.int32,))
    if src_cache.dim() != 3:
        raise OutOfContractError("src_cache", f"expects [num_blocks, block_size, entry], got {tuple(src_cache.shape)}")
    cu = cu_seq_lens.to("cpu", torch.int64)
    if cu.numel() < batch_size + 1 or block_table.shape[0] < batch_size:
        raise OutOfContractError("cu_seq_lens", f"{cu.numel()} offsets / {block_table.shape[0]} block-table rows for "
                                                f"{batch_size} requests")
    starts = seq_starts.to("cpu", torch.int64) if seq_starts is not None else torch.zeros(batch_size, dtype=torch.int64)
    block_size = src_cache.shape[1]
    gathered = []
    for b in range(batch_size):
        n = int(cu[b + 1] - cu[b])
        if n < 0:
            raise OutOfContractError("cu_seq_lens", f"decreases at request {b}: {cu.tolist()}")
        if n == 0:
            continue
        positions = int(starts[b]) + torch.arange(n, dtype=torch.int64)
        columns = positions // block_size
        if int(columns.max()) >= block_table.shape[1]:
            raise OutOfContractError("block_table", f"request {b} needs block column {int(columns.max())}, the table "
                                                    f"has {block_table.shape[1]}")
        blocks = block_table[b].to("cpu", torch.int64)[columns]
        check_index_range("block_table", blocks.unique(), src_cache.shape[0])
        rows = src_cache[blocks.to(src_cache.device), (positions % block_size).to(src_cache.device)]
        gathered.append((int(cu[b]), rows))
    return gathered


def cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None) -> None:
    """``vllm._custom_ops.cp_gather_cache``: each request's cached rows into ``dst``, values as stored."""
    if dst.dtype != src_cache.dtype:
        raise OutOfContractError("dst", f"dtype {dst.dtype} differs from the cache's {src_cache.dtype}: this gather "
                                        "copies values as stored")
    for row, rows in _gather_rows(src_cache, block_table, cu_seq_lens, int(batch_size), seq_starts):
        dst[row:row + rows.shape[0]].copy_(rows)


def gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                   kv_cache_dtype, scale, seq_starts=None) -> None:
    """``vllm._custom_ops.gather_and_maybe_dequant_cache``: each request's rows, dequantised to ``dst``'s dtype."""
    batch_size = block_table.shape[0]
    cu = cu_seq_lens.to("cpu", torch.int64)
    batch_size = min(batch_size, cu.numel() - 1)
    if int(num_tokens) != int(cu[batch_size]):
        raise OutOfContractError("num_tokens", f"{int(num_tokens)} but cu_seq_lens ends at {int(cu[batch_size])}")
    lens = cu[1:batch_size + 1] - cu[:batch_size]
    expected = torch.repeat_interleave(torch.arange(batch_size, dtype=torch.int64), lens)
    seq = token_to_seq.to("cpu", torch.int64)[: int(num_tokens)]
    if not torch.equal(seq, expected):
        raise OutOfContractError("token_to_seq", "disagrees with cu_seq_lens")
    fp8 = kv_cache_dtype in _FP8_CACHE_DTYPES
    if not fp8 and kv_cache_dtype != "auto":
        raise OutOfContractError("kv_cache_dtype", f"{kv_cache_dtype!r}: 'auto' and e4m3 'fp8' are modelled")
    if fp8:
        raw = src_cache.view(torch.float8_e4m3fn) if src_cache.dtype == torch.uint8 else src_cache
        check_dtype("src_cache", raw, (torch.float8_e4m3fn,))
        if scale is None or scale.numel() != 1:
            raise OutOfContractError("scale", "an fp8 gather needs one per-tensor scale")
    else:
        raw = src_cache
        if dst.dtype != src_cache.dtype:
            raise OutOfContractError("dst", f"dtype {dst.dtype} differs from the 'auto' cache's {src_cache.dtype}")
    for row, rows in _gather_rows(raw, block_table, cu_seq_lens, batch_size, seq_starts):
        value = as_float64(rows, scale.reshape(()) if fp8 else None)
        dst[row:row + rows.shape[0]].copy_(value.to(dst.dtype).to(dst.device))


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse=None,
                      prefill_tokens_with_context=None, output_scale=None) -> None:
    """``vllm._custom_ops.merge_attn_states``: two partial states merged by their natural-log LSE into ``output``."""
    if output_scale is not None:
        raise OutOfContractError("output_scale", "fp8 output is not modelled")
    check_dtype("prefix_output", prefix_output, (torch.float32, torch.float16, torch.bfloat16))
    tokens, heads, _ = output.shape
    for name, value in (("prefix_output", prefix_output), ("suffix_output", suffix_output)):
        if tuple(value.shape[:2]) != (tokens, heads):
            raise OutOfContractError(name, f"shape {tuple(value.shape)} for output {tuple(output.shape)}")
    for name, value in (("prefix_lse", prefix_lse), ("suffix_lse", suffix_lse)):
        if tuple(value.shape) != (heads, tokens):
            raise OutOfContractError(name, f"shape {tuple(value.shape)}: expects [heads, tokens] = [{heads}, {tokens}]")
    with_context = tokens if prefill_tokens_with_context is None else int(prefill_tokens_with_context)
    p = as_float64(prefix_lse.float())
    s = as_float64(suffix_lse.float())
    p = torch.where(torch.isposinf(p), -math.inf, p)
    s = torch.where(torch.isposinf(s), -math.inf, s)
    m = torch.maximum(p, s)  # [heads, tokens]
    empty = torch.isneginf(m[:, :with_context])
    if bool(empty.any()):
        head, token = (int(v) for v in empty.nonzero()[0])
        raise OutOfContractError("prefix_lse", f"token {token}, head {head}: both states are empty; the kernel's "
                                               "result for it is not modelled")
    m_safe = torch.where(torch.isneginf(m), 0.0, m)
    wp, ws = torch.exp(p - m_safe), torch.exp(s - m_safe)
    total = wp + ws
    merged = (as_float64(prefix_output) * (wp / total).T[..., None]
              + as_float64(suffix_output) * (ws / total).T[..., None])
    merged[with_context:] = as_float64(suffix_output[with_context:])
    value = merged.to(output.dtype).to(output.device)
    output.copy_(value)
    if output_lse is not None:
        lse = torch.log(total) + m_safe
        lse[:, with_context:] = s[:, with_context:]
        output_lse.copy_(lse.to(output_lse.dtype).to(output_lse.device))


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
def concat_mla_q(ql_nope: torch.Tensor, q_pe: torch.Tensor, q_out: torch.Tensor) -> None:
    """``vllm._custom_ops.concat_mla_q``: ``[ql_nope | q_pe]`` per token and head into ``q_out``, as stored."""
    for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe), ("q_out", q_out)):
        check_dtype(name, t, (torch.bfloat16, torch.float16))
        if t.dim() != 3:
            raise OutOfContractError(name, f"expects [num_tokens, num_heads, dim], got {tuple(t.shape)}")
    if not (ql_nope.dtype == q_pe.dtype == q_out.dtype):
        raise OutOfContractError("q_out", "ql_nope, q_pe and q_out must share one dtype")
    tokens, heads, nope = ql_nope.shape
    if nope != 512 or tuple(q_pe.shape) != (tokens, heads, 64):
        raise OutOfContractError("ql_nope", f"the kernel is built for [T, H, 512] + [T, H, 64], got "
                                            f"{tuple(ql_nope.shape)} + {tuple(q_pe.shape)}")
    if q_out.shape[0] < tokens or q_out.shape[1] < heads or q_out.shape[2] != 576:
        raise OutOfContractError("q_out", f"{tuple(q_out.shape)} cannot hold [{tokens}, {heads}, 576]")
    q_out[:tokens, :heads, :512] = ql_nope
    q_out[:tokens, :heads, 512:] = q_pe


EMULATIONS = {
    "vllm._custom_ops:concat_mla_q": concat_mla_q,
    "vllm._custom_ops:cp_gather_cache": cp_gather_cache,
    "vllm._custom_ops:gather_and_maybe_dequant_cache": gather_and_maybe_dequant_cache,
    "vllm._custom_ops:merge_attn_states": merge_attn_states,
}
