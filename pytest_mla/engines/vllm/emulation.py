"""Where the compiled kernels of a vLLM MLA check come from: the real libraries on a GPU, float64 emulations elsewhere.

The driver (``rank.run_mla``) is the same code either way: it builds vLLM's
layer, metadata builder, cache and DCP group and calls
``MLAAttention.forward_impl``. Only the innermost compiled calls differ:

* level ``backend``: a CUDA device of the cell's arch and the backend's
  compiled entry points loaded for real (``real_kernels_missing`` says which
  are not); nothing is replaced;
* level ``emulated``: the entry points listed here are replaced for the run by
  ``kernels.emulated`` (``emulations_installed``), each call logged; the
  check reports the ones that ran.

Which entry points a path reaches is read from vLLM 0.34.0's source (file:line
in ``docs/engines.md``); an emulation asked for something outside its
contract raises ``OutOfContractError`` and the cell is ``not-run``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ..common.shared_scope import SharedScope
from . import backends

#: The compiled calls of vLLM's MLA prefill path (``MLACommonBaseImpl.forward_mha`` on the
#: FLASH_ATTN prefill backend): the varlen attention of the new tokens and of the cached
#: context, the context gathers, the merge of the two states.
PREFILL_CALLS = ("vllm.vllm_flash_attn:flash_attn_varlen_func",
                 "vllm._custom_ops:cp_gather_cache",
                 "vllm._custom_ops:gather_and_maybe_dequant_cache",
                 "vllm._custom_ops:merge_attn_states")
#: The method that computes vLLM's MLA prefill, unless the backend has its own (``Backend.own_prefill``).
PREFILL_FUNCTION = "vllm.model_executor.layers.attention.mla_attention:MLACommonBaseImpl.forward_mha"
#: What the real MLA prefill path needs loaded (``backends.Loaded``).
_PREFILL_OPS = (("_vllm_fa3_C", "fwd"), ("_C_cache_ops", "cp_gather_cache"), ("_C", "merge_attn_states"))


#: The compiled calls of vLLM's MLA prefill path (``forward_mha`` with cached context: the check's DCP
#: verify rows) on the platforms whose check runs in a child process but not this path, and why the
#: emulations of ``PREFILL_CALLS`` do not stand in for them (the cells stay not-run naming these).
#: ROCm (gfx942 / gfx950; ``rocm.py get_mla_prefill_backend_cls``: ROCM_AITER_FA only with AITER enabled,
#: else FLASH_ATTN): ``fa_utils`` binds the upstream flash-attention package's varlen (ROCm's build: CK
#: kernels by default), a different library and contract from vLLM's ``vllm_flash_attn``
#: (``return_attn_probs``, no ``out=``, a head-major output possible); the context gathers are
#: ``torch.ops._C_cache_ops`` of a HIP build and CDNA3's merge is ``vllm._custom_ops.merge_attn_states`` (HIP). XPU: ``vllm._xpu_ops.xpu_ops.
#: flash_attn_varlen_func`` (vllm-xpu-kernels' SYCL ``torch.ops._vllm_fa2_C.varlen_fwd``) and the XPU
#: build's ``_C_cache_ops`` gathers; its merge is Triton. No emulation of either library is written.
PLATFORM_PREFILL_UNCHECKED = {
    "rocm": ("flash_attn:flash_attn_varlen_func", "vllm._custom_ops:cp_gather_cache",
             "vllm._custom_ops:gather_and_maybe_dequant_cache", "vllm._custom_ops:merge_attn_states"),
    "xpu": ("vllm._xpu_ops:xpu_ops.flash_attn_varlen_func", "vllm._custom_ops:cp_gather_cache",
            "vllm._custom_ops:gather_and_maybe_dequant_cache"),
}
_PLATFORM_LIBRARIES = {"rocm": "ROCm's flash-attention (CK) and HIP ops", "xpu": "vllm-xpu-kernels' SYCL kernels"}


def platform_prefill_reason(platform: str) -> str:
    """What vLLM's MLA prefill path calls on ``platform`` and why the check does not run it here."""
    calls = PLATFORM_PREFILL_UNCHECKED.get(platform)
    if calls is None:
        return "whose compiled calls on this platform have no check yet"
    return (f"which calls {', '.join(calls)} ({_PLATFORM_LIBRARIES[platform]}): compiled for that platform, not "
            "runnable on this host, and no float64 emulation of that library's contract is written (the CUDA "
            "prefill emulations model vllm_flash_attn and the CUDA build's ops)")


#: Platforms whose MLA prefill path makes no compiled call: the CPU platform's
#: (``mla_attention.py``: SDPA prefill, ``gather_mla_context_cache_cpu`` in Python).
PLAIN_PREFILL_PLATFORMS = ("cpu",)


def calls_of(backend: str, path: str, platform: str | None = None) -> tuple[str, ...]:
    """The compiled calls the check of ``backend`` reaches on ``path`` ("decode" or "prefill") on ``platform``
    (None: CUDA, the adapter's main process)."""
    record = backends.backend(backend)
    if path == "prefill":
        if platform in record.own_prefill:
            return record.own_prefill[platform][1]
        return () if platform in PLAIN_PREFILL_PLATFORMS else PREFILL_CALLS
    return record.decode_calls


def prefill_function(backend: str, platform: str | None = None) -> str:
    """The method that computes ``backend``'s MLA prefill on ``platform`` (the kernel record's ``function``)."""
    return backends.backend(backend).own_prefill.get(platform, (PREFILL_FUNCTION,))[0]


def _op_loaded(namespace: str, op: str) -> bool:
    import torch

    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True


def _module_loaded(name: str) -> bool:
    from ..common.import_stubs import StubModule

    import importlib

    try:
        module = importlib.import_module(name)
    except ImportError:
        return False
    return not isinstance(module, StubModule) and not isinstance(sys.modules.get(name.split(".")[0]), StubModule)


def real_kernels_missing(backend: str, path: str, where: str, capability: str) -> str | None:
    """``None`` when this host runs ``backend``'s real kernels on ``path`` for a cell of ``capability``; else why not."""
    import torch

    if where in ("interpreter", "cpu") or not torch.cuda.is_available():
        return f"no CUDA device here (Triton {where})"
    major, minor = torch.cuda.get_device_capability()
    if f"{major}.{minor}" != capability:
        return f"this GPU is {major}.{minor}, the cell's arch {capability}"
    needs = list(_PREFILL_OPS if path == "prefill" else backends.backend(backend).real_ops)
    missing = []
    for need in needs:
        loaded = _module_loaded(need) if isinstance(need, str) else _op_loaded(*need)
        if not loaded:
            missing.append(need if isinstance(need, str) else f"torch.ops.{need[0]}.{need[1]}")
    return f"not loaded here: {', '.join(missing)}" if missing else None


_emulations = SharedScope("vllm checks")
_buffers = SharedScope("vllm checks")


@contextlib.contextmanager
def emulated_kernels(level: str, names: tuple[str, ...]) -> Iterator[Any]:
    """For the block: the emulations of ``names`` at level ``emulated`` (yields their call log), else nothing."""
    if level != "emulated" or not names:
        yield None
        return
    from ...kernels.emulated.install import emulations_installed

    with _emulations.enter(tuple(names), lambda: emulations_installed(names)) as log:
        yield log


@contextlib.contextmanager
def host_buffers(device: Any) -> Iterator[list[str]]:
    """What a GPU server has and the check's host lacks, answered for the block; yields what was answered.

    On a host whose check device is not CUDA: ``engines/common/cpu_host``
    (tensors vLLM places on ``"cuda"`` by name live in host memory, e.g.
    FlashInfer MLA's decode workspace; ``pin_memory=True``, which vLLM's
    ``PIN_MEMORY`` from the faked CUDA platform asks for, is dropped; streams
    and events do nothing), ``torch.accelerator.empty_cache`` does nothing
    (vLLM's ``WorkspaceManager`` calls it before it grows a scratch buffer) and
    ``torch.accelerator.current_device_index`` answers 0 (FlashMLASparseImpl asks it).
    On a CUDA device: CUTLASS MLA's workspace, allocated when the adapter
    imported the module (on ``meta`` then), gets a real buffer. Shared by the
    in-process ranks of a check (the first installs, the last undoes).
    """
    with _buffers.enter(str(device), lambda: _placed(device)) as placed:
        yield placed


@contextlib.contextmanager
def _placed(device: Any) -> Iterator[list[str]]:
    import importlib

    import torch

    from ..common.cpu_host import cpu_host

    with contextlib.ExitStack() as stack:
        if device.type != "cuda":
            log = stack.enter_context(cpu_host())
            if hasattr(torch, "accelerator"):
                saved_empty = torch.accelerator.empty_cache
                torch.accelerator.empty_cache = lambda: None
                stack.callback(setattr, torch.accelerator, "empty_cache", saved_empty)
                # FlashMLASparseImpl.__init__ sizes its schedule by the current device's SM count
                # (num_compute_units(torch.accelerator.current_device_index())): the rank's one GPU, index 0
                saved_index = torch.accelerator.current_device_index
                torch.accelerator.current_device_index = lambda: 0
                stack.callback(setattr, torch.accelerator, "current_device_index", saved_index)
            yield log.answered
            return
        placed: list[str] = []
        cutlass = importlib.import_module("vllm.v1.attention.backends.mla.cutlass_mla")
        buf = cutlass.g_sm100_workspace._workspace_buf
        if buf.device.type == "meta":
            cutlass.g_sm100_workspace._workspace_buf = torch.empty(buf.shape, dtype=buf.dtype, device=device)
            stack.callback(setattr, cutlass.g_sm100_workspace, "_workspace_buf", buf)
            placed.append("CUTLASS MLA's workspace allocated on the check's GPU (the adapter imported it on meta)")
        yield placed
