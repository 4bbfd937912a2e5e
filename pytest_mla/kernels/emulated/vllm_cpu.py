"""vLLM's CPU attention ops (a CPU build of ``vllm._C``), emulated in float64.

A CUDA build of ``vllm._C``, the one installed here, registers none of them.
Emulated callables (see ``EMULATIONS`` at the bottom):

* ``torch.ops._C:mla_decode_kvcache``: ``CPU_MLA``'s decode (through
  ``vllm._cpu_ops.mla_decode_kvcache_cpu``), stated below;
* ``torch.ops._C:get_scheduler_metadata``, ``cpu_attn_reshape_and_cache``,
  ``cpu_attention_with_kv_cache``: ``CPU_ATTN``'s paged attention (GQA
  models), emulated in ``vllm_cpu_attn.py``, whose docstring states their
  contract.

MLA decode (``mla_decode_kvcache``)
-----------------------------------

Read from vLLM's ``csrc/cpu/mla_decode.cpp`` (``mla_decode_kvcache`` and
``mla_decode_kvcache_cpu_impl``) and ``tests/kernels/attention/
test_mla_decode_cpu.py`` (its reference, ``ref_mla``: SDPA over each
request's first ``seq_len`` cached rows). The contract, all in one place:

* ``mla_decode_kvcache(out, query, kv_cache, scale, block_tables, seq_lens)``,
  in place, returns nothing. ``out [num_seqs, num_heads, v_head_dim]``,
  ``query [num_seqs, num_heads, head_dim]`` (one query token per sequence:
  no multi-token query, so no causal alignment), ``kv_cache [num_blocks,
  block_size, head_dim]``: one latent row per token, shared by every head
  (MQA); the value is the row's first ``v_head_dim`` entries (value overlaps
  key). ``block_tables [num_seqs, max_blocks]`` and ``seq_lens [num_seqs]``
  int32 (the kernel reads them as ``int*``).
* Only ``head_dim == 576``, ``v_head_dim == 512`` and ``block_size == 16``
  are compiled (anything else: ``TORCH_CHECK(false, "Unsupported block
  size")``: kept, a ``RuntimeError`` as on a CPU build), for ``query`` /
  ``kv_cache`` / ``out`` float32, float16 or bfloat16, all three of one dtype
  (``VLLM_DISPATCH_FLOATING_TYPES`` on the query's). Outside these dtypes this
  emulation raises, naming the flag.
* Scores are ``scale · q·k`` (``scale`` the softmax scale, no log2 folding);
  softmax over the sequence's ``seq_len`` tokens, token ``t`` at
  ``block_tables[s, t // 16]``, offset ``t % 16``; only those blocks are read
  and each must lie in ``[0, num_blocks)`` (raises otherwise). The LSE is
  kept internally (natural log) and not returned.
* ``seq_len == 0``: no block is read, the output row is 0.
* Not modelled: the kernel's fp32 accumulation order and its bf16 dot
  products; its attn·V loop spanning the whole last block with zero weights
  (rows past ``seq_len`` of a float32 cache enter as ``0 · row``; vLLM's test
  asserts no NaN comes out of rows past the length, which is what this
  emulation computes).
"""

from __future__ import annotations

import torch

from .glue import OutOfContractError, as_float64, attend, check_dtype, gather_pages, write_out

__all__ = ["EMULATIONS", "mla_decode_kvcache"]

#: The one (head_dim, v_head_dim, block_size) ``mla_decode_kvcache`` is compiled for.
HEAD_DIM, V_HEAD_DIM, BLOCK_SIZE = 576, 512, 16
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def mla_decode_kvcache(out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor, scale: float,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """``torch.ops._C.mla_decode_kvcache``: MQA decode over a paged latent cache, written into ``out``."""
    check_dtype("query", query, _DTYPES)
    for flag, tensor in (("kv_cache", kv_cache), ("out", out)):
        if tensor.dtype != query.dtype:
            raise OutOfContractError(flag, f"dtype {tensor.dtype} differs from the query's {query.dtype}")
    check_dtype("block_tables", block_tables, (torch.int32,))
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    if query.dim() != 3 or kv_cache.dim() != 3 or out.dim() != 3:
        raise OutOfContractError("query", f"expects query [seqs, heads, head_dim], kv_cache [blocks, block_size, "
                                          f"head_dim], out [seqs, heads, v_head_dim]; got {tuple(query.shape)}, "
                                          f"{tuple(kv_cache.shape)}, {tuple(out.shape)}")
    num_seqs, num_heads, head_dim = query.shape
    if (head_dim, out.shape[2], kv_cache.shape[1]) != (HEAD_DIM, V_HEAD_DIM, BLOCK_SIZE):
        # the library's own dispatch (csrc/cpu/mla_decode.cpp: TORCH_CHECK(false, "Unsupported block size") for
        # any (head_dim, v_head_dim, block_size) but the one compiled): kept, so a model whose latent is not
        # DeepSeek's fails here as it does on a CPU build of vLLM instead of going unchecked
        raise RuntimeError("Unsupported block size")
    if kv_cache.shape[2] != head_dim or tuple(out.shape[:2]) != (num_seqs, num_heads):
        raise OutOfContractError("kv_cache", f"rows of {kv_cache.shape[2]} for a query of {head_dim}; out "
                                             f"{tuple(out.shape)} for {num_seqs} sequences of {num_heads} heads")
    if seq_lens.numel() < num_seqs or block_tables.shape[0] < num_seqs:
        raise OutOfContractError("seq_lens", f"{seq_lens.numel()} lengths / {block_tables.shape[0]} block-table rows "
                                             f"for {num_seqs} sequences")
    lens = seq_lens.to("cpu", torch.int64)
    result = torch.zeros(num_seqs, num_heads, V_HEAD_DIM, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(lens[s])
        if n < 0:
            raise OutOfContractError("seq_lens", f"negative length {n} at sequence {s}")
        if n == 0:
            continue
        rows = as_float64(gather_pages(kv_cache, block_tables[s], n, flag="block_tables"))  # [n, head_dim]
        q = as_float64(query[s])  # [heads, head_dim]
        scores = float(scale) * torch.einsum("hd,nd->hn", q, rows)[:, None, :]  # [heads, 1, n]
        v = rows[:, None, :V_HEAD_DIM].expand(n, num_heads, V_HEAD_DIM)  # [n, heads, d_v]
        o, _ = attend(scores, v, torch.ones(1, n, dtype=torch.bool))
        result[s] = o[0]
    write_out(result, out, query.dtype, out.device)


EMULATIONS = {
    "torch.ops._C:mla_decode_kvcache": mla_decode_kvcache,
}
