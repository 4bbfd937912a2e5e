"""Which MLA decode libraries this host can run, and what each wrapper can compute.

``LIBRARY_KERNELS`` describes the wrappers of :mod:`libraries` (FlashMLA,
FlashInfer MLA, TRT-LLM MLA); ``library_status`` says whether one runs on a
host of a given arch. Without a matching GPU nothing is imported
(``find_spec`` only), so the probe is cheap and torch-free on a CPU host.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from typing import Any, Callable

from ..core.kernelspec import KernelSpec

__all__ = ["LIBRARY_KERNELS", "LibraryKernel", "available_library_kernels", "is_arch_supported",
           "kernel_spec", "library_status"]


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LibraryKernel:
    """One wrapper: what it needs on the host and what it can compute."""

    backend: str  # engine backend it checks ("flashmla", "flashinfer", "trtllm_mla")
    target: str  # "module:attr" of the wrapper (mla_decode's signature)
    module: str  # top-level Python module of the library
    library: str  # the library in words, for messages
    archs: tuple[str, ...]  # GPU archs it runs on ("sm90", ...); "sm80+" style is spelled out
    page_sizes: tuple[int, ...] | None  # native page sizes; None = any (others are re-paged)
    dtypes: tuple[str, ...]  # q / cache / out dtypes
    d_qk: tuple[int, ...]  # key widths (kv_lora_rank + qk_rope_head_dim)
    d_v: tuple[int, ...]  # value widths (kv_lora_rank)
    returns_lse: bool  # returns a rank-local LSE (DCP merge)
    dcp_positions: bool  # masks by DCP global positions (DCP + spec verify)
    tree_mask: bool  # takes a speculative tree mask
    non_causal_multi_query: bool  # s_q > 1 without the causal mask
    note: str = ""

    def describe(self) -> dict[str, Any]:
        """Plain values for reports and the capability table."""
        d = dataclasses.asdict(self)
        d["page_sizes"] = list(self.page_sizes) if self.page_sizes else "any"
        for key in ("archs", "dtypes", "d_qk", "d_v"):
            d[key] = list(d[key])
        return d


_SM80_PLUS = ("sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")

LIBRARY_KERNELS: dict[str, LibraryKernel] = {
    "flashmla": LibraryKernel(
        backend="flashmla", target="pytest_mla.kernels.libraries:flash_mla_decode", module="flash_mla",
        library="FlashMLA (flash_mla.flash_mla_with_kvcache)", archs=("sm90",), page_sizes=(64,),
        dtypes=("bf16", "fp16"), d_qk=(576,), d_v=(512,), returns_lse=True, dcp_positions=False,
        tree_mask=False, non_causal_multi_query=True,
        note="dense decode is SM90a-only in FlashMLA (csrc/api/dense_decode.h); LSE +inf for empty queries",
    ),
    "flashinfer": LibraryKernel(
        backend="flashinfer", target="pytest_mla.kernels.libraries:flashinfer_mla_decode", module="flashinfer",
        library="FlashInfer MLA (flashinfer.mla.BatchMLAPagedAttentionWrapper)", archs=_SM80_PLUS,
        page_sizes=None, dtypes=("bf16", "fp16"), d_qk=(576,), d_v=(512,), returns_lse=True,
        dcp_positions=False, tree_mask=False, non_causal_multi_query=True,
        note="backend 'auto' (fa3 on sm90, fa2 elsewhere); LSE base 2 unless return_lse_base_on_e",
    ),
    "trtllm_mla": LibraryKernel(
        backend="trtllm_mla", target="pytest_mla.kernels.libraries:trtllm_mla_decode", module="flashinfer",
        library="TRT-LLM MLA (flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla, trtllm-gen)",
        archs=("sm100", "sm103"), page_sizes=(32, 64), dtypes=("bf16",), d_qk=(576,), d_v=(512,),
        returns_lse=True, dcp_positions=False, tree_mask=False, non_causal_multi_query=False,
        note="LSE needs flashinfer >= 0.6.12 (return_lse; base 2); rows with seq_lens == 0 are not written",
    ),
}

def is_arch_supported(lib: LibraryKernel, host_arch: str) -> bool:
    """True when ``host_arch`` (``"sm90"``, ``"sm90a"``, ``"cpu"``, ``"interpreter"``) is one the library runs on."""
    base = host_arch.rstrip("af") if host_arch.startswith("sm") else host_arch
    return base in lib.archs


def _is_installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def trtllm_function(flashinfer_module: Any) -> Callable | None:
    for sub in ("decode", "mla"):
        mod = getattr(flashinfer_module, sub, None)
        if mod is None:
            try:
                mod = importlib.import_module(f"flashinfer.{sub}")
            except ImportError:
                continue
        fn = getattr(mod, "trtllm_batch_decode_with_kv_cache_mla", None)
        if fn is not None:
            return fn
    return None


def accepts(fn: Callable, name: str, *, explicit: bool = False) -> bool:
    """True when ``fn`` takes keyword ``name`` (``explicit``: named in its signature, not just ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or (not explicit and any(p.kind is p.VAR_KEYWORD for p in params.values()))


def library_status(backend: str, host_arch: str) -> tuple[bool, str | None]:
    """``(runnable, reason)`` for one wrapper on a host of ``host_arch``.

    Without a matching GPU nothing is imported (``find_spec`` only), so this is
    cheap and torch-free on a CPU host. On a matching GPU the library is
    imported, so a broken build is reported as such.
    """
    lib = LIBRARY_KERNELS.get(backend)
    if lib is None:
        return False, f"no library wrapper for backend {backend!r} (wrapped: {', '.join(LIBRARY_KERNELS)})"
    reasons = []
    installed = _is_installed(lib.module)
    if not installed:
        reasons.append(f"{lib.module} not installed")
    if not is_arch_supported(lib, host_arch):
        reasons.append(f"{lib.library} needs {'/'.join(lib.archs)}, host is {host_arch}")
    if reasons:
        return False, f"{backend}: " + "; ".join(reasons)
    try:
        module = importlib.import_module(lib.module)
    except Exception as exc:  # a library built for another CUDA / torch fails here, not in the cell
        return False, f"{backend}: import {lib.module} failed: {type(exc).__name__}: {exc}"
    if backend == "trtllm_mla":
        fn = trtllm_function(module)
        version = getattr(module, "__version__", "?")
        if fn is None:
            return False, f"trtllm_mla: flashinfer {version} has no trtllm_batch_decode_with_kv_cache_mla"
        if not accepts(fn, "return_lse"):
            return False, (f"trtllm_mla: flashinfer {version} returns no LSE from "
                           "trtllm_batch_decode_with_kv_cache_mla (needs return_lse, flashinfer >= 0.6.12)")
    if backend == "flashinfer":
        mla = getattr(module, "mla", None) or importlib.import_module("flashinfer.mla")
        if getattr(mla, "BatchMLAPagedAttentionWrapper", None) is None:
            return False, f"flashinfer: {getattr(module, '__version__', '?')} has no mla.BatchMLAPagedAttentionWrapper"
    if backend == "flashmla" and not hasattr(module, "flash_mla_with_kvcache"):
        return False, "flashmla: flash_mla has no flash_mla_with_kvcache"
    return True, None


def kernel_spec(lib: LibraryKernel) -> KernelSpec:
    """The ``KernelSpec`` the built-in engine hands the harness for this wrapper."""
    return KernelSpec(lib.backend, lib.target, returns_lse=lib.returns_lse, dcp_positions=lib.dcp_positions,
                      tree_mask=lib.tree_mask)


def available_library_kernels(host_arch: str) -> dict[str, tuple[Any, str | None]]:
    """``{backend: (KernelSpec, None) or (None, reason)}`` for every wrapper, on a host of ``host_arch``."""
    result: dict[str, tuple[Any, str | None]] = {}
    for backend, lib in LIBRARY_KERNELS.items():
        ok, reason = library_status(backend, host_arch)
        result[backend] = (kernel_spec(lib), None) if ok else (None, reason)
    return result
