"""One numeric check as a kernel record: whatever happens in it ends in a precise record.

Here (below the engines) so that the process that runs a check need not be
the one that collected the cell: a platform child process
(``engines/common/platform_process.py``) runs the check of its platform's
cells with this same function and sends the record back.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import AdapterError
from ..core.kernelspec import KernelSpec
from ..core.records import KernelResult, not_run
from ..core.verdicts import KERNEL_FAILED

__all__ = ["run_check"]


def run_check(case: Any, spec: KernelSpec, *, where: str, dcp_mode: str, timeout_s: float) -> KernelResult:
    """One numeric check, as a kernel record; a crash or an engine's exception becomes a failed record."""
    from . import harness
    from .engine_check import BackendRaised, EngineCannotRun, run_engine_check
    from .power import WeakCheck

    failed = {"status": KERNEL_FAILED, "where": where, "level": spec.level, "case": case.as_dict()}
    try:
        if spec.protocol == "engine":
            return run_engine_check(case, spec, dcp_mode=dcp_mode, where=where, timeout_s=timeout_s)
        return harness.run_kernel_check(case, spec.target, dcp_mode=dcp_mode, where=where, timeout_s=timeout_s,
                                        num_splits=spec.option_map.get("num_splits"),
                                        split_from=spec.option_map.get("split_from"))
    except EngineCannotRun as exc:  # the engine's own path needs a kernel this host lacks
        return not_run(str(exc))
    except BackendRaised as exc:  # the engine accepted the configuration, then its own code raised: a finding
        step = {"step": exc.step} if exc.step else {}  # raised before the step under test (``engine_step``)
        return {**failed, "finding": True, "function": exc.function, "raised": exc.error, "raised_text": exc.text,
                "frames": list(exc.frames), **step,
                "message": f"engine accepted this configuration, but its backend raised {exc}"}
    except AdapterError as exc:
        return {**failed, "crashed": True, "message": f"adapter error: {exc}"}
    except WeakCheck as exc:  # our inputs, not the engine: an error of the cell, never a verified one
        return {**failed, "crashed": True, "message": f"check too weak: {exc}"}
    except Exception as exc:  # a kernel that crashes is an error of the cell, with its message
        return {**failed, "crashed": True, "message": f"kernel crashed: {type(exc).__name__}: {exc}"}
