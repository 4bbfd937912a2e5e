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

__all__ = ["AdapterError", "Configured", "Engine", "KernelSpec"]

from ..core.cells import Cell
from ..core.kernelspec import KernelSpec
from ..core.models import ModelConfig


class AdapterError(Exception):
    """The adapter itself could not drive the installed engine (never the engine's refusal).

    Raised for an unknown platform fact, a hook or module that moved in this
    release, an import the adapter needs: the cell's verdict is ``error`` with
    this message, which names the adapter step and the engine version.
    """

    def __init__(self, step: str, message: str, *, engine: str | None = None, version: str | None = None) -> None:
        self.step = step
        self.engine = engine
        self.version = version
        where = f"{engine} {version}" if engine and version else (engine or "engine")
        super().__init__(f"adapter step {step!r} failed on {where}: {message}")


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
