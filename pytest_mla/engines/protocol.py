"""The engine adapter interface.

An engine is the subject under test. Given a cell it configures the backend
the way the real engine would, raising the engine's own error when it
refuses, and says which decode kernel (if any) can be run here to check the
accepted configuration's numbers. An adapter never computes the expectation
it is checked against: that lives in the matrix file.

An adapter subclasses :class:`Engine`: it sets ``name``, ``version`` and
``refusal_errors``, writes ``configure``, and overrides the optional steps it
offers (each default means "not offered"). An adapter that does not subclass
it is still accepted (``module:attr``, a hook's factory): a step it lacks is
the default, which is how the runner reads every step (:func:`optional_step`).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

__all__ = ["AdapterError", "Configured", "ENGINE_PACKAGE_MODULES", "Engine", "KernelSpec", "OPTIONAL_STEPS",
           "NotServedError", "UnreachableError", "optional_step"]

from ..core.cells import Cell
from ..core.errors import AdapterError, NotServedError, UnreachableError
from ..core.kernelspec import KernelSpec
from ..core.models import ModelConfig

if TYPE_CHECKING:
    from ..core.records import KernelResult


@dataclasses.dataclass(frozen=True)
class Configured:
    """An accepted configuration."""

    backends: Mapping[str, str]  # role → backend, e.g. {"decode": "triton", "prefill": "triton"}
    kernel: KernelSpec | None = None  # the decode kernel to check, when one is runnable here
    kernel_reason: str | None = None  # why there is none
    notes: tuple[str, ...] = ()  # rewrites the engine made (page size forced, aliases)


class Engine(abc.ABC):
    """The base class of an engine adapter: ``configure`` is required, the other steps optional.

    ``registry.check_adapter`` asks for the required parts when the adapter is
    loaded (``name``, ``version``, ``configure``, ``refusal_errors``).
    """

    name: str
    version: str
    #: Exception types that mean "the engine refused this configuration".
    #: Anything else raised by ``configure`` is a crash (verdict ``error``).
    refusal_errors: tuple[type[BaseException], ...]

    @abc.abstractmethod
    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        """Configure the cell's backend; raise the engine's own error to refuse."""

    # ---- optional steps: each default means "not offered" ----------------------------------

    def metadata(self) -> Mapping[str, Any]:
        """Plain values for the report's run metadata (versions, stubs, ...). Default: none."""
        return {}

    def registered_backends(self) -> Mapping[str, bool] | None:
        """Every attention backend the installed engine registers, mapped to whether it can serve
        MLA models; the report names the MLA-capable ones a matrix does not cover.
        Default None: the adapter cannot say (the report has no coverage)."""
        return None

    def known_archs(self) -> Sequence[str] | None:
        """The ``arch`` values the installed release has a platform for (``"smNN"`` stands for every
        NVIDIA arch); an arch of the matrix outside them is an error of the file, naming the value
        and these. Default None: the adapter cannot say (no arch is refused for it); raising
        ``AdapterError`` means the same (its setup failed: its cells report why)."""
        return None

    def run_check(self, case: Any, spec: KernelSpec, *, where: str, dcp_mode: str,
                  timeout_s: float) -> KernelResult | None:
        """Run an accepted cell's numeric check where the engine configured it (the vLLM adapter: in
        the child process of the cell's platform, see ``engines/common/platform_process.py``).
        Default None: the runner runs it in its own process (``kernels.run.run_check``)."""
        return None


#: The steps an adapter may leave out.
OPTIONAL_STEPS = ("metadata", "registered_backends", "known_archs", "run_check")


def optional_step(engine: Any, name: str) -> Callable[..., Any]:
    """``engine``'s optional step ``name`` (one of ``OPTIONAL_STEPS``) as a bound callable: the
    adapter's own, or :class:`Engine`'s default where the adapter lacks it (or sets it to None),
    so that an adapter that does not subclass ``Engine`` reads as one that does."""
    if name not in OPTIONAL_STEPS:
        raise ValueError(f"{name!r} is not an optional step of Engine (those are: {', '.join(OPTIONAL_STEPS)})")
    own = getattr(engine, name, None)
    return own if own is not None else functools.partial(getattr(Engine, name), engine)


#: The modules of a real engine's adapter package (``engines/sglang``, ``engines/vllm``), each one job;
#: every such package has exactly these (``tests/test_architecture.py``), so a third engine starts from
#: the same template and a reader who knows one package knows where to look in the other.
ENGINE_PACKAGE_MODULES = {
    "__init__": "the adapter class, imported lazily (importing the package imports no engine)",
    "adapter": "the Engine subclass: configure a cell, the engine's refusals, metadata, known archs",
    "startup": "the engine's own start-up code, run on a faked GPU up to its first GPU step",
    "platforms": "the engine's platform classes, answering for the cell's device and arch",
    "platform_check": "the kernel check of another platform's cell, in that platform's child process",
    "backends": "one record per attention backend: its kernels and their emulations, its check, its level",
    "emulation": "where a check's kernels come from: the real libraries on a GPU, emulations elsewhere",
    "model": "the model's attention layer a check runs through",
    "batch": "a check's requests as the engine holds them: cache contents, slots, speculative inputs",
    "rank": "one DCP rank of a check: the engine's objects built, its call run, its outputs read",
    "checks": "a kernel check: which kernels a cell runs, whether they can run here, every rank run",
    "support": "small pieces the package's modules share (it imports none of them)",
}
