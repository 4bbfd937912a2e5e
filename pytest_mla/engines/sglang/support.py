"""Small pieces the SGLang adapter and its kernel-check modules share (no module of theirs imported here)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import sys
import types
from typing import Any, Callable

from ...core.errors import AdapterError

__all__ = ["CUDA_TOOLKIT", "EMULATED_LIBRARIES", "KERNEL_LIBRARIES", "STUBS", "adapter_error", "construct", "make_dataclass", "missing_kernel_library", "sglang_bindings"]

#: The kernel libraries SGLang's CUDA attention backends call (emulated at level ``emulated``).
EMULATED_LIBRARIES = ("flashinfer", "flash_mla", "sgl_kernel", "sglang")  # sglang: its own JIT kernels

#: Kernel libraries (compiled CUDA extensions): one that is not installed here and that code
#: being constructed imports is a GPU step ("kernel library X is not installed here").
KERNEL_LIBRARIES = ("sgl_kernel", "flashinfer", "flash_mla", "flash_attn", "flash_attn_interface", "deep_gemm",
                    "cutlass", "cuda", "tokenspeed_mla", "tilelang", "quack", "humming", "aiter", "trtllm")

#: The CUDA toolkit stated to SGLang (``torch.version.cuda``): SGLang 0.5.2x ships CUDA-13 wheels.
CUDA_TOOLKIT = "13.0"

#: CUDA-linked or host-specific modules replaced by import stubs (imported for names only).
STUBS = {"torchvision": {"torchvision": {"__version__": "0.28.0"}}, "setproctitle": {}}


def adapter_error(step: str, message: str) -> AdapterError:
    """The adapter's own failure at ``step`` (verdict ``error``, never a finding)."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return AdapterError(step, message, engine="sglang", version=version)


def make_dataclass(cls: type, **values: Any) -> Any:
    """An instance of a (data)class from the fields it has; missing required fields raise."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(values)
    return cls(**{k: v for k, v in values.items() if k in names})


def construct(fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts (they move between releases)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


def missing_kernel_library(exc: BaseException) -> str | None:
    """The kernel library whose absence ``exc`` (or an exception it was raised from) reports, if any."""
    seen = 0
    while exc is not None and seen < 8:
        name = getattr(exc, "name", None) or ""
        if isinstance(exc, ModuleNotFoundError) and name.split(".", 1)[0] in KERNEL_LIBRARIES:
            return name
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


#: ``sglang_bindings``' last scan per object: (the object, ``len(sys.modules)`` then, its bindings).
_BINDINGS: dict[int, tuple[Any, int, list[tuple[types.ModuleType, str]]]] = {}


def sglang_bindings(obj: Any) -> list[tuple[types.ModuleType, str]]:
    """Every ``(sglang module, name)`` bound to ``obj``: where a patch of ``obj`` must reach, as SGLang's
    modules bind functions by name (``from ..utils import is_hip``). The scan of every module is kept until
    a module is imported; a name rebound since then is left out."""
    cached = _BINDINGS.get(id(obj))
    if cached is not None and cached[0] is obj and cached[1] == len(sys.modules):
        return [(module, key) for module, key in cached[2] if vars(module).get(key) is obj]
    found = []
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "sglang" or name.startswith("sglang.")):
            for key, value in list(vars(module).items()):
                if value is obj:
                    found.append((module, key))
    _BINDINGS[id(obj)] = (obj, len(sys.modules), found)
    return found
