"""What the project knows about each SGLang attention backend: one record a backend.

Which class SGLang builds for a name, how that backend's check runs on this
host (under Triton's interpreter, as plain torch, around emulated kernel
libraries, or only on its GPU), what a GPU run of it needs, what it calls on
other platforms and what the notes say ran there. The modules of this package
read a backend's record instead of keeping tables of their own; a name SGLang
registers that the project does not know gets ``Backend``'s defaults
(``backend``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from ..common.schedule import SplitSchedule

__all__ = ["BACKENDS", "Backend", "backend"]

#: sgl-kernel's CPU attention ops, which IntelAMXAttnBackend decodes (and writes the new token's K/V) and
#: extends / verifies with, for any model.
_CPU_ATTENTION_OPS = ("torch.ops.sgl_kernel:decode_attention_cpu", "torch.ops.sgl_kernel:extend_attention_cpu")
_ATTENTION = "sglang.srt.layers.attention"


@dataclasses.dataclass(frozen=True)
class Backend:
    """One SGLang attention backend (a name of SGLang's ``ATTENTION_BACKENDS``)."""

    name: str
    #: The class SGLang's factory builds for it, and that class's module (``sglang``: not known).
    class_name: str = ""
    module: str = "sglang"
    #: How its check runs on this host without its GPU: ``interpreted`` (Triton's interpreter), ``native``
    #: (plain torch), ``emulated`` (its own code around the emulations of every kernel library it calls,
    #: ``kernels.emulated``), or None (only on its GPU).
    cpu_check: str | None = None
    #: Where it runs for real, and the kernel libraries it needs there.
    gpu_archs: tuple[str, ...] = ()
    gpu_libraries: tuple[str, ...] = ()
    #: Its cells on a DeepSeek DSA checkpoint are not checked: its backend answers the DSA indexer's
    #: ``get_indexer_metadata`` with metadata of its own, which the check does not model.
    dsa_unmodelled: bool = False
    #: It runs its kernel through ``torch.compile`` (Inductor compiles it for this CPU).
    compiled_by_torch: bool = False
    #: It reads ``--triton-attention-num-kv-splits`` (the notes say the value).
    reads_num_kv_splits: bool = False
    #: Under DCP its KV writes go through the pool's masked path (``_set_kv_buffer``), never a platform's
    #: own store op.
    masked_dcp_writes: bool = False
    #: The platforms other than CUDA whose child process runs its check (``platform_check``).
    checked_on: tuple[str, ...] = ()
    #: Its own kernel-library calls on a platform check's path, emulated in ``kernels.emulated``:
    #: (platform, MLA model?) -> ops.
    platform_ops: Mapping[tuple[str, bool], tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: The note of a platform check saying what ran: on the CPU platform with ``cpu_platform_suffix``,
    #: elsewhere with "(no <platform> device here)".
    ran_on_platform: str = ""
    cpu_platform_suffix: str = ""
    #: What it decodes with where its check does not run, and why this host cannot: ``library`` (a kernel
    #: library this host lacks), ``unemulated library`` (one without an emulation yet), ``device`` (its
    #: CUDA code on another platform's device), ``unemulated kernels`` (kernels without an emulation yet).
    decodes_with: str | None = None
    missing_here: str = "library"
    #: Its split-KV schedule (``common.schedule``): the split counts its decode kernel is handed are recorded.
    schedule: SplitSchedule | None = None

    def __post_init__(self) -> None:
        if not self.class_name:
            object.__setattr__(self, "class_name", self.name)

    def other_platform_reason(self, arch: str, platform: str) -> str:
        """Why an accepted cell of a non-CUDA platform runs no check here, naming what it would need."""
        name, decoder = self.name, self.decodes_with
        if decoder is None:
            return (f"SGLang's {name} on the {platform} platform ({arch}): the engine checks run on this "
                    "platform for SGLang's triton and torch_native backends only")
        if self.missing_here == "unemulated library":
            return f"SGLang's {name} decodes with {decoder}, which has no emulation yet"
        if self.missing_here == "device":
            return (f"SGLang's {name} on the {platform} platform ({arch}) decodes with {decoder} on a {platform} "
                    "device, which this host lacks; its check runs on the ROCm, CPU and XPU platforms only")
        if self.missing_here == "unemulated kernels":
            return f"SGLang's {name} on the {platform} platform ({arch}) decodes with {decoder}, which has no emulation yet"
        return f"SGLang's {name} decodes with {decoder}, which this host lacks"

    def platform_note(self, platform: str, label: str) -> str:
        """What ran of it in a platform check (``label``: the platform's name in prose)."""
        return self.ran_on_platform + (self.cpu_platform_suffix if platform == "cpu" else f" (no {label} device here)")


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("triton", "TritonAttnBackend", f"{_ATTENTION}.triton_backend", cpu_check="interpreted",
            reads_num_kv_splits=True, masked_dcp_writes=True, checked_on=("rocm", "cpu", "xpu"),
            ran_on_platform="SGLang's Triton kernels ran under Triton's interpreter on this host's CPU",
            cpu_platform_suffix=" (Triton has no compiler for the CPU platform)",
            decodes_with="TritonAttnBackend.forward_decode's Triton kernel (decode_attention_fwd)",
            missing_here="device",
            # bound on the backend object (``self.decode_attention_fwd``); the counts, one per request, come from
            # its get_num_kv_splits (the batch's length ratio and --triton-attention-num-kv-splits)
            schedule=SplitSchedule(":decode_attention_fwd", "num_kv_splits")),
    Backend("torch_native", "TorchNativeAttnBackend", f"{_ATTENTION}.torch_native_backend", cpu_check="native",
            checked_on=("rocm", "cpu", "xpu"), ran_on_platform="torch ran on this host's CPU",
            decodes_with="TorchNativeAttnBackend.forward_decode (torch.nn.functional.scaled_dot_product_attention)",
            missing_here="device"),
    Backend("flex_attention", "TorchFlexAttnBackend", f"{_ATTENTION}.torch_flex_backend", cpu_check="native",
            compiled_by_torch=True),
    Backend("flashinfer", "FlashInferMLAAttnBackend", f"{_ATTENTION}.flashinfer_mla_backend", cpu_check="emulated",
            gpu_archs=("sm80", "sm90", "sm100"), gpu_libraries=("flashinfer", "sgl_kernel")),
    Backend("fa3", "FlashAttentionBackend", f"{_ATTENTION}.flashattention_backend", cpu_check="emulated",
            gpu_archs=("sm80", "sm90"), gpu_libraries=("sgl_kernel",)),
    # FA4: SGLang's vendored CuTe copy needs NVIDIA's CuTe DSL (``cutlass``); on SM120 another module
    Backend("fa4", "FlashAttentionBackend", f"{_ATTENTION}.flashattention_backend", cpu_check="emulated",
            gpu_archs=("sm80", "sm90", "sm100"), gpu_libraries=("cutlass",)),
    Backend("flashmla", "FlashMLABackend", f"{_ATTENTION}.flashmla_backend", cpu_check="emulated",
            gpu_archs=("sm90", "sm100"), gpu_libraries=("sgl_kernel",)),
    Backend("cutlass_mla", "CutlassMLABackend", f"{_ATTENTION}.cutlass_mla_backend",
            gpu_archs=("sm100",), gpu_libraries=("sgl_kernel",)),
    Backend("trtllm_mla", "TRTLLMMLABackend", f"{_ATTENTION}.trtllm_mla_backend", cpu_check="emulated",
            gpu_archs=("sm100",), gpu_libraries=("flashinfer", "sgl_kernel")),
    Backend("trtllm_mha", "TRTLLMHAAttnBackend", f"{_ATTENTION}.trtllm_mha_backend", cpu_check="emulated",
            gpu_archs=("sm90", "sm100"), gpu_libraries=("flashinfer", "sgl_kernel")),
    Backend("cutedsl_mla", "CuteDslMLABackend", f"{_ATTENTION}.cutedsl_mla_backend", cpu_check="emulated",
            gpu_archs=("sm100",), gpu_libraries=("cutlass", "sgl_kernel")),
    Backend("tokenspeed_mla", gpu_archs=("sm100",), gpu_libraries=("sgl_kernel",)),
    # Qwen's sparse attention decodes through flash_attn (FA2) or FA4's CuTe varlen (its _flash_attn_varlen_func),
    # which have no emulation: its code runs up to its first kernel library, and a run that reaches one is
    # not-run naming it (``checks.run``); on a model without a QSA indexer its forward metadata raises before
    # that (a finding, matrix/sglang.toml).
    Backend("qsa", "QwenSparseAttnBackend", cpu_check="emulated", gpu_archs=("sm80", "sm90", "sm100"),
            gpu_libraries=("flash_attn",), dsa_unmodelled=True),
    Backend("intel_amx", "IntelAMXAttnBackend", f"{_ATTENTION}.intel_amx_backend", checked_on=("cpu",),
            platform_ops={("cpu", True): _CPU_ATTENTION_OPS, ("cpu", False): _CPU_ATTENTION_OPS},
            ran_on_platform="SGLang's IntelAMXAttnBackend ran on this host's CPU",
            cpu_platform_suffix=" around sgl-kernel's CPU attention ops"),
    # With an MLA model (xpu_backend.py, ``use_mla``) ``init_forward_metadata`` sizes its workspaces,
    # ``forward_decode`` calls ``flash_mla_decode``, ``forward_extend`` (target verify, draft extend)
    # ``flash_mla_prefill`` (``sgl_kernel_xpu_attention``); without MLA both call ``sgl_kernel.flash_attn``'s
    # ``flash_attn_with_kvcache``, sgl-kernel-xpu's, not FA3's (``sgl_kernel_xpu_flash_attn``, installed from the
    # XPU platform's registry).
    Backend("intel_xpu", "XPUAttentionBackend", f"{_ATTENTION}.xpu_backend", checked_on=("xpu",),
            platform_ops={("xpu", True): ("sgl_kernel:flash_mla_decode", "sgl_kernel:flash_mla_prefill",
                                          "sgl_kernel:flash_mla_decode_get_workspace_size",
                                          "sgl_kernel:flash_mla_prefill_get_workspace_size"),
                          ("xpu", False): ("sgl_kernel.flash_attn:flash_attn_with_kvcache",)},
            ran_on_platform="SGLang's XPUAttentionBackend ran on this host's CPU",
            decodes_with="sgl-kernel-xpu's flash_mla_decode (an MLA model; flash_attn_with_kvcache otherwise)"),
    Backend("aiter", decodes_with="aiter.mla.mla_decode_fwd", missing_here="unemulated library"),
    Backend("ascend", decodes_with="torch_npu's fused attention ops"),
    Backend("wave", decodes_with="wave_lang's decode kernel"),
    Backend("dsa", decodes_with="DeepseekSparseAttnBackend.forward_decode's sparse MLA kernels (the "
                                "--dsa-decode-backend SGLang resolves for the platform)",
            missing_here="unemulated kernels"),
)}


def backend(name: str) -> Backend:
    """The record of SGLang's backend ``name``; one with the defaults for a name the project does not know."""
    return BACKENDS.get(name) or Backend(name)
