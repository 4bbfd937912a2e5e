"""Decide how Triton kernels run here: on a GPU, or under ``TRITON_INTERPRET=1``.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *decorated*,
so :func:`ensure_triton_mode` must run before any kernel module is imported.
``triton_mla`` calls it on its first line; callers that import kernels lazily
(the plugin, the engines) call it first to learn where the kernels will run.
"""

from __future__ import annotations

import os

__all__ = ["ensure_triton_mode", "is_interpreter", "share_cpu_threads"]

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


_threads_shared = False


def share_cpu_threads() -> None:
    """Give each xdist worker its share of the cores for torch's intra-op threads (once per process).

    torch starts as many threads as there are cores in every process; with
    ``-n N`` workers that oversubscribes the machine, and the threads' spin-waits
    make small float64 work (the reference, input generation) tens of times
    slower on a loaded 2-core runner (measured: 6.4 s against 0.1 s for one
    case's inputs). Left alone when the user set ``OMP_NUM_THREADS`` or outside xdist.
    """
    global _threads_shared
    if _threads_shared:
        return
    _threads_shared = True
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if "OMP_NUM_THREADS" in os.environ or not workers.isdigit() or int(workers) < 2:
        return
    import torch

    share = max(1, (os.cpu_count() or 1) // int(workers))
    if torch.get_num_threads() > share:
        torch.set_num_threads(share)


def ensure_triton_mode() -> str:
    """Set ``TRITON_INTERPRET=1`` when it is unset and torch sees no GPU; say where kernels run.

    Returns ``"interpreter"``, the GPU architecture (``"sm90"``, ``"gfx942"``),
    or ``"cpu"`` when there is no GPU and the interpreter was explicitly turned
    off (``TRITON_INTERPRET=0``): then no Triton kernel can run. Shares the CPU
    threads among xdist workers first (``share_cpu_threads``).
    """
    share_cpu_threads()
    if "TRITON_INTERPRET" not in os.environ:
        arch = _gpu_arch()
        if arch is None:
            os.environ["TRITON_INTERPRET"] = "1"
            return "interpreter"
        return arch
    if is_interpreter():
        return "interpreter"
    return _gpu_arch() or "cpu"
