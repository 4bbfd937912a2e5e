"""SGLang's CUDA attention backends on a CPU host: the cell's GPU faked, the kernel libraries emulated.

For a kernel check at level ``emulated`` (``checks.kernel_for`` decides), every
rank of the check runs inside one shared scope:

* the cell's GPU arch, stated as the start-up validation states it
  (``runtime_context.override_platform`` with the release's platform facts,
  ``get_device_capability`` answering that arch wherever SGLang bound it, and
  ``torch.version.cuda`` the CUDA toolkit its wheels are built for);
* the host facilities a GPU server has (pinned memory, streams, events)
  answered as a CPU host would (``engines.common.cpu_host``);
* the kernel libraries SGLang calls — ``flashinfer``, ``flash_mla``,
  ``sgl_kernel`` — replaced by the float64 emulations of their contracts
  (``kernels.emulated``): stand-in modules on a host without them, with the
  names SGLang's guarded module-level imports skipped bound late, and the
  backend's module imported once they are importable.

Nothing of SGLang is replaced: its backend, metadata, page tables, layouts,
scales, DCP gather and merge all run as shipped. The emulations a check
called (never the ones merely installed) become the record's
``kernel.emulated``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch

from ..common.shared_scope import SharedScope
from .support import CUDA_TOOLKIT, EMULATED_LIBRARIES

__all__ = ["EMULATED_LIBRARIES", "Scope", "emulation_names", "scope", "stated_arch"]


_shared = SharedScope("sglang emulated checks")


def emulation_names() -> list[str]:
    """Every emulated callable of ``EMULATED_LIBRARIES`` (``"module:qualname"``)."""
    from ...kernels.emulated import EMULATIONS

    return [name for name in EMULATIONS if name.split(":")[0].split(".")[0] in EMULATED_LIBRARIES]


class Scope:
    """What one check's ranks share: the call log of the emulations and the host's answers."""

    def __init__(self, stack: contextlib.ExitStack, log: Any, host: Any) -> None:
        self.stack, self.log, self.host = stack, log, host

    def notes(self) -> list[str]:
        return [f"host: {what}" for what in self.host.answered]


def _platform(engine: Any, arch: str) -> contextlib.AbstractContextManager:
    from .platforms import platform_fact_names, platform_facts

    facts = platform_facts(arch)
    known = platform_fact_names(engine.rc, engine.version)
    capability = facts["device_capability"]

    @contextlib.contextmanager
    def stated() -> Iterator[None]:
        saved: list[tuple[Any, str, Any]] = []
        common = sys.modules.get("sglang.srt.utils.common")
        real = getattr(common, "get_device_capability", None)

        def answer(*args: Any, **kwargs: Any) -> Any:
            return capability

        for name, module in list(sys.modules.items()):
            if (name == "sglang" or name.startswith("sglang.")) and module is not None and real is not None:
                if getattr(module, "get_device_capability", None) is real:
                    saved.append((module, "get_device_capability", real))
                    module.get_device_capability = answer  # type: ignore[attr-defined]
        saved.append((torch.cuda, "get_device_capability", torch.cuda.get_device_capability))
        torch.cuda.get_device_capability = answer  # type: ignore[assignment]
        # the CUDA toolkit torch is built against: SGLang's FA3 wrapper asks (torch.version.cuda >= "12.3")
        saved.append((torch.version, "cuda", torch.version.cuda))
        torch.version.cuda = CUDA_TOOLKIT  # type: ignore[assignment]
        try:
            with engine.rc.override_platform(**{k: v for k, v in facts.items() if k in known}):
                yield
        finally:
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)

    return stated()


@contextlib.contextmanager
def _validation_stubs_replaced() -> Iterator[None]:
    """SGLang modules imported during start-up validation bound its kernel-library stubs (``import
    flash_mla`` gave a ``KernelLibraryStub``); point those names at what the libraries are now."""
    import importlib

    from ..common.gpu_steps import KernelLibraryStub, _KernelName

    def now(path: str) -> Any:
        root, *rest = path.split(".")
        value: Any = importlib.import_module(root)
        for part in rest:
            value = getattr(value, part)
        return value

    saved: list[tuple[Any, str, Any]] = []
    try:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "sglang" or name.startswith("sglang.")):
                continue
            for attr, value in list(vars(module).items()):
                if isinstance(value, KernelLibraryStub):
                    replacement = now(value.__name__)
                elif isinstance(value, _KernelName):
                    replacement = now(object.__getattribute__(value, "_mla_path"))
                else:
                    continue
                saved.append((module, attr, value))
                setattr(module, attr, replacement)
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


def _enter(engine: Any, options: dict[str, Any]) -> Scope:
    from ...kernels.emulated.install import emulations_installed
    from ..common.cpu_host import cpu_host
    from .backends import backend

    stack = contextlib.ExitStack()
    try:
        host = stack.enter_context(cpu_host())
        stack.enter_context(_platform(engine, options["arch"]))
        log = stack.enter_context(emulations_installed(emulation_names(), late_imports=("sglang",),
                                                       preload=[backend(options["backend"]).module]))
        stack.enter_context(_validation_stubs_replaced())
    except BaseException:
        stack.close()
        raise
    return Scope(stack, log, host)


@contextlib.contextmanager
def _entered(engine: Any, options: dict[str, Any]) -> Iterator[Scope]:
    current = _enter(engine, options)
    try:
        yield current
    finally:
        current.stack.close()


_stated = SharedScope("sglang stated arch")


def stated_arch(engine: Any, arch: str) -> contextlib.AbstractContextManager[None]:
    """Only the cell's GPU arch stated to SGLang (its platform facts, ``get_device_capability``), no
    emulation: for a native check whose server-argument resolution asks the GPU (a DSA checkpoint's
    ``handle_model_specific_adjustments`` reads the capability; its DSA backends, and so its KV layout,
    follow the arch). Shared by the check's ranks like ``scope``."""
    return _stated.enter(None, lambda: _platform(engine, arch))


def scope(engine: Any, options: dict[str, Any]) -> contextlib.AbstractContextManager[Scope]:
    """The shared scope of a check's ranks: entered by the first, left by the last."""
    return _shared.enter(None, lambda: _entered(engine, options))
