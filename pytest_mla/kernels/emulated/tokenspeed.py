"""TokenSpeed MLA decode (``tokenspeed-mla`` 2.0.4, CuTe DSL, SM100/103/107), emulated in float64.

Emulated callables (``EMULATIONS`` at the bottom): ``tokenspeed_mla:tokenspeed_mla_decode``,
``tokenspeed_mla:get_num_sm`` and ``tokenspeed_mla:warmup_compile_prefill`` (vLLM's
TOKENSPEED_MLA backend calls all three; the last only compiles prefill kernels).

The contract, all in one place (sources in brackets: the wheel's
``tokenspeed_mla/mla_decode.py`` docstring and wrapper checks, and the float64
reference its kernel module tests against, ``mla_decode_fp8.py`` ``torch_reference``):

* Layouts: ``query [B, q_len, H, kv_lora_rank + qk_rope_head_dim]``;
  ``kv_cache [num_pages, page_size, D]`` or ``[num_pages, 1, page_size, D]``;
  V is the first ``kv_lora_rank`` columns of each cached row;
  ``block_tables [B, max_pages]``; ``seq_lens [B]`` the **local** cache lengths.
* dtypes: fp16, bf16 or float8_e4m3fn, the cache in the query's dtype
  (the wrapper's ``assert kv_cache.dtype == query.dtype``, kept). No descales:
  fp8 values enter as stored; the caller folds ``q_scale · k_scale`` into
  ``softmax_scale`` and ``k_scale`` into ``output_scale``.
* Scores ``softmax_scale · q·k`` over all ``D`` columns; output
  ``softmax(scores) @ V · output_scale``, ``[B, q_len, H, kv_lora_rank]``, in
  **bf16 for fp8 inputs** (else the query's dtype), into ``out`` when given.
* Causal (``causal_mask``): query row ``i`` of the ``q_len`` block sees the
  local keys ``j < K - (q_len - 1) + i`` (``K`` = ``seq_lens[b]``), i.e.
  bottom-right aligned [reference's attn_mask; kernel's ``k_bound``].
* DCP (``cp_world > 1``, fp8 only; ``causal_seqs`` required, the **global**
  length, the same on every rank): row ``i`` sees the local keys whose global
  position ``(j // I)·(W·I) + r·I + j % I`` is below ``causal_seqs[b] - (q_len -
  1) + i`` (``W`` = ``cp_world``, ``r`` = ``cp_rank``, ``I`` =
  ``cp_interleave_size``) [kernel's ``_get_dcp_local_bound``]. The wrapper's
  ``ValueError`` checks on ``cp_world``, ``cp_rank``, ``cp_interleave_size``,
  ``causal_seqs``, ``window_left`` and ``min_split_kv`` are kept.
* LSE (``return_lse``): ``[B, q_len, H]`` float32, **base 2**
  (``max · softmax_scale · log2 e + log2 Σ 2^(...)``) [reference's ``lse_ref``];
  a row that sees nothing: out 0, LSE ``-inf`` [kernel: empty rows].
* Out-of-range page ids in the pages a request needs raise.
* Not modelled (raise ``OutOfContractError``): a sliding window
  (``window_left >= 0``), ``local_visible_lens``, an fp8 ``out`` (the SM107
  FP8-output kernel), ``is_var_seq=False``.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .glue import LN2, OutOfContractError, as_float64, attend, check_dtype, gather_pages, write_out

__all__ = ["EMULATED_SM_COUNT", "EMULATIONS", "get_num_sm", "tokenspeed_mla_decode", "warmup_compile_prefill"]

#: SMs of the emulated device (a B200), what ``get_num_sm`` answers without a GPU.
EMULATED_SM_COUNT = 148


def get_num_sm(device=None) -> int:
    """``tokenspeed_mla.get_num_sm``: the device's SM count; the emulated B200's here."""
    return EMULATED_SM_COUNT


def warmup_compile_prefill(q_dtype=torch.float8_e4m3fn, d_qk: int = 192, d_v: int = 128,
                           enable_pdl: bool = False) -> None:
    """``tokenspeed_mla.warmup_compile_prefill``: compiles kernels on a GPU; nothing to compute here."""


def _local_bound(global_bound: int, world: int, rank: int, interleave: int) -> int:
    """How many of this rank's local keys lie before ``global_bound`` (the kernel's own mapping)."""
    if interleave == 1:
        return max((global_bound - rank + world - 1) // world, 0)
    cycle = world * interleave
    full, offset = divmod(max(global_bound, 0), cycle)
    tail = min(max(offset - rank * interleave, 0), interleave)
    return full * interleave + tail


def tokenspeed_mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    softmax_scale: float,
    output_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    is_var_seq: bool = True,
    causal_mask: bool = True,
    window_left: int = -1,
    enable_pdl: bool = False,
    return_lse: bool = False,
    causal_seqs: Optional[torch.Tensor] = None,
    cp_world: int = 1,
    cp_rank: int = 0,
    cp_interleave_size: int = 1,
    *,
    min_split_kv: int = 1,
    local_visible_lens: Optional[torch.Tensor] = None,
):
    """``tokenspeed_mla.tokenspeed_mla_decode``: ``out``, or ``(out, lse)`` with ``return_lse``."""
    # The wrapper's own checks, in its order and with its exception types.
    if type(min_split_kv) is not int or not 1 <= min_split_kv <= 256:
        raise ValueError("min_split_kv must be an integer in [1, 256]")
    supported = {torch.float16, torch.bfloat16, torch.float8_e4m3fn}
    assert query.dtype in supported, f"tokenspeed_mla_decode only supports {supported}, got {query.dtype}"
    assert kv_cache.dtype == query.dtype, f"kv_cache dtype {kv_cache.dtype} must match query dtype {query.dtype}"
    b, q_len, h, d_qk = query.shape
    assert d_qk == kv_lora_rank + qk_rope_head_dim
    if local_visible_lens is not None:
        raise OutOfContractError("local_visible_lens", "per-row visible lengths are not modelled")
    if kv_cache.dim() == 4:
        kv_cache = kv_cache.squeeze(1)
    if max_seq_len <= 0:
        raise ValueError(f"max_seq_len must be > 0, got {max_seq_len}")
    if window_left < -1:
        raise ValueError(f"window_left must be -1 or non-negative, got {window_left}")
    if window_left >= 0:
        raise OutOfContractError("window_left", f"{window_left}: sliding windows are not modelled")
    fp8 = query.dtype == torch.float8_e4m3fn
    if out is not None and out.dtype == torch.float8_e4m3fn:
        raise OutOfContractError("out", "an fp8 output (the SM107 FP8-output kernel) is not modelled")
    if cp_world < 1:
        raise ValueError(f"cp_world must be >= 1, got cp_world={cp_world}")
    if cp_interleave_size < 1:
        raise ValueError(f"cp_interleave_size must be >= 1, got cp_interleave_size={cp_interleave_size}")
    if not fp8 and (cp_world > 1 or causal_seqs is not None):
        raise ValueError("decode-context-parallel (cp_world > 1 / causal_seqs) is only supported "
                         f"on the fp8 decode path, got query dtype {query.dtype}")
    if cp_world > 1 and causal_seqs is None:
        raise ValueError("causal_seqs (per-request global causal bound) is required when "
                         f"cp_world > 1, got cp_world={cp_world} and causal_seqs=None")
    if not 0 <= cp_rank < max(cp_world, 1):
        raise ValueError(f"cp_rank must be in [0, cp_world), got cp_rank={cp_rank} cp_world={cp_world}")
    if not is_var_seq:
        raise OutOfContractError("is_var_seq", "fixed-length (persistent) batches are not modelled")
    check_dtype("block_tables", block_tables, (torch.int32,))
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != d_qk:
        raise OutOfContractError("kv_cache", f"shape {tuple(kv_cache.shape)}: expects [pages, page_size, {d_qk}]")
    if block_tables.shape[0] != b or seq_lens.shape[0] != b:
        raise OutOfContractError("block_tables", f"block_tables {tuple(block_tables.shape)} / seq_lens "
                                                 f"{tuple(seq_lens.shape)} do not have B = {b} rows")

    res = torch.zeros(b, q_len, h, kv_lora_rank, dtype=torch.float64)
    lse = torch.full((b, q_len, h), -math.inf, dtype=torch.float64)
    rows_of = torch.arange(q_len, dtype=torch.int64)
    for i in range(b):
        n = int(seq_lens[i])
        if n < 0:
            raise OutOfContractError("seq_lens", f"negative length in {seq_lens.tolist()}")
        if n == 0:
            continue
        rows = as_float64(gather_pages(kv_cache, block_tables[i], n, flag="block_tables"))  # [n, d_qk]
        q = as_float64(query[i])  # [q_len, h, d_qk]
        scores = torch.einsum("qhd,nd->hqn", q, rows) * float(softmax_scale)  # [h, q_len, n]
        if not causal_mask:
            bound = torch.full((q_len,), n, dtype=torch.int64)
        elif cp_world == 1:
            bound = n - (q_len - 1) + rows_of
        else:
            g = int(causal_seqs[i])
            bound = torch.tensor([_local_bound(g - (q_len - 1) + r, cp_world, cp_rank, cp_interleave_size)
                                  for r in range(q_len)], dtype=torch.int64)
        visible = torch.arange(n)[None, :] < bound[:, None]  # [q_len, n]
        v = rows[:, None, :kv_lora_rank].expand(n, h, kv_lora_rank)
        o, l = attend(scores, v, visible)  # natural log
        res[i] = o * float(output_scale)
        lse[i] = (l / LN2).transpose(0, 1)  # base 2, [q_len, h]
    out_dtype = torch.bfloat16 if fp8 else query.dtype
    result = write_out(res, out, out_dtype, query.device)
    if return_lse:
        return result, lse.to(torch.float32).to(query.device)
    return result


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "tokenspeed_mla:tokenspeed_mla_decode": tokenspeed_mla_decode,
    "tokenspeed_mla:get_num_sm": get_num_sm,
    "tokenspeed_mla:warmup_compile_prefill": warmup_compile_prefill,
}
