"""The kernel check of another platform's cell (ROCm, XPU, CPU), run in that platform's child process.

The parent (the faked CUDA process) sends such a cell to a child that
imported vLLM on the cell's platform (``engines/common/platform_process.py``);
there the same runners build vLLM's layer while the platform answers for the
cell's arch. This module says which backends run there, what a path that
cannot run there needs, and what the record notes.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Mapping

from . import emulation
from .backends import backend
from .support import PACKAGE

def runs_here(engine: Any, name: str, platform: str) -> bool:
    """Whether this process is ``platform``'s child and drives ``name`` there (``Backend.platforms``)."""
    return platform == getattr(engine, "platform", "cuda") and platform in backend(name).platforms


def platform_options(cell: Any, platform: str) -> dict[str, str]:
    """The spec's options that send the check to ``platform``'s child and make it answer for the cell's arch."""
    return {"platform": platform, "arch": str(cell.arch)}


def unchecked_path_reason(name: str, arch: str, platform: str, path: str) -> str | None:
    """Why ``name``'s MLA ``path`` on ``platform`` runs no check here (its compiled calls are that platform's), or None."""
    if emulation.calls_of(name, path, platform) and path != "decode" \
            and platform not in backend(name).own_prefill:
        return (f"vLLM's {name} on the {platform} platform ({arch}) sends these rows to its MLA "
                f"{path} path ({emulation.PREFILL_FUNCTION if path == 'prefill' else path}), "
                + emulation.platform_prefill_reason(platform))
    return None


def platform_notes(options: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a check of another platform's cell ran (``platform_options``)."""
    from .platforms import PLATFORM_LABELS

    platform = options.get("platform")
    if platform is None:
        return ()
    return (f"ran in a process that imported vLLM on its {PLATFORM_LABELS.get(platform, platform)} platform, "
            f"answering for {options['arch']}",)


def other_platform_reason(name: str, arch: str, platform: str | None) -> str:
    """Why an accepted cell of a non-CUDA platform runs no check here, naming what it would need."""
    record = backend(name)
    if record.cpu_op:
        import torch

        op = record.cpu_op
        if not hasattr(torch.ops._C, op):
            return (f"vLLM's {name} decodes with torch.ops._C.{op}, which this host does not have "
                    "(the installed vllm._C is not a CPU build)")
        return f"vLLM's {name} decodes with torch.ops._C.{op}; its engine check is not written yet"
    if record.unemulated_kernel:
        return f"vLLM's {name} decodes with {record.unemulated_kernel}, which has no emulation yet"
    return f"vLLM's {name} on the {platform} platform ({arch}): no engine check drives this backend yet"


@contextlib.contextmanager
def platform_ops_missing(options: Mapping[str, Any]) -> Iterator[None]:
    """Another platform's cell whose path calls a ``torch.ops`` op this host lacks: ``EngineCannotRun`` naming it.

    vLLM's own code picked the op for the cell (ROCM_ATTN's ``chunked_prefill_paged_decode``
    calls ``ops.paged_attention_rocm``, ``torch.ops._rocm_C.paged_attention``, where
    ``use_rocm_custom_paged_attention`` says so); a CUDA build of vLLM has no such op, so the
    check cannot run that kernel here. Nothing stands in for it.
    """
    from ...kernels.engine_runner import EngineCannotRun, engine_function_of

    try:
        yield
    except AttributeError as exc:
        found = re.search(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'", str(exc))
        if options.get("platform") is None or found is None:
            raise
        caller = engine_function_of(exc, PACKAGE) or "vLLM"
        raise EngineCannotRun(f"vLLM's {options['backend']} on the {options['platform']} platform ({options['arch']}) "
                              f"calls torch.ops.{found.group(1)}.{found.group(2)} (from {caller}), a compiled "
                              "kernel this host's vLLM build does not have") from None

