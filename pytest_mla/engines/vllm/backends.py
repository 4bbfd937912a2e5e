"""What the project knows about each vLLM attention backend its checks drive: one record a backend.

A ``Backend`` says how the backend's check is built (the MLA or the GQA
runner, its cache layout), which impl method and kernels the record names,
which compiled calls a path makes and what must be loaded for them to run
for real (else ``emulation`` replaces them with float64 emulations), and on
which other platforms its check runs. ``backend(name)`` is the record of a
name vLLM registers; a name the project knows nothing of gets an empty one
(no check drives it).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

#: Where vLLM's attention kernels live (``module:qualname`` prefixes of the records' kernels).
ATTN_OPS = "vllm.v1.attention.ops"
SPARSE_UTILS = "vllm.v1.attention.backends.mla.sparse_utils"

#: A compiled entry point a real run needs loaded: a ``torch.ops`` (namespace, op) or a Python module.
Loaded = tuple[str, str] | str


@dataclasses.dataclass(frozen=True)
class Backend:
    """One vLLM attention backend as the checks know it."""

    name: str
    #: Which runner drives it: ``"mla"`` (``rank.run_mla``, MLA models), ``"attn"`` (``rank.run_attn``, GQA
    #: models), None: no check drives it.
    runner: str | None = None
    #: The impl method that computes its attention (the kernel record's ``function``).
    function: str | None = None
    #: The compiled calls its decode path makes, as ``module:qualname``: emulated at level ``emulated``.
    #: Empty: Triton or Python only, which runs here (interpreter) and on a GPU alike.
    decode_calls: tuple[str, ...] = ()
    #: What its real decode entry points need loaded (``emulation.real_kernels_missing``).
    real_ops: tuple[Loaded, ...] = ()
    #: What its decode path runs besides ``function``, for the record (one rank; ``dcp_kernels`` under DCP).
    kernels: tuple[str, ...] = ()
    #: ``kernels`` under DCP, where they differ (None: the same).
    dcp_kernels: tuple[str, ...] | None = None
    #: Added to ``kernels`` for rows of more than one query token (a GQA impl's prefill kernel).
    verify_kernels: tuple[str, ...] = ()
    #: Platforms whose child process runs its check (``platform_check``), on the cell's arch.
    platforms: tuple[str, ...] = ()
    #: Its own ``forward_mha`` per platform: ``platform -> (impl method, compiled calls)``.
    own_prefill: Mapping[str, tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    #: The ``torch.ops._C`` op it decodes with on the CPU platform (a CPU build of vllm._C registers it).
    cpu_op: str | None = None
    #: The compiled decode kernel it calls that nothing emulates yet (ROCm's AITER backends).
    unemulated_kernel: str | None = None
    #: Its builder reads nothing of the compilation config (CUDA-graph mode, capture size): its check is one
    #: numeric case for every arch whose start-up resolved other CUDA-graph settings (SM100's larger capture
    #: size), unless vLLM's construction raises under the cell's arch.
    compilation_blind: bool = False
    #: Its cache is vLLM's paged-attention layout: K and V as two head groups (``PagedAttention.split_kv_cache``),
    #: K ``[blocks, kv_heads, head_size // x, block, x]`` with ``x = 16 // element size``, V
    #: ``[blocks, kv_heads, head_size, block]``; the impl reads the new tokens' K / V of rows with more than one
    #: query token from its ``key`` / ``value`` arguments (prefix_prefill).
    split_kv_cache: bool = False
    #: Its cache layout is the kernel library's own (packed tiles per ISA): the check writes every cached token
    #: through the impl's ``do_kv_cache_update``, as the model runner did when each token was new; the functions
    #: that do it, for the record.
    cache_writers: tuple[str, ...] = ()
    #: The check leaves the query unquantised where the layer would quantise it for an FP8 cache: Triton's
    #: interpreter cannot multiply fp8 operands (the query is exact in the cache's format, so its values are
    #: those a quantised query has).
    unquantised_query: bool = False

    def decode_kernels(self, dcp: bool) -> tuple[str, ...]:
        """What the MLA decode path runs besides ``function`` (``dcp``: under DCP), for the record."""
        return self.dcp_kernels if dcp and self.dcp_kernels is not None else self.kernels

    def attn_kernels(self, s_q: int) -> tuple[str, ...]:
        """What a GQA impl's ``forward`` runs besides itself on rows of ``s_q`` query tokens, for the record."""
        return self.kernels + (self.verify_kernels if s_q > 1 else ())


_MLA = "vllm.v1.attention.backends.mla"
_CONVERT_INDEX = f"{SPARSE_UTILS}:triton_convert_req_index_to_global_index"
_FLASH_ATTN_VARLEN = ("vllm.vllm_flash_attn:flash_attn_varlen_func", "vllm.vllm_flash_attn:get_scheduler_metadata")
_AITER_DECODE = "aiter.mla.mla_decode_fwd"

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    # -- MLA models (``rank.run_mla``) --
    Backend("TRITON_MLA", "mla", f"{_MLA}.triton_mla:TritonMLAImpl.forward_mqa",
            kernels=(f"{ATTN_OPS}.triton_decode_attention:decode_attention_fwd",),
            platforms=("rocm", "xpu"), compilation_blind=True),
    Backend("FLASHMLA", "mla", f"{_MLA}.flashmla:FlashMLAImpl.forward_mqa",
            decode_calls=("torch.ops._flashmla_C:dense_decode_fwd", "torch.ops._flashmla_extension_C:fwd_kvcache_mla_fp8",
                          "torch.ops._flashmla_extension_C:get_mla_decoding_metadata_dense_fp8"),
            real_ops=(("_flashmla_C", "dense_decode_fwd"), ("_flashmla_extension_C", "fwd_kvcache_mla_fp8"))),
    Backend("FLASH_ATTN_MLA", "mla", f"{_MLA}.flashattn_mla:FlashAttnMLAImpl.forward_mqa",
            decode_calls=_FLASH_ATTN_VARLEN, real_ops=(("_vllm_fa3_C", "fwd"),)),
    Backend("FLASHINFER_MLA", "mla", f"{_MLA}.flashinfer_mla:FlashInferMLAImpl.forward_mqa",
            decode_calls=("flashinfer.decode:trtllm_batch_decode_with_kv_cache_mla", "flashinfer.utils:get_device_sm_count",
                          "flashinfer.utils:get_trtllm_gen_multi_ctas_kv_counter_bytes"),
            real_ops=("flashinfer.decode",)),
    Backend("CUTLASS_MLA", "mla", f"{_MLA}.cutlass_mla:CutlassMLAImpl.forward_mqa",
            decode_calls=("vllm._custom_ops:sm100_cutlass_mla_decode",
                          "vllm._custom_ops:sm100_cutlass_mla_get_workspace_size"),
            real_ops=(("_C", "sm100_cutlass_mla_decode"),)),
    Backend("TOKENSPEED_MLA", "mla", f"{_MLA}.tokenspeed_mla:TokenspeedMLAImpl.forward_mqa",
            decode_calls=("tokenspeed_mla:tokenspeed_mla_decode", "tokenspeed_mla:get_num_sm",
                          "tokenspeed_mla:warmup_compile_prefill"),
            real_ops=("tokenspeed_mla",)),
    # sparse MLA (DeepSeek-V3.2): the index conversion and the sparse decode are Triton (xpu_mla_sparse.py);
    # its builder (XPUMLASparseMetadataBuilder: CUDA graphs NEVER) reads the scheduler's and model's config only
    Backend("XPU_MLA_SPARSE", "mla", f"{_MLA}.xpu_mla_sparse:XPUMLASparseImpl.forward_mqa",
            kernels=(_CONVERT_INDEX, f"{ATTN_OPS}.xpu_mla_sparse:triton_bf16_mla_sparse_interface"), dcp_kernels=(),
            platforms=("rocm", "xpu"), compilation_blind=True),
    # sparse MLA on FlashMLA (flashmla_sparse.py): a bf16 cache decodes with the sparse "prefill" kernel
    # (_bf16_flash_mla_kernel -> flash_mla_sparse_fwd), an FP8 (656-byte) cache with the sparse decode
    # kernel (_fp8_flash_mla_kernel -> flash_mla_with_kvcache(indices=..., is_fp8_kvcache=True)); the query
    # is packed by concat_mla_q first. The record names the index conversion (the index group's or
    # forward_mqa's own; under DCP the global positions filtered to this rank's and converted); the
    # attention is FlashMLA's (emulated: the record's ``emulated`` names which of its ops ran).
    Backend("FLASHMLA_SPARSE", "mla", f"{_MLA}.flashmla_sparse:FlashMLASparseImpl.forward_mqa",
            decode_calls=("torch.ops._flashmla_C:sparse_prefill_fwd", "torch.ops._flashmla_C:sparse_decode_fwd",
                          "vllm._custom_ops:concat_mla_q"),
            real_ops=(("_flashmla_C", "sparse_prefill_fwd"), ("_flashmla_C", "sparse_decode_fwd")),
            kernels=(_CONVERT_INDEX,), dcp_kernels=(f"{SPARSE_UTILS}:triton_filter_and_convert_dcp_index",),
            platforms=("rocm",)),
    # the CPU platform (a CPU build of vllm._C registers the ops)
    Backend("CPU_MLA", "mla", f"{_MLA}.cpu_mla:CPUMLAImpl.forward_mqa",
            decode_calls=("torch.ops._C:mla_decode_kvcache",), platforms=("cpu",), cpu_op="mla_decode_kvcache"),
    # AMX CPUs: the impl packs its absorption weights, MLAAttention absorbs / de-absorbs with bmm_cpu; its own
    # forward_mha prefills with extend_attention_cpu
    Backend("AMX_MLA", "mla", f"{_MLA}.amx_mla:AMXMLAImpl.forward_mqa",
            decode_calls=("torch.ops._C:convert_weight_packed", "torch.ops._C:bmm_cpu",
                          "torch.ops._C:decode_attention_cpu"),
            platforms=("cpu",), cpu_op="decode_attention_cpu",
            own_prefill={"cpu": (f"{_MLA}.amx_mla:AMXMLAImpl.forward_mha",
                                 ("torch.ops._C:convert_weight_packed", "torch.ops._C:bmm_cpu",
                                  "torch.ops._C:extend_attention_cpu"))}),
    # ROCm's AITER backends: no emulation of aiter's decode yet
    Backend("ROCM_AITER_MLA", unemulated_kernel=_AITER_DECODE),
    Backend("ROCM_AITER_TRITON_MLA", unemulated_kernel=_AITER_DECODE),
    Backend("ROCM_AITER_MLA_SPARSE",
            unemulated_kernel="ROCMAiterMLASparseImpl._forward_mla_aiter (aiter's sparse MLA decode)"),
    # -- GQA models (``rank.run_attn``) --
    # XPU's TRITON_ATTN loads its KV tiles through Triton tensor descriptors (``use_td``, on by default
    # there), which the interpreter runs as masked loads (``interpreter.int1_mask_fix`` passes them through).
    Backend("TRITON_ATTN", "attn", "vllm.v1.attention.backends.triton_attn:TritonAttentionImpl.forward",
            kernels=(f"{ATTN_OPS}.triton_unified_attention:unified_attention",), platforms=("rocm", "xpu"),
            compilation_blind=True, unquantised_query=True),
    Backend("FLASH_ATTN", "attn", "vllm.v1.attention.backends.flash_attn:FlashAttentionImpl.forward",
            decode_calls=_FLASH_ATTN_VARLEN, real_ops=(("_vllm_fa3_C", "fwd"),)),
    # the CPU platform: its builder schedules, the model runner's cache update writes, the impl attends
    Backend("CPU_ATTN", "attn", "vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.forward",
            decode_calls=("torch.ops._C:get_scheduler_metadata", "torch.ops._C:cpu_attn_reshape_and_cache",
                          "torch.ops._C:cpu_attention_with_kv_cache"),
            platforms=("cpu",),
            cache_writers=("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackendImpl.do_kv_cache_update",
                           "vllm.v1.attention.backends.cpu_attn:CPUAttentionMetadataBuilder.build")),
    # ROCm: Triton. ``chunked_prefill_paged_decode`` sends rows of more than one query token to the Triton
    # ``context_attention_fwd`` (prefix_prefill.py) and decodes single-token rows with its Triton
    # ``kernel_paged_attention_2d``, unless ``use_rocm_custom_paged_attention`` picks the compiled
    # ``ops.paged_attention_rocm`` (HIP; CDNA, 64/128-wide heads, blocks of 16/32, at most 16 query heads per
    # KV head): that op is not in this host's vLLM build, and such a cell is ``not-run`` naming it
    # (``platform_check.platform_ops_missing``).
    Backend("ROCM_ATTN", "attn", "vllm.v1.attention.backends.rocm_attn:RocmAttentionImpl.forward",
            kernels=(f"{ATTN_OPS}.chunked_prefill_paged_decode:chunked_prefill_paged_decode",
                     f"{ATTN_OPS}.chunked_prefill_paged_decode:kernel_paged_attention_2d"),
            verify_kernels=(f"{ATTN_OPS}.prefix_prefill:context_attention_fwd",),
            platforms=("rocm",), split_kv_cache=True),
)}


def backend(name: str) -> Backend:
    """The record of the backend vLLM registers as ``name``; an empty one (no check) for a name not known here."""
    return BACKENDS.get(name) or Backend(name)
