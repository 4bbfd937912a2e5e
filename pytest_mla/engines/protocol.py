"""The engine adapter interface.

An engine is the subject under test. Given a cell it configures the backend
the way the real engine would, raising the engine's own error when it
refuses, and says which decode kernel (if any) can be run here to check the
accepted configuration's numbers. An adapter never computes the expectation
it is checked against: that lives in the matrix file.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, runtime_checkable

__all__ = ["AdapterError", "Configured", "Engine", "KernelSpec", "UnreachableError"]

from ..core.cells import Cell
from ..core.errors import AdapterError, UnreachableError
from ..core.kernelspec import KernelSpec
from ..core.models import ModelConfig


@dataclasses.dataclass(frozen=True)
class Configured:
    """An accepted configuration."""

    backends: Mapping[str, str]  # role → backend, e.g. {"decode": "triton", "prefill": "triton"}
    kernel: KernelSpec | None = None  # the decode kernel to check, when one is runnable here
    kernel_reason: str | None = None  # why there is none
    notes: tuple[str, ...] = ()  # rewrites the engine made (page size forced, aliases)


@runtime_checkable
class Engine(Protocol):
    name: str
    version: str
    #: Exception types that mean "the engine refused this configuration".
    #: Anything else raised by ``configure`` is a crash (verdict ``error``).
    refusal_errors: tuple[type[BaseException], ...]

    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        """Configure the cell's backend; raise the engine's own error to refuse."""
        ...

    def metadata(self) -> Mapping[str, Any]:
        """Plain values for the report's run metadata (versions, stubs, ...)."""
        ...

    # Optional: ``registered_backends(self) -> Mapping[str, bool]``: every attention
    # backend the installed engine registers, mapped to whether it can serve MLA
    # models. The report names the MLA-capable ones a matrix does not cover.
    #
    # Optional: ``known_archs(self) -> Sequence[str]``: the ``arch`` values the installed
    # release has a platform for (``"smNN"`` stands for every NVIDIA arch). An arch of the
    # matrix outside it is an error of the file, naming the value and these.
    #
    # Optional: ``run_check(self, case, spec, *, where, dcp_mode, timeout_s) -> KernelResult | None``:
    # run an accepted cell's numeric check where the engine configured it (the vLLM adapter:
    # in the child process of the cell's platform, see ``engines/common/platform_process.py``);
    # None lets the runner run it in its own process (``kernels.run.run_check``).
