"""What the project knows about each vLLM attention backend its checks drive: one record a backend.

A ``Backend`` says how the backend's check is built (the MLA or the GQA
runner, its cache layout), which impl method and kernels the record names,
which compiled calls a path makes and what must be loaded for them to run
for real (else ``emulation`` replaces them with float64 emulations), and on
which other platforms its check runs. ``backend(name)`` is the record of a
name vLLM registers; a name the project knows nothing of gets an empty one
(no check drives it).

``backend_facts`` is the other half: what vLLM itself declares on each backend
class (dtypes, KV-cache dtypes, block and head sizes, compute capability, ...),
read from the installed classes when asked (``VLLMEngine.metadata()``), never
from a record here.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Mapping

from ..common.schedule import SplitSchedule

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
    #: Its split-KV schedule (``common.schedule``): the split counts its decode kernel is handed are recorded,
    #: and a check of plain decode adds the lengths that cross its split threshold (``harness.schedule_case``).
    schedule: SplitSchedule | None = None

    def decode_kernels(self, dcp: bool) -> tuple[str, ...]:
        """What the MLA decode path runs besides ``function`` (``dcp``: under DCP), for the record."""
        return self.dcp_kernels if dcp and self.dcp_kernels is not None else self.kernels

    def attn_kernels(self, s_q: int) -> tuple[str, ...]:
        """What a GQA impl's ``forward`` runs besides itself on rows of ``s_q`` query tokens, for the record."""
        return self.kernels + (self.verify_kernels if s_q > 1 else ())


_MLA = "vllm.v1.attention.backends.mla"


def _triton_mla_split_from() -> int | None:
    """The cached tokens (per rank) from which TRITON_MLA's ``forward_mqa`` hands ``decode_attention_fwd`` more
    than one KV split: ``_compute_num_kv_splits`` takes ``next_power_of_2(max_seq_len // _MIN_WORK_PER_SPLIT)``,
    2 from twice that work. None where the installed release has no such constant (an older vLLM splits
    every request a fixed number of ways, which the recorded schedule shows)."""
    import importlib

    work = getattr(importlib.import_module(f"{_MLA}.triton_mla"), "_MIN_WORK_PER_SPLIT", None)
    return 2 * int(work) if isinstance(work, int) and work > 0 else None


_TRITON_MLA_SPLITS = SplitSchedule(f"{_MLA}.triton_mla:decode_attention_fwd", "num_kv_splits", _triton_mla_split_from)
_CONVERT_INDEX = f"{SPARSE_UTILS}:triton_convert_req_index_to_global_index"
_FLASH_ATTN_VARLEN = ("vllm.vllm_flash_attn:flash_attn_varlen_func", "vllm.vllm_flash_attn:get_scheduler_metadata")
_AITER_DECODE = "aiter.mla.mla_decode_fwd"

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    # -- MLA models (``rank.run_mla``) --
    Backend("TRITON_MLA", "mla", f"{_MLA}.triton_mla:TritonMLAImpl.forward_mqa",
            kernels=(f"{ATTN_OPS}.triton_decode_attention:decode_attention_fwd",),
            platforms=("rocm", "xpu"), compilation_blind=True, schedule=_TRITON_MLA_SPLITS),
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


# -- what vLLM itself declares on each backend class (``VLLMEngine.metadata()["backend_facts"]``) -------------------

#: The CUDA compute capabilities ``supports_compute_capability`` is asked about (Volta to Blackwell, the releases'
#: GPUs; vLLM's page, generated by its ``tools/pre_commit/generate_attention_backend_docs.py``, reads the method's
#: comparisons instead, which a class's own code can only be asked at run time).
CAPABILITIES = ((7, 0), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
#: ``torch.dtype`` → the word vLLM's page uses (a dtype not named here is torch's own name).
DTYPE_WORDS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
#: ``AttentionType`` member → the word vLLM's page uses (a member not named here is its value).
ATTENTION_TYPE_WORDS = {"DECODER": "Decoder", "ENCODER": "Encoder", "ENCODER_ONLY": "Encoder Only",
                        "ENCODER_DECODER": "Enc-Dec"}
#: Longest text of an ``error`` fact (one line).
ERROR_CHARS = 300


#: The first failure to import each backend class (by class path) in this process: a module that failed half-way
#: leaves its submodules in ``sys.modules``, and a later try may then "import" the class, or fail otherwise.
_IMPORT_FAILURES: dict[str, str] = {}


class ClassUnavailable(ImportError):
    """A backend class this process could not import (its text: the first failure's ``error_text``)."""


def backend_class(member: Any) -> type:
    """The class of an ``AttentionBackendEnum`` member (``member.get_class()``), the same answer however often asked.

    A placeholder without a class raises vLLM's own ``ValueError``; a class whose import failed once raises
    ``ClassUnavailable`` with that first failure's text ever after, as does a class whose package is missing from
    ``sys.modules`` (it loaded from the half a failed import left).
    """
    path = member.get_path()
    failed = _IMPORT_FAILURES.get(path)
    if failed is not None:
        raise ClassUnavailable(failed)
    try:
        cls = member.get_class()
    except Exception as exc:
        _IMPORT_FAILURES[path] = error_text(exc)
        raise ClassUnavailable(_IMPORT_FAILURES[path]) from exc
    module = cls.__module__
    missing = [p for p in (module[:i] for i, c in enumerate(module) if c == ".") if p not in sys.modules]
    if missing:
        _IMPORT_FAILURES[path] = (f"ImportError: package {missing[0]} did not import ({module} is what an earlier "
                                  "failed import of it left)")
        raise ClassUnavailable(_IMPORT_FAILURES[path])
    return cls


def backend_facts(enum: Any, capability_cls: type) -> dict[str, dict[str, Any]]:
    """Every member of vLLM's ``AttentionBackendEnum`` → :func:`class_facts` of its class, by member name (sorted).

    A member whose class cannot be had (a placeholder such as ``CUSTOM``, a module that does not import
    here) is ``{"error": "ExcType: message"}``; nothing raised by vLLM's code escapes.
    """
    facts: dict[str, dict[str, Any]] = {}
    for member in enum:
        try:
            cls = backend_class(member)
        except Exception as exc:  # a placeholder, a module this host cannot import
            facts[member.name] = {"error": error_text(exc)}
            continue
        facts[member.name] = class_facts(cls, capability_cls)
    return dict(sorted(facts.items()))


def class_facts(cls: type, capability_cls: type) -> dict[str, Any]:
    """What the backend class ``cls`` declares, read from it now (its ClassVars and classmethods), as plain values.

    Each fact is computed on its own: one whose method raises is ``{"error": "ExcType: message"}`` and the others
    stand. The keys and wording follow vLLM's own page (``docs/design/attention_backends.md``); see
    ``docs/engines.md`` ("Backend facts").
    """
    readers: dict[str, Callable[[], Any]] = {
        "class": lambda: f"{cls.__module__}:{cls.__qualname__}",
        "name": lambda: str(cls.get_name()),
        "dtypes": lambda: [_dtype_word(d) for d in cls.supported_dtypes],
        "kv_cache_dtypes": lambda: _kv_cache_dtypes(cls),
        "block_sizes": lambda: _block_sizes(cls.get_supported_kernel_block_sizes()),
        "head_sizes": lambda: [int(s) for s in cls.get_supported_head_sizes()] or "any",
        "mla": lambda: bool(cls.is_mla()),
        "sparse": lambda: bool(cls.is_sparse()),
        "sink": lambda: bool(cls.supports_sink()),
        "mm_prefix": lambda: bool(cls.supports_mm_prefix()),
        "dcp": lambda: bool(cls.supports_dcp()),
        "attention_types": lambda: _attention_types(cls),
        "compute_capabilities": lambda: _capabilities(cls, capability_cls),
        "compute_capability": lambda: capability_range(_capabilities(cls, capability_cls)),
        "cudagraph": lambda: _cudagraph(cls)[0],
        "cudagraph_by_config": lambda: _cudagraph(cls)[1],
    }
    facts: dict[str, Any] = {}
    for key in sorted(readers):
        try:
            facts[key] = readers[key]()
        except Exception as exc:  # vLLM's own method raised: that fact says so, the others stand
            facts[key] = {"error": error_text(exc)}
    return facts


def error_text(exc: BaseException) -> str:
    """``"ExcType: message"`` on one line, at most ``ERROR_CHARS`` long (``ClassUnavailable``: its text)."""
    if isinstance(exc, ClassUnavailable):
        return str(exc)
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"


def capability_range(accepted: list[str]) -> str:
    """The accepted capabilities (``"M.m"``, of ``CAPABILITIES``) worded as vLLM's page words them.

    ``"Any"`` when every one is accepted, ``"none"`` when none is; otherwise a major whose every tried
    capability is accepted is ``"M.x"``, consecutive such majors one range ``"9.x-10.x"``, and a major
    accepted only in part lists its capabilities (``"10.0"``), joined by ``", "``.
    """
    tried = [f"{major}.{minor}" for major, minor in CAPABILITIES]
    if accepted == tried:
        return "Any"
    if not accepted:
        return "none"
    majors = sorted({major for major, _ in CAPABILITIES})
    words: list[str] = []
    run: list[int] = []  # consecutive majors accepted whole

    def close_run() -> None:
        if run:
            words.append(f"{run[0]}.x" if len(run) == 1 else f"{run[0]}.x-{run[-1]}.x")
            run.clear()

    for major in majors:
        of_major = [f"{major}.{minor}" for m, minor in CAPABILITIES if m == major]
        taken = [c for c in of_major if c in accepted]
        if taken == of_major:
            run.append(major)
            continue
        close_run()
        words.extend(taken)
    close_run()
    return ", ".join(words)


def _dtype_word(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return DTYPE_WORDS.get(name, name)


def _kv_cache_dtypes(cls: type) -> list[str] | str:
    """The KV-cache dtypes ``supports_kv_cache_dtype`` accepts: the declared ``supported_kv_cache_dtypes`` first (in
    their order), then any other ``CacheDType`` value it accepts (a class that overrides the method); ``"any"``
    when nothing is declared and every value is accepted (the base method's empty list)."""
    declared = [str(d) for d in cls.supported_kv_cache_dtypes]
    known = _cache_dtypes()
    candidates = declared + [d for d in known if d not in declared]
    accepted = [d for d in candidates if cls.supports_kv_cache_dtype(d)]
    if not declared and known and accepted == candidates:
        return "any"
    return accepted


def _cache_dtypes() -> list[str]:
    """The values of vLLM's ``CacheDType`` literal (empty where this release has none)."""
    import typing

    try:
        from vllm.config.cache import CacheDType  # type: ignore[import-not-found]
    except Exception:
        return []
    return [str(v) for v in typing.get_args(CacheDType)]


def _block_sizes(sizes: Any) -> list[int | str]:
    """``get_supported_kernel_block_sizes()`` as vLLM's page writes it: an int itself, ``MultipleOf(n)`` ``"%n"``."""
    words: list[int | str] = []
    for size in sizes:
        if isinstance(size, int):
            words.append(int(size))
        elif isinstance(getattr(size, "base", None), int):  # vLLM's MultipleOf
            words.append(f"%{size.base}")
        else:
            words.append(str(size))
    return words


def _attention_types(cls: type) -> list[str]:
    """The ``AttentionType`` members ``supports_attn_type`` accepts, in the enum's order, in vLLM's page's words."""
    from vllm.v1.attention.backend import AttentionType  # type: ignore[import-not-found]

    return [ATTENTION_TYPE_WORDS.get(t.name, str(t.value)) for t in AttentionType if cls.supports_attn_type(t)]


def _capabilities(cls: type, capability_cls: type) -> list[str]:
    """The ``CAPABILITIES`` the class's ``supports_compute_capability`` accepts, as ``"M.m"``."""
    return [f"{major}.{minor}" for major, minor in CAPABILITIES
            if cls.supports_compute_capability(capability_cls(major, minor))]


def _cudagraph(cls: type) -> tuple[str, bool]:
    """The metadata builder's declared CUDA-graph support (its ``_cudagraph_support`` member's name) and whether the
    builder overrides ``get_cudagraph_support`` (then the answer depends on the config; the name is its default)."""
    builder = cls.get_builder_cls()
    support = builder._cudagraph_support
    owner = next(k for k in builder.__mro__ if "get_cudagraph_support" in vars(k))
    base = next((k for k in reversed(builder.__mro__) if "get_cudagraph_support" in vars(k)), owner)
    return str(getattr(support, "name", support)), owner is not base


# -- what vLLM decides without being asked: its CUDA priority orders and its MLA prefill backends ------------------

#: The CUDA archs whose answers ``VLLMEngine.metadata()`` records beside ``backend_facts``: a few facts change with
#: the device (FlashAttention 2/3/4, FlashInfer's TRT-LLM path), and so do the priority orders.
FACT_ARCHS = ("sm80", "sm90", "sm100", "sm120")
#: Arguments of ``_get_backend_priorities`` besides ``use_mla`` and the capability, each tried alone: an order that
#: differs from the order without it is recorded under ``when`` (a server passes the model's values).
PRIORITY_VARIANTS: dict[str, tuple[dict[str, Any], ...]] = {
    "mla": ({"kv_cache_dtype": "fp8"}, {"num_heads": 16}, {"num_heads": 128}, {"head_size": 512}),
    "standard": ({"use_mm_prefix": True}, {"use_non_causal": True}),
}
#: The dims ``MLAPrefillSelectorConfig`` holds when a model declares none: the orders record it as "other dims".
OTHER_DIMS = (0, 0, 0)
#: ``(qk_nope_head_dim, qk_rope_head_dim, v_head_dim)`` of the MLA families served in 2026, from their checkpoints'
#: ``config.json`` (as transformers 5.24 ships them): MiniCPM3; Mistral Small 4 and Large 3; DeepSeek-V2/V3/V3.2
#: and Kimi-K2; GLM-4.7-Flash and GLM-5. The prefill facts say which of them each prefill backend takes.
SERVED_MLA_DIMS = ((64, 32, 64), (64, 64, 128), (128, 64, 128), (192, 64, 256))


def facts_differing(base: Mapping[str, Mapping[str, Any]],
                    other: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """backend → the facts of ``other`` that differ from ``base`` (the answers of one device beside another's)."""
    out: dict[str, dict[str, Any]] = {}
    for name, facts in other.items():
        mine = base.get(name) or {}
        changed = {k: v for k, v in facts.items() if mine.get(k) != v}
        if changed:
            out[name] = changed
    return out


def backend_priorities(function: Callable[..., Any], capability: Any) -> dict[str, Any]:
    """The orders in which vLLM's CUDA platform tries backends when none is asked for, on ``capability``:
    ``{"mla": {"order": [...], "when": [{"args": {...}, "order": [...]}]}, "standard": {...}}``, from the
    platform's own ``_get_backend_priorities`` (``function``). A variant of ``PRIORITY_VARIANTS`` is recorded only
    where its order differs; one the function does not take is left out; one that raises is its ``error``."""
    import inspect

    try:
        params = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        params = set()
    out: dict[str, Any] = {}
    for kind, use_mla in (("mla", True), ("standard", False)):
        try:
            order = _member_names(function(use_mla, capability))
        except Exception as exc:
            out[kind] = {"error": error_text(exc)}
            continue
        when: list[dict[str, Any]] = []
        for args in PRIORITY_VARIANTS[kind]:
            if not set(args) <= params:
                continue
            try:
                other = _member_names(function(use_mla, capability, **args))
            except Exception as exc:
                when.append({"args": dict(args), "error": error_text(exc)})
                continue
            if other != order:
                when.append({"args": dict(args), "order": other})
        out[kind] = {"order": order, "when": when}
    return out


def prefill_facts(enum: Any, capability_cls: type, dims: list[tuple[int, int, int]],
                  dims_cls: type) -> dict[str, dict[str, Any]]:
    """Every member of vLLM's ``MLAPrefillBackendEnum`` → what its class declares: name, dtypes, which of ``dims``
    (``(nope, rope, v)``) its ``supports_mla_dimensions`` takes (``"any"``: every one, ``OTHER_DIMS`` included),
    and the compute capabilities it accepts. A member whose class cannot be had is ``{"error": ...}``, a fact
    whose method raises that fact's ``error``."""
    facts: dict[str, dict[str, Any]] = {}
    for member in enum:
        try:
            cls = member.get_class()
        except Exception as exc:  # the CUSTOM placeholder, a module this host cannot import
            facts[member.name] = {"error": error_text(exc)}
            continue
        readers: dict[str, Callable[[], Any]] = {
            "class": lambda: f"{cls.__module__}:{cls.__qualname__}",
            "name": lambda: str(cls.get_name()),
            "dtypes": lambda: [_dtype_word(d) for d in cls.supported_dtypes],
            "mla_dimensions": lambda: _mla_dimensions(cls, dims, dims_cls),
            "compute_capabilities": lambda: _capabilities(cls, capability_cls),
            "compute_capability": lambda: capability_range(_capabilities(cls, capability_cls)),
        }
        entry: dict[str, Any] = {}
        for key in sorted(readers):
            try:
                entry[key] = readers[key]()
            except Exception as exc:
                entry[key] = {"error": error_text(exc)}
        facts[member.name] = entry
    return dict(sorted(facts.items()))


def prefill_orders(platform: Any, enum: Any, selector_config: Callable[..., Any], dims_cls: type,
                   dims: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """The order in which ``platform.get_mla_prefill_backend_cls`` tries MLA prefill backends for each of ``dims``
    (``(nope, rope, v)``), grouped where orders agree: ``[{"dims": ["192/64/256"], "order": [...]}, ...]``
    (``OTHER_DIMS`` is ``"other"``).

    The order is the platform's own code's: each backend it asks the enum for is recorded and answers "not
    valid here", so the platform goes on to the next until none is left (its ``ValueError`` is expected).
    """
    import torch

    tried: list[str] = []

    class _Refuses:
        @staticmethod
        def get_name() -> str:
            return "probe"

        @classmethod
        def validate_configuration(cls, *args: Any, **kwargs: Any) -> list[str]:
            return ["probed for its order"]

        @classmethod
        def is_available(cls) -> bool:
            return False

    def get_class(member: Any) -> type:
        tried.append(member.name)
        return _Refuses

    had = "get_class" in vars(enum)
    original = vars(enum).get("get_class")
    groups: dict[tuple[str, ...], list[str]] = {}
    type.__setattr__(enum, "get_class", get_class)
    try:
        for nope, rope, v in dims:
            tried.clear()
            config = selector_config(dtype=torch.bfloat16,
                                     mla_dimensions=dims_cls(qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                                                             v_head_dim=v))
            try:
                platform.get_mla_prefill_backend_cls(config)
            except Exception:  # none valid: the probe's doing
                pass
            groups.setdefault(tuple(tried), []).append(dims_label((nope, rope, v)))
    finally:
        if had:
            type.__setattr__(enum, "get_class", original)
        else:
            type.__delattr__(enum, "get_class")
    return [{"dims": labels, "order": list(order)} for order, labels in groups.items()]


def prefill_dims(enum: Any) -> list[tuple[int, int, int]]:
    """The MLA dims the prefill facts and orders are asked about: ``SERVED_MLA_DIMS``, then any other a prefill
    class lists in ``supported_mla_dimensions`` (a class that cannot be had lists none), then ``OTHER_DIMS``."""
    seen = dict.fromkeys(SERVED_MLA_DIMS)
    for member in enum:
        try:
            listed = member.get_class().supported_mla_dimensions
        except Exception:
            continue
        for d in listed:
            seen.setdefault((int(d.qk_nope_head_dim), int(d.qk_rope_head_dim), int(d.v_head_dim)), None)
    seen.setdefault(OTHER_DIMS, None)
    return list(seen)


def dims_label(dims: Any) -> str:
    """``"192/64/256"`` (nope/rope/v), ``"other"`` for ``OTHER_DIMS``."""
    nope, rope, v = (int(x) for x in dims)
    return "other" if (nope, rope, v) == OTHER_DIMS else f"{nope}/{rope}/{v}"


def _mla_dimensions(cls: type, dims: list[tuple[int, int, int]], dims_cls: type) -> list[str] | str:
    taken = [d for d in dims
             if cls.supports_mla_dimensions(dims_cls(qk_nope_head_dim=d[0], qk_rope_head_dim=d[1], v_head_dim=d[2]))]
    return "any" if taken == dims else [dims_label(d) for d in taken]


def _member_names(members: Any) -> list[str]:
    return [str(getattr(m, "name", m)) for m in members]
