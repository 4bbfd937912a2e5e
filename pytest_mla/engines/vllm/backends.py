"""What the project knows about each vLLM attention backend its checks drive.

Which impl method computes the attention, which compiled kernels a path
calls on which platform, how the check lays out the cache: one place, read
by the checks (``checks``), the rank runners (``rank``) and the kernel
sources (``emulation``).
"""

from __future__ import annotations

#: vLLM's CPU MLA backends and the op each decodes with (registered by a CPU build of vllm._C).
CPU_OPS = {"CPU_MLA": "mla_decode_kvcache", "AMX_MLA": "decode_attention_cpu"}
#: vLLM's ROCm MLA backends and the kernel callable each decodes with (no emulation of it yet).
ROCM_KERNELS = {
    "ROCM_AITER_MLA": "aiter.mla.mla_decode_fwd",
    "ROCM_AITER_TRITON_MLA": "aiter.mla.mla_decode_fwd",
    "ROCM_AITER_MLA_SPARSE": "ROCMAiterMLASparseImpl._forward_mla_aiter (aiter's sparse MLA decode)",
}
#: What a sparse backend's ``forward_mqa`` runs over the indexer's top-k (Triton: interpreted here), for the
#: record: the conversion of request-relative positions to cache rows, the sparse decode.
SPARSE_DECODE_KERNELS = {
    "XPU_MLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index",
                       "vllm.v1.attention.ops.xpu_mla_sparse:triton_bf16_mla_sparse_interface"),
    # the conversion (the index group's, index_group.py, or forward_mqa's own); the attention is FlashMLA's
    # (emulated: the record's ``emulated`` names which of its ops ran)
    "FLASHMLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_convert_req_index_to_global_index",),
}
#: The same under DCP: the global positions filtered to this rank's and converted (flashmla_sparse.py
#: ``_forward_bf16_kv``, ``_forward_fp8_kv_mixed_batch``).
SPARSE_DCP_DECODE_KERNELS = {
    "FLASHMLA_SPARSE": ("vllm.v1.attention.backends.mla.sparse_utils:triton_filter_and_convert_dcp_index",),
}



#: MLA backends whose builder reads nothing of the compilation config (CUDA-graph mode, capture size):
#: TRITON_MLA's; XPUMLASparseMetadataBuilder (CUDA graphs NEVER; its ``__init__`` reads the scheduler's
#: and model's config only). Their checks are one numeric case for every arch whose start-up resolved
#: other CUDA-graph settings (SM100's larger capture size).
COMPILATION_BLIND = ("TRITON_MLA", "XPU_MLA_SPARSE")


#: The impl method that computes a GQA backend's attention (the kernel record's ``function``).
TRITON_ATTN_FUNCTION = "vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward"
ATTN_FUNCTIONS = {"TRITON_ATTN": TRITON_ATTN_FUNCTION,
                  "FLASH_ATTN": "vllm.v1.attention.backends.flash_attn:FlashAttentionImpl.forward",
                  "CPU_ATTN": "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
                  "ROCM_ATTN": "vllm.v1.attention.backends.rocm_attn:RocmAttentionImpl.forward"}
ATTN_OPS = "vllm.v1.attention.ops"


def attn_kernels(backend: str, s_q: int) -> tuple[str, ...]:
    """What a GQA impl's ``forward`` runs besides itself on rows of ``s_q`` query tokens (the record's ``functions``).

    ROCM_ATTN: ``chunked_prefill_paged_decode`` sends rows of more than one
    query token to the Triton ``context_attention_fwd`` (prefix_prefill.py)
    and decodes single-token rows with its Triton ``kernel_paged_attention_2d``,
    unless ``use_rocm_custom_paged_attention`` picks the compiled
    ``ops.paged_attention_rocm`` (HIP; CDNA, 64/128-wide heads, blocks of
    16/32, at most 16 query heads per KV head): that op is not in this host's
    vLLM build, and such a cell is ``not-run`` naming it (``_platform_ops_missing``).
    """
    if backend == "TRITON_ATTN":
        return (f"{ATTN_OPS}.triton_unified_attention:unified_attention",)
    if backend == "ROCM_ATTN":
        return (f"{ATTN_OPS}.chunked_prefill_paged_decode:chunked_prefill_paged_decode",
                f"{ATTN_OPS}.chunked_prefill_paged_decode:kernel_paged_attention_2d") + (
            (f"{ATTN_OPS}.prefix_prefill:context_attention_fwd",) if s_q > 1 else ())
    return ()


#: GQA impls whose cache is vLLM's paged-attention layout: K and V as two head groups
#: (``PagedAttention.split_kv_cache``), K ``[blocks, kv_heads, head_size // x, block, x]`` with
#: ``x = 16 // element size``, V ``[blocks, kv_heads, head_size, block]``; the impl reads the new tokens'
#: K / V of rows with more than one query token from its ``key`` / ``value`` arguments (prefix_prefill).
SPLIT_KV_IMPLS = ("ROCM_ATTN",)

#: GQA backends whose cache layout is the kernel library's own (packed tiles per ISA): the check writes every
#: cached token through the impl's ``do_kv_cache_update``, as the model runner did when each token was new.
CACHE_WRITING_IMPLS = {"CPU_ATTN": ("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.do_kv_cache_update",
                                     "vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder.build")}

