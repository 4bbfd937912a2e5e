"""Float64 emulations of the compiled MLA kernels the engines call, one module per kernel library.

Each module states its library's contract in its docstring (layouts, paging,
causal alignment, LSE base, every scale, head padding, what it refuses) and
exports ``EMULATIONS``: the real callable's ``"module:qualname"`` → the
emulation (and, where an engine probes for a name the emulated release does
not define, ``NOT_IN_LIBRARY``: module → names the stand-in must not offer).
:data:`EMULATIONS` here joins them, so a driver can patch by name and a report can list what it replaced. ``glue`` holds the shared pieces and
:class:`OutOfContractError`, raised for anything an emulation does not model.

Importing this package imports neither torch nor a library: the modules load
on first attribute access (``EMULATIONS``, ``OutOfContractError``, or a module
name), from a kernel check only.
"""

from __future__ import annotations

import importlib
from typing import Any

#: The library modules, in the order their entries appear in ``EMULATIONS``.
LIBRARY_MODULES = ("flashinfer", "flashinfer_gqa", "flashinfer_trtllm_mha", "flashinfer_comm", "flashmla",
                   "flashmla_sparse", "flash_attn", "flash_attn_cute", "cutlass_mla", "quant", "sglang_jit", "vllm_ops",
                   "tokenspeed", "vllm_cpu", "vllm_cpu_attn", "vllm_cpu_amx", "sgl_kernel_platforms",
                   "sgl_kernel_cpu_attention", "sgl_kernel_xpu_attention", "sgl_kernel_xpu_flash_attn")

__all__ = ["EMULATIONS", "LIBRARY_MODULES", "NOT_IN_LIBRARY", "OutOfContractError", "emulation_for",
           "platform_registry"]


def _registry() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name in LIBRARY_MODULES:
        for key, value in importlib.import_module(f"{__name__}.{name}").EMULATIONS.items():
            if key in merged:
                raise RuntimeError(f"two emulations claim {key!r}")
            merged[key] = value
    return merged


def _not_in_library() -> dict[str, frozenset[str]]:
    merged: dict[str, set[str]] = {}
    for name in LIBRARY_MODULES:
        for module, names in getattr(importlib.import_module(f"{__name__}.{name}"), "NOT_IN_LIBRARY", {}).items():
            merged.setdefault(module, set()).update(names)
    return {module: frozenset(names) for module, names in merged.items()}


def platform_registry(platform: str | None) -> dict[str, Any]:
    """``EMULATIONS`` as a check on ``platform`` sees it: a module's ``PLATFORM_EMULATIONS[platform]`` entries
    replace the CUDA ones of the same name (sgl-kernel-xpu's ``flash_attn_with_kvcache`` is not FA3's)."""
    merged = dict(__getattr__("EMULATIONS"))
    for name in LIBRARY_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        merged.update(getattr(module, "PLATFORM_EMULATIONS", {}).get(platform, {}))
    return merged


def emulation_for(qualified_name: str) -> Any:
    """The emulation of the real callable ``"module:qualname"``; ``KeyError`` naming the known ones otherwise."""
    registry = __getattr__("EMULATIONS")
    try:
        return registry[qualified_name]
    except KeyError:
        raise KeyError(f"no emulation of {qualified_name!r} (emulated: {', '.join(sorted(registry))})") from None


def __getattr__(name: str) -> Any:
    if name == "EMULATIONS":
        value = _registry()
    elif name == "NOT_IN_LIBRARY":
        value = _not_in_library()
    elif name == "OutOfContractError":
        value = importlib.import_module(f"{__name__}.glue").OutOfContractError
    elif name in LIBRARY_MODULES or name == "glue":
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
