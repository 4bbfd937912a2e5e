"""Faults injected at run time into the installed vLLM's own MLA kernel and DCP merge, and a driver that checks cells.

Run inside a vLLM venv (``tests/engines/test_vllm_checks.py`` does)::

    python tests/engines/vllm_faults.py SCENARIO [SCENARIO ...] [--dcp-mode distributed]

A scenario is ``FAULT:CASE`` (``none`` for no fault); the driver prints one
JSON line per scenario with the kernel record's status, message and errors.
Nothing in the venv is edited: each fault replaces a vLLM function in this
process (and, for ``--dcp-mode distributed``, in every rank process, and for a
cell of another platform, in that platform's child process: each runs ``run``
or ``run_attn`` below as its engine runner) and is undone afterwards.

Faults (what a buggy release could ship):

* ``decode-drops-last-token``: ``decode_attention_fwd`` reads one key fewer
  per row (an off-by-one in the sequence lengths it is given).
* ``split-merge-drops-last-split``: the second stage of ``decode_attention_fwd``
  (``_decode_softmax_reducev_fwd``, the merge of a request's KV splits) leaves
  the last split out whenever there is more than one: harmless at one split,
  wrong from TRITON_MLA's split threshold on (a stale or dropped partial).
* ``padded-decode-tokens-miscounted``: the MLA builder's
  ``split_decodes_and_prefills`` counts a decode-only batch's tokens from its
  ``query_start_loc`` (the real requests' tokens) instead of
  ``num_actual_tokens``: the same number for a batch as the scheduler built
  it, fewer than the batch's rows once the runner pads it with dummy requests
  for a FULL CUDA graph.
* ``triton-mla-scale-x1.05`` / ``triton-attn-scale-x1.05``: TRITON_MLA's
  ``forward_mqa`` / TRITON_ATTN's ``forward`` pass their Triton kernel
  (``decode_attention_fwd`` / ``unified_attention``) the softmax scale × 1.05.
* ``triton-mla-k-scale-exponent-only``: TRITON_MLA's ``forward_mqa`` passes
  ``decode_attention_fwd`` the layer's ``k_scale`` / ``v_scale`` rounded down to
  their power of two (a kernel that shifts by the scale's exponent instead of
  multiplying): invisible with ``k_scale`` 1 or a power-of-two scale, wrong with
  a calibrated one.
* ``rocm-attn-scale-x1.05``: ROCM_ATTN's ``forward`` passes
  ``chunked_prefill_paged_decode`` (its Triton decode and, for verify rows,
  ``context_attention_fwd``) the softmax scale × 1.05.
* ``cpu-mla-scale-x1.05``: CPU_MLA's ``forward_mqa`` calls
  ``vllm._cpu_ops.mla_decode_kvcache_cpu`` (its op emulated here) with the
  softmax scale × 1.05.
* ``cpu-attn-scale-x1.05``: CPU_ATTN's ``forward`` calls
  ``vllm._cpu_ops.cpu_attention_with_kv_cache`` (its op emulated here) with
  the softmax scale × 1.05.
* ``cpu-attn-cache-isa-vec``: CPU_ATTN's cache writes
  (``vllm._cpu_ops.cpu_attn_reshape_and_cache``) pack the tiles for the
  ``vec`` ISA whatever the layer's ``isa``: harmless on ``cpu`` (whose ISA is
  ``vec``), a scrambled read on ``cpu_amx`` (the builder schedules ``amx``).
* ``amx-mla-scale-x1.05``: AMX_MLA's ``forward_mqa`` calls
  ``vllm._cpu_ops.cpu_mla_decode`` (``decode_attention_cpu``, emulated here)
  with the softmax scale × 1.05.
* ``amx-mla-wrong-row``: AMX_MLA's decode metadata maps each request's
  tokens one row further (``_expand_block_table``'s ``block_table *
  block_size + offsets`` plus one: a wrong block table for the kernel).
* ``merge-ignores-lse``: ``cp_lse_ag_out_rs`` averages the ranks' partial
  outputs instead of weighting them by their LSE.
* ``merge-lse-base-swapped``: ``cp_lse_ag_out_rs`` reads each rank's LSE in
  the other base (natural as base 2, base 2 as natural: vLLM PR 47079's bug
  class) in its correction of the DCP outputs.
* ``flashmla-scale-x1.05``: vLLM's FlashMLA interface (``flash_mla_with_kvcache``,
  vendored in ``vllm.third_party.flashmla``) passes the softmax scale × 1.05.
* ``flashmla-k-descale-ignored``: vLLM's FlashMLA FP8 entry point
  (``vllm.v1.attention.ops.flashmla.flash_mla_with_kvcache_fp8``) passes a K
  descale of 1 whatever the layer's ``_k_scale``.
* ``tokenspeed-lse-natural``: vLLM's ``TokenspeedMLAImpl`` declares its
  kernel's LSE natural-log (``lse_base_on_e = True``; TokenSpeed's is base 2),
  so the DCP merge weighs the ranks wrongly (vLLM PR 47079's bug class).
* ``sparse-index-next-slot``: the index conversion of vLLM's sparse MLA
  (``sparse_utils.triton_convert_req_index_to_global_index``, which
  XPU_MLA_SPARSE's ``forward_mqa`` calls) maps every selected position to the
  cache row after its own (a position mis-translated to a slot: the newest
  token's next row is past the sequence, NaN in the check's cache);
  ``sparse-index-previous-slot``: to the row before its own (the neighbour's
  token, a finite misread).
* ``sparse-scale-x1.05``: XPU_MLA_SPARSE's ``_forward_bf16_kv`` passes its
  Triton kernel (``triton_bf16_mla_sparse_interface``) the softmax scale × 1.05.
* ``flashmla-sparse-scale-x1.05``: FLASHMLA_SPARSE's ``_bf16_flash_mla_kernel``
  passes FlashMLA's sparse kernel (``flash_mla_sparse_fwd``) the softmax scale
  × 1.05; ``flashmla-sparse-topk-length-short``: it passes each row's
  ``topk_length`` one short (the conversion's valid count miscounted: the last
  compacted entry is dropped). The sparse-index faults above reach
  FLASHMLA_SPARSE through its index group's conversion (``index_group.py``).
* ``indexer-drops-newest``: the check's stand-in indexer (``batch.fill_topk``)
  leaves each query token's newest selected position out of the buffer (an
  indexer that never selects the token being decoded).
* ``triton-td-off`` (not a fault): ``VLLM_TRITON_USE_TD=0`` for the check,
  vLLM's own switch that turns TRITON_ATTN's tensor-descriptor loads off
  (on by default on XPU): ``unified_attention`` loads its KV tiles with
  masked pointer loads instead.
* ``library-present`` (not a fault): FlashMLA's compiled op is present, as
  on a GPU host (see ``library_present``): the check runs at level
  ``backend`` with nothing emulated.
* ``prefill-merge-equal-weights``: ``merge_attn_states`` (vLLM's dispatcher in
  ``vllm.v1.attention.ops.merge_attn_states``) averages the MLA prefill's
  context and new-token states instead of weighting them by their LSE.

The cells run vLLM's own backends; on a host without their GPU libraries the
compiled kernels are float64 emulations (level ``emulated``), so each fault
is in vLLM's Python around them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
FAULT_ENV = "PYTEST_MLA_VLLM_FAULT"

#: Cells the driver knows: id -> (model, backend, spec, dcp, kv_dtype, page_size[, arch]); arch sm90 unless given.
CASES = {
    "v2lite-decode": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "auto", 16),
    "v2lite-chain": ("deepseek-v2-lite", "TRITON_MLA", "eagle-1x3", 1, "auto", 16),
    "v2lite-decode-dcp2": ("deepseek-v2-lite", "TRITON_MLA", "none", 2, "auto", 16),
    "v2lite-decode-fp8": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "fp8", 16),
    "llama-decode": ("llama-3.1-8b", "TRITON_ATTN", "none", 1, "auto", 16),
    # vLLM's CUDA backends (emulated kernels on a host without their libraries)
    "v2lite-flashmla": ("deepseek-v2-lite", "FLASHMLA", "none", 1, "auto", 64),
    "v2lite-flashmla-dcp2": ("deepseek-v2-lite", "FLASHMLA", "none", 2, "auto", 64),
    "v2lite-flashmla-fp8": ("deepseek-v2-lite", "FLASHMLA", "none", 1, "fp8", 64),
    "v2lite-flashmla-dcp2-chain": ("deepseek-v2-lite", "FLASHMLA", "eagle-1x3", 2, "auto", 64),
    "v2lite-flashinfer-dcp2": ("deepseek-v2-lite", "FLASHINFER_MLA", "none", 2, "auto", 64, "sm100"),
    "v3-tokenspeed-dcp2": ("deepseek-v3", "TOKENSPEED_MLA", "none", 2, "fp8", 64, "sm100"),
    "v2lite-triton-dcp2-chain": ("deepseek-v2-lite", "TRITON_MLA", "eagle-1x3", 2, "auto", 16),
    # other platforms: the check runs in the child process of the cell's platform
    "v2lite-decode-gfx942": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "auto", 16, "gfx942"),
    "v2lite-decode-xpu": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "auto", 16, "xpu"),
    "llama-decode-gfx950": ("llama-3.1-8b", "TRITON_ATTN", "none", 1, "auto", 16, "gfx950"),
    "llama-decode-xpu": ("llama-3.1-8b", "TRITON_ATTN", "none", 1, "auto", 16, "xpu"),
    # `auto` on ROCm resolves GQA models to ROCM_ATTN: Triton at blocks of 64, and for 96-wide heads;
    # ROCm's HIP paged attention (not in this host's vLLM) for 128-wide heads at blocks of 16
    "llama-rocm-attn-gfx942": ("llama-3.1-8b", "auto", "none", 1, "auto", 64, "gfx942"),
    "mqa96-rocm-attn-fp8-chain-gfx950": ("mqa-96", "auto", "eagle-1x3", 1, "fp8", 16, "gfx950"),
    "llama-rocm-attn-page16-gfx942": ("llama-3.1-8b", "auto", "none", 1, "auto", 16, "gfx942"),
    "v2lite-cpu-mla": ("deepseek-v2-lite", "CPU_MLA", "none", 1, "auto", 16, "cpu"),
    "v2lite-cpu-mla-chain": ("deepseek-v2-lite", "CPU_MLA", "eagle-1x3", 1, "auto", 16, "cpu"),
    "v2lite-amx-mla": ("deepseek-v2-lite", "auto", "none", 1, "auto", 64, "cpu_amx"),
    "v3-amx-mla": ("deepseek-v3", "AMX_MLA", "none", 1, "auto", 128, "cpu_amx"),
    "v2lite-amx-mla-chain": ("deepseek-v2-lite", "auto", "eagle-1x3", 1, "auto", 64, "cpu_amx"),
    "llama-cpu-attn": ("llama-3.1-8b", "auto", "none", 1, "auto", 64, "cpu"),
    "llama-cpu-attn-amx": ("llama-3.1-8b", "auto", "none", 1, "auto", 64, "cpu_amx"),
    "qwen-cpu-attn-amx-fp8-chain": ("qwen2.5-7b", "auto", "eagle-1x3", 1, "fp8", 128, "cpu_amx"),
    # GQA models on the backend `auto` resolves on SM90 (FLASH_ATTN)
    "llama-flash-attn-fp8": ("llama-3.1-8b", "auto", "eagle-1x3", 1, "fp8", 64),
    "mqa96-flash-attn-dcp2": ("mqa-96", "auto", "none", 2, "auto", 16),
    # sparse MLA (DeepSeek-V3.2): XPU_MLA_SPARSE, whatever is forced on XPU, and forced on a CUDA arch
    "v32-xpu-sparse": ("deepseek-v3.2", "TRITON_MLA", "none", 1, "auto", 64, "xpu"),
    "v32-xpu-sparse-chain": ("deepseek-v3.2", "XPU_MLA_SPARSE", "eagle-1x3", 1, "auto", 128, "xpu"),
    "v32-xpu-sparse-fp8": ("deepseek-v3.2", "XPU_MLA_SPARSE", "none", 1, "fp8", 64, "xpu"),
    "v32-xpu-sparse-sm90": ("deepseek-v3.2", "XPU_MLA_SPARSE", "none", 1, "auto", 64, "sm90"),
    # FLASHMLA_SPARSE (emulated FlashMLA): a bf16 cache (the sparse prefill kernel) and an FP8 one (656 bytes)
    "v32-flashmla-sparse": ("deepseek-v3.2", "FLASHMLA_SPARSE", "none", 1, "auto", 64, "sm90"),
    "v32-flashmla-sparse-sm100": ("deepseek-v3.2", "FLASHMLA_SPARSE", "none", 1, "auto", 128, "sm100"),
    "v32-flashmla-sparse-fp8": ("deepseek-v3.2", "FLASHMLA_SPARSE", "none", 1, "fp8", 64, "sm90"),
    "v32-flashmla-sparse-dcp2": ("deepseek-v3.2", "FLASHMLA_SPARSE", "none", 2, "auto", 64, "sm90"),
}


def _decode_fault(original: Any) -> Any:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, *args, **kwargs):
        return original(q, k_buffer, v_buffer, o, lse, req_to_token, (b_seq_len - 1).clamp(min=1), *args, **kwargs)

    return decode_attention_fwd


def _split_merge_fault(original: Any) -> Any:
    def _decode_softmax_reducev_fwd(logits, q, o, lse, v_buffer, b_seq_len, num_kv_splits, *args, **kwargs):
        if num_kv_splits > 1:  # the partials' LSEs sit in the last column: -inf drops the last split
            logits[:, :, num_kv_splits - 1, -1] = float("-inf")
        return original(logits, q, o, lse, v_buffer, b_seq_len, num_kv_splits, *args, **kwargs)

    return _decode_softmax_reducev_fwd


def _padded_tokens_fault(original: Any) -> Any:
    def split_decodes_and_prefills(common_attn_metadata, *args, **kwargs):
        decodes, prefills, decode_tokens, prefill_tokens = original(common_attn_metadata, *args, **kwargs)
        if not prefills:
            decode_tokens = int(common_attn_metadata.query_start_loc_cpu[-1])
        return decodes, prefills, decode_tokens, prefill_tokens

    return split_decodes_and_prefills


def _triton_mla_scale_fault(original: Any) -> Any:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                             sm_scale, *args, **kwargs):
        return original(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, attn_logits, num_kv_splits,
                        sm_scale * 1.05, *args, **kwargs)

    return decode_attention_fwd


def _exponent_only_fault(original: Any) -> Any:
    def decode_attention_fwd(*args, k_scale=None, v_scale=None, **kwargs):
        import torch

        def exponent(scale):
            return None if scale is None else torch.exp2(torch.floor(torch.log2(scale)))

        return original(*args, k_scale=exponent(k_scale), v_scale=exponent(v_scale), **kwargs)

    return decode_attention_fwd


def _triton_attn_scale_fault(original: Any) -> Any:
    def unified_attention(*args, softmax_scale=None, **kwargs):
        return original(*args, softmax_scale=softmax_scale * 1.05, **kwargs)

    return unified_attention


def _rocm_attn_scale_fault(original: Any) -> Any:
    def chunked_prefill_paged_decode(*args, sm_scale=None, **kwargs):
        return original(*args, sm_scale=sm_scale * 1.05, **kwargs)

    return chunked_prefill_paged_decode


def _cpu_mla_scale_fault(original: Any) -> Any:
    def mla_decode_kvcache_cpu(out, query, kv_cache, scale, block_tables, seq_lens):
        return original(out, query, kv_cache, scale * 1.05, block_tables, seq_lens)

    return mla_decode_kvcache_cpu


def _cpu_attn_scale_fault(original: Any) -> Any:
    def cpu_attention_with_kv_cache(*args, **kwargs):
        kwargs["scale"] = kwargs["scale"] * 1.05
        return original(*args, **kwargs)

    return cpu_attention_with_kv_cache


def _cpu_attn_isa_fault(original: Any) -> Any:
    def cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa, *args, **kwargs):
        return original(key, value, key_cache, value_cache, slot_mapping, "vec", *args, **kwargs)

    return cpu_attn_reshape_and_cache


def _amx_mla_scale_fault(original: Any) -> Any:
    def cpu_mla_decode(*args):
        args = list(args)
        args[11] = args[11] * 1.05  # sm_scale
        return original(*args)

    return cpu_mla_decode


def _amx_mla_row_fault(original: Any) -> Any:
    def _expand_block_table(block_table, block_size):
        return original(block_table, block_size) + 1

    return _expand_block_table


def _merge_fault(original: Any) -> Any:
    def cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False, **kwargs):
        if cp_group.world_size == 1:
            return original(cp_attn_out, cp_attn_lse, cp_group, ctx=ctx, return_lse=return_lse, **kwargs)
        # The ranks' outputs averaged, the LSEs ignored; heads scattered as vLLM does.
        out = cp_group.reduce_scatter(cp_attn_out.nan_to_num(0.0) / cp_group.world_size, dim=1)
        if return_lse:
            heads = cp_attn_lse.shape[1] // cp_group.world_size
            return out, cp_attn_lse[:, heads * cp_group.rank_in_group: heads * (cp_group.rank_in_group + 1)]
        return out

    return cp_lse_ag_out_rs


def _base_fault(original: Any) -> Any:
    def cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False, is_lse_base_on_e=True,
                         **kwargs):
        return original(cp_attn_out, cp_attn_lse, cp_group, ctx=ctx, return_lse=return_lse,
                        is_lse_base_on_e=not is_lse_base_on_e, **kwargs)

    return cp_lse_ag_out_rs


def _scale_fault(original: Any) -> Any:
    def flash_mla_with_kvcache(*args, softmax_scale=None, **kwargs):
        return original(*args, softmax_scale=softmax_scale * 1.05, **kwargs)

    return flash_mla_with_kvcache


def _descale_fault(original: Any) -> Any:
    def flash_mla_with_kvcache_fp8(*args, descale_k=None, **kwargs):
        import torch

        return original(*args, descale_k=torch.ones_like(descale_k), **kwargs)

    return flash_mla_with_kvcache_fp8


def _tokenspeed_lse_natural(original: Any) -> Any:
    class TokenspeedMLAImpl(original):  # the impl declares its kernel's LSE natural-log (it is base 2)
        lse_base_on_e = True

    return TokenspeedMLAImpl


def _prefill_merge_fault(original: Any) -> Any:
    def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse, *args, **kwargs):
        import torch

        equal = torch.zeros_like(prefix_lse)
        # the context's empty rows keep their LSE (nothing attended), every other weight is equal
        prefix = torch.where(torch.isinf(prefix_lse), prefix_lse, equal)
        return original(output, prefix_output, prefix, suffix_output, torch.where(torch.isinf(suffix_lse),
                                                                                  suffix_lse, equal),
                        *args, **kwargs)

    return merge_attn_states


def _sparse_slot_shift(shift: int) -> Any:
    def make(original: Any) -> Any:
        def triton_convert_req_index_to_global_index(*args, **kwargs):
            import torch

            out = original(*args, **kwargs)
            rows = out[0] if isinstance(out, tuple) else out
            moved = torch.where(rows + shift >= 0, rows + shift, rows).where(rows >= 0, rows)  # -1 stays -1
            if kwargs.get("out") is not None:  # the index group's call converts into its own buffer (index_group.py)
                kwargs["out"].copy_(moved)
            return (moved, *out[1:]) if isinstance(out, tuple) else moved

        return triton_convert_req_index_to_global_index

    return make


def _sparse_scale_fault(original: Any) -> Any:
    def triton_bf16_mla_sparse_interface(q, kv, indices, sm_scale, *args, **kwargs):
        return original(q, kv, indices, sm_scale * 1.05, *args, **kwargs)

    return triton_bf16_mla_sparse_interface


def _flashmla_sparse_scale_fault(original: Any) -> Any:
    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, *args, **kwargs):
        return original(q, kv, indices, sm_scale * 1.05, *args, **kwargs)

    return flash_mla_sparse_fwd


def _flashmla_sparse_topk_length_short(original: Any) -> Any:
    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, out=None):
        if topk_length is not None:  # one valid entry fewer: the last selected token is cut off
            topk_length = (topk_length - 1).clamp_min(0)
        return original(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out)

    return flash_mla_sparse_fwd


def _indexer_drops_newest(original: Any) -> Any:
    def fill_topk(layer, topk_indices, num_tokens):
        import torch

        newest = topk_indices.max(-1, keepdim=True).values  # [b, s_q, 1]
        return original(layer, torch.where(topk_indices == newest, -1, topk_indices), num_tokens)

    return fill_topk


FAULTS = {
    "decode-drops-last-token": ("vllm.v1.attention.ops.triton_decode_attention", "decode_attention_fwd",
                                _decode_fault),
    "split-merge-drops-last-split": ("vllm.v1.attention.ops.triton_decode_attention", "_decode_softmax_reducev_fwd",
                                     _split_merge_fault),
    "padded-decode-tokens-miscounted": ("vllm.model_executor.layers.attention.mla_attention",
                                        "split_decodes_and_prefills", _padded_tokens_fault),
    "triton-mla-scale-x1.05": ("vllm.v1.attention.ops.triton_decode_attention", "decode_attention_fwd",
                               _triton_mla_scale_fault),
    "triton-mla-k-scale-exponent-only": ("vllm.v1.attention.ops.triton_decode_attention", "decode_attention_fwd",
                                         _exponent_only_fault),
    "triton-attn-scale-x1.05": ("vllm.v1.attention.ops.triton_unified_attention", "unified_attention",
                                _triton_attn_scale_fault),
    "rocm-attn-scale-x1.05": ("vllm.v1.attention.ops.chunked_prefill_paged_decode", "chunked_prefill_paged_decode",
                              _rocm_attn_scale_fault),
    "cpu-mla-scale-x1.05": ("vllm._cpu_ops", "mla_decode_kvcache_cpu", _cpu_mla_scale_fault),
    "cpu-attn-scale-x1.05": ("vllm._cpu_ops", "cpu_attention_with_kv_cache", _cpu_attn_scale_fault),
    "cpu-attn-cache-isa-vec": ("vllm._cpu_ops", "cpu_attn_reshape_and_cache", _cpu_attn_isa_fault),
    "amx-mla-scale-x1.05": ("vllm._cpu_ops", "cpu_mla_decode", _amx_mla_scale_fault),
    "amx-mla-wrong-row": ("vllm.v1.attention.backends.mla.amx_mla", "_expand_block_table", _amx_mla_row_fault),
    "merge-ignores-lse": ("vllm.v1.attention.ops.dcp", "cp_lse_ag_out_rs", _merge_fault),
    "merge-lse-base-swapped": ("vllm.v1.attention.ops.dcp", "cp_lse_ag_out_rs", _base_fault),
    "flashmla-scale-x1.05": ("vllm.third_party.flashmla.flash_mla_interface", "flash_mla_with_kvcache",
                             _scale_fault),
    "flashmla-k-descale-ignored": ("vllm.v1.attention.ops.flashmla", "flash_mla_with_kvcache_fp8", _descale_fault),
    "tokenspeed-lse-natural": ("vllm.v1.attention.backends.mla.tokenspeed_mla", "TokenspeedMLAImpl",
                               _tokenspeed_lse_natural),
    "prefill-merge-equal-weights": ("vllm.v1.attention.ops.merge_attn_states", "merge_attn_states",
                                    _prefill_merge_fault),
    "sparse-index-next-slot": ("vllm.v1.attention.backends.mla.sparse_utils",
                               "triton_convert_req_index_to_global_index", _sparse_slot_shift(1)),
    "sparse-index-previous-slot": ("vllm.v1.attention.backends.mla.sparse_utils",
                                   "triton_convert_req_index_to_global_index", _sparse_slot_shift(-1)),
    "sparse-scale-x1.05": ("vllm.v1.attention.ops.xpu_mla_sparse", "triton_bf16_mla_sparse_interface",
                           _sparse_scale_fault),
    "indexer-drops-newest": ("pytest_mla.engines.vllm.batch", "fill_topk", _indexer_drops_newest),
    "flashmla-sparse-scale-x1.05": ("vllm.v1.attention.backends.mla.flashmla_sparse", "flash_mla_sparse_fwd",
                                    _flashmla_sparse_scale_fault),
    "flashmla-sparse-topk-length-short": ("vllm.v1.attention.backends.mla.flashmla_sparse", "flash_mla_sparse_fwd",
                                          _flashmla_sparse_topk_length_short),
}
#: vLLM modules that bind the faulted functions by name (imported before the fault is put in).
BINDERS = ("vllm.v1.attention.backends.mla.triton_mla", "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.backends.mla.flashmla",
           "vllm.v1.attention.backends.mla.flashinfer_mla", "vllm.model_executor.layers.attention.mla_attention",
           "vllm.v1.attention.backends.rocm_attn", "vllm.v1.attention.backends.mla.xpu_mla_sparse",
           "vllm.v1.attention.backends.mla.flashmla_sparse", "vllm.v1.attention.backends.mla.index_group")


@contextlib.contextmanager
def library_present() -> Iterator[None]:
    """This host as a GPU host with FlashMLA built: ``torch.ops._flashmla_C.dense_decode_fwd`` is a callable
    (the float64 function, set directly, unlogged) and ``real_kernels_missing`` finds it loaded.

    What a GPU run changes, and nothing else: the adapter declares level
    ``backend`` and the same driver calls whatever ``torch.ops`` holds,
    installing no emulation.
    """
    import torch

    from pytest_mla.engines.vllm import emulation
    from pytest_mla.kernels.emulated import flashmla

    namespace = torch.ops._flashmla_C
    saved_missing = emulation.real_kernels_missing
    saved_capability = torch.cuda.get_device_capability
    # a GPU host is an sm90 one: vLLM's FlashMLA support check asks torch for the device it runs on
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    emulation.real_kernels_missing = lambda backend, path, where, capability: (
        None if backend == "FLASHMLA" and path == "decode" else "not this backend")
    namespace.dense_decode_fwd = flashmla.dense_decode_fwd
    try:
        yield
    finally:
        emulation.real_kernels_missing = saved_missing
        torch.cuda.get_device_capability = saved_capability
        del namespace.dense_decode_fwd


@contextlib.contextmanager
def injected(fault: str) -> Iterator[None]:
    """Replace one vLLM function, and every vLLM module's binding of it, for the block."""
    if fault == "none":
        yield
        return
    if fault == "triton-td-off":
        saved = os.environ.get("VLLM_TRITON_USE_TD")
        os.environ["VLLM_TRITON_USE_TD"] = "0"  # read when TritonAttentionImpl is built (vllm.envs, uncached)
        try:
            yield
        finally:
            if saved is None:
                del os.environ["VLLM_TRITON_USE_TD"]
            else:
                os.environ["VLLM_TRITON_USE_TD"] = saved
        return
    if fault == "library-present":
        from pytest_mla.engines.vllm import support
        from pytest_mla.engines.vllm import VLLMEngine

        support.adopt_factory(VLLMEngine)
        support.prepare_process()
        with library_present():
            yield
        return
    import importlib

    from pytest_mla.engines.vllm import support
    from pytest_mla.engines.vllm import VLLMEngine

    support.adopt_factory(VLLMEngine)  # a rank process has no engine yet: make it as the runner would
    support.prepare_process()  # the Triton mode and the engine's import, as the runner does
    module_name, attr, make = FAULTS[fault]
    for binder in BINDERS:
        with contextlib.suppress(ImportError):  # a platform child lacks some (flashinfer's on ROCm / XPU)
            importlib.import_module(binder)
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    faulty = make(original)
    bound = [m for m in list(sys.modules.values())
             if m is not None and getattr(m, "__name__", "").startswith(("vllm", "pytest_mla.engines.vllm"))
             and getattr(m, attr, None) is original]
    for m in bound:
        setattr(m, attr, faulty)
    try:
        yield
    finally:
        for m in bound:
            setattr(m, attr, original)


def run(inputs: Any, ctx: Any, options: Any) -> Any:
    """The MLA runner with the fault named in ``PYTEST_MLA_VLLM_FAULT`` (for distributed ranks, platform children)."""
    from pytest_mla.engines.vllm.adapter import run_mla

    with injected(options.get("fault") or os.environ.get(FAULT_ENV, "none")):
        return run_mla(inputs, ctx, options)


def run_attn(inputs: Any, ctx: Any, options: Any) -> Any:
    """The GQA runner with the fault named in ``PYTEST_MLA_VLLM_FAULT`` (platform children)."""
    from pytest_mla.engines.vllm.adapter import run_attn as run_attn_here

    with injected(options.get("fault") or os.environ.get(FAULT_ENV, "none")):
        return run_attn_here(inputs, ctx, options)


def check(case_id: str, *, dtype: str, dcp_mode: str, wrapped: bool) -> dict[str, Any]:
    """One cell's kernel record, with the spec the vLLM adapter gives it on this host."""
    import dataclasses

    from pytest_mla.core.matrix import load_matrix
    from pytest_mla.engines.vllm import VLLMEngine
    from pytest_mla.kernels import harness
    from pytest_mla.runner import run_check

    model, backend, spec, dcp, kv, page, *arch = CASES[case_id]
    matrix = load_matrix(ROOT / "matrix" / "vllm.toml")
    want = {"model": model, "backend": backend, "dcp": dcp, "spec": spec, "arch": (arch or ["sm90"])[0],
            "kv_dtype": kv, "page_size": page}
    cell = next(c for c in matrix.cells() if all(c.coords.get(k) == v for k, v in want.items()))
    from pytest_mla.engines.vllm import support as vllm_support

    # one engine per process, as the plugin has: its faked platform is the one vLLM's current_platform is
    vllm_support.adopt_factory(VLLMEngine)
    configured = vllm_support.prepare_process().configure(cell, matrix.models[model])
    kernel = configured.kernel
    assert kernel is not None, configured.kernel_reason
    if wrapped:
        target = "vllm_faults:run_attn" if kernel.target.endswith(":run_attn") else "vllm_faults:run"
        # the fault travels with the spec: a platform child, started once, keeps its first environment
        kernel = dataclasses.replace(kernel, target=target, options=kernel.options + (("fault", os.environ[FAULT_ENV]),))
    case = harness.case_for(cell.coords, matrix.models[model], seed=0, dtype=dtype, overrides=dict(kernel.case))
    # another platform's cell: its check runs in that platform's child process, as in a matrix run
    elsewhere = vllm_support.prepare_process().run_check(case, kernel, where="interpreter", dcp_mode=dcp_mode,
                                                          timeout_s=300)
    if elsewhere is not None:
        return elsewhere
    return run_check(case, kernel, where="interpreter", dcp_mode=dcp_mode, timeout_s=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm_faults")
    parser.add_argument("scenarios", nargs="+", metavar="FAULT:CASE")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--dcp-mode", default="in-process")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # rank processes inherit this path
    for scenario in args.scenarios:
        fault, _, case_id = scenario.partition(":")
        arch = (CASES[case_id][6:] or ["sm90"])[0]
        if args.dcp_mode == "distributed" or not arch.startswith("sm"):
            # no fault: the adapter's own target, as a matrix run starts it in each rank process
            # (or in the child process of the cell's platform, which inherits the environment)
            os.environ[FAULT_ENV] = fault
            record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=fault != "none")
        else:
            with injected(fault):
                record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=False)
        errors = record.get("errors") or {}
        print(json.dumps({"scenario": scenario, "status": record.get("status"), "finding": record.get("finding", False),
                          "level": record.get("level"), "emulated": record.get("emulated"),
                          "variants": [v.get("status") for v in record.get("variants") or []],
                          "schedule": record.get("schedule"), "seqlens": (record.get("case") or {}).get("seqlens"),
                          "message": record.get("message"), "function": record.get("function"),
                          "functions": record.get("functions"), "max_abs": (errors.get("out") or {}).get("max_abs_err"),
                          "reason": record.get("reason")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
