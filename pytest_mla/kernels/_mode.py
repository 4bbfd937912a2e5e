"""Decide how Triton kernels run here: on a GPU, or under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *decorated*,
so :func:`ensure_triton_mode` must run before any kernel module is imported.
``triton_mla`` calls it on its first line; callers that import kernels lazily
(the plugin, the engines) call it first to learn where the kernels will run.
"""

from __future__ import annotations

import os

__all__ = ["ensure_triton_mode", "is_interpreter"]

_TRUE = ("1", "true", "yes", "y", "on")  # as Triton reads it (core.host.TRUE_WORDS)


def is_interpreter() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET`` set true)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def _gpu_arch() -> str | None:
    """``"sm90"`` / ``"gfx942"`` for the first visible GPU, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    if getattr(torch.version, "hip", None):
        name = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "") or "gfx"
        return name.split(":")[0]
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm{major}{minor}"


def ensure_triton_mode() -> str:
    """Set ``TRITON_INTERPRET=1`` when it is unset and torch sees no GPU; say where kernels run.

    Returns ``"interpreter"``, the GPU architecture (``"sm90"``, ``"gfx942"``),
    or ``"cpu"`` when there is no GPU and the interpreter was explicitly turned
    off (``TRITON_INTERPRET=0``): then no Triton kernel can run.
    """
    if "TRITON_INTERPRET" not in os.environ:
        arch = _gpu_arch()
        if arch is None:
            os.environ["TRITON_INTERPRET"] = "1"
            return "interpreter"
        return arch
    if is_interpreter():
        return "interpreter"
    return _gpu_arch() or "cpu"
