"""Run an engine's start-up code on a machine without a GPU until the first step that needs one.

An engine's backend constructors make checks (refusals a user meets at
launch) and then allocate: workspaces on the GPU, CUDA streams, calls into
kernel libraries. On a CPU-only machine the first such step fails, often with
an ``AssertionError`` ("Torch not compiled with CUDA enabled") or a
``RuntimeError`` -- an artifact of the machine that must never read as the
engine's refusal. Inside ``stop_at_gpu_steps()`` every such step raises
:class:`GpuStep` instead, naming the step:

* a tensor created on, or moved to, a CUDA device (``torch.empty(...,
  device="cuda")``, ``Tensor.to("cuda")``, ``Tensor.cuda()``), or in pinned
  host memory (``pin_memory=True``: needs the CUDA driver) -- caught by a
  ``TorchFunctionMode``;
* ``torch.cuda`` streams, events and graphs, and every ``torch.cuda`` call that
  initialises CUDA (``torch.cuda._lazy_init``);
* any use of a :class:`GpuResource`: a stand-in for an object that exists only
  on a GPU host (a KV-cache pool, loaded weights);
* any use of a :class:`KernelLibraryStub` name: a kernel library (a compiled
  CUDA extension) that is not installed here.

Code that reaches CUDA another way raises the host's own error;
:func:`cuda_absent` recognises those texts so that a caller can treat them
as the same kind of stop. ``GpuStep`` derives from ``BaseException`` so that
an engine's own ``except Exception:`` fallbacks do not swallow it and take a
path a GPU host would not take. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import types
from typing import Any, Iterable, Iterator

#: Texts torch and CUDA libraries raise when the machine has no GPU (never a refusal).
_CUDA_ABSENT = re.compile(
    r"Torch not compiled with CUDA enabled|requires CUDA support|Found no NVIDIA driver|"
    r"No CUDA GPUs are available|no CUDA-capable device|CUDA driver initialization failed|"
    r"Cannot access accelerator device|Torch not compiled with XPU enabled"
)

#: ``torch.cuda`` classes and context managers whose construction needs CUDA.
_CUDA_CLASSES = ("Stream", "ExternalStream", "Event", "CUDAGraph", "graph", "stream", "device", "StreamContext")


class GpuStep(BaseException):
    """Engine start-up code reached a step that needs a GPU (``what`` names it)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def cuda_absent(exc: BaseException) -> bool:
    """Whether ``exc`` is torch or a CUDA library saying that this machine has no GPU."""
    return bool(_CUDA_ABSENT.search(str(exc)))


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.split(":", 1)[0] == "cuda"
    return getattr(device, "type", None) == "cuda"


def _name(func: Any) -> str:
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    if qualname.startswith("_VariableFunctionsClass."):  # torch.empty, torch.zeros, ...
        qualname = qualname.split(".", 1)[1]
    for prefix in ("_TensorBase.", "TensorBase."):
        if qualname.startswith(prefix):
            return "Tensor." + qualname[len(prefix):]
    if qualname.startswith("Tensor."):
        return qualname
    return f"torch.{qualname}"


def needs_gpu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What a torch call needs a GPU for (the step's name), or ``None``."""
    name = _name(func)
    device = kwargs.get("device")
    if device is not None and _is_cuda(device):
        return f"{name}(device={str(device)!r})"
    if kwargs.get("pin_memory"):
        return f"{name}(pin_memory=True)"
    short = name.rsplit(".", 1)[-1]
    if name.startswith("Tensor.") and short in ("cuda", "pin_memory"):
        return f"{name}()"
    if short == "to":
        for arg in args[1:]:
            if _is_cuda(arg):
                return f"{name}({str(arg)!r})"
    return None


def _stopper(what: str) -> Any:
    def stop(*args: Any, **kwargs: Any) -> Any:
        raise GpuStep(what)

    return stop


class GpuResource:
    """Stands for an engine object that exists only on a GPU host; any use of it is a GPU step.

    Holding a reference (``self.pool = runner.token_to_kv_pool``) is fine;
    reading an attribute, calling, testing, iterating or doing arithmetic
    raises :class:`GpuStep` naming the object and what was asked of it.
    """

    __slots__ = ("_mla_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_mla_name", name)

    def _stop(self, what: str) -> Any:
        raise GpuStep(f"{object.__getattribute__(self, '_mla_name')}{what}")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return self._stop(f".{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        self._stop(f".{attr} = ...")

    def __repr__(self) -> str:
        return f"<GPU-only: {object.__getattribute__(self, '_mla_name')}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stop("(...)")

    def __bool__(self) -> bool:
        return self._stop(" (truth value)")

    def __len__(self) -> int:
        return self._stop(" (len)")

    def __iter__(self) -> Iterator[Any]:
        return self._stop(" (iteration)")

    def __getitem__(self, key: Any) -> Any:
        return self._stop(f"[{key!r}]")

    def __index__(self) -> int:
        return self._stop(" (as an integer)")

    def __int__(self) -> int:
        return self._stop(" (as an integer)")

    def __float__(self) -> float:
        return self._stop(" (as a number)")

    def _arith(self, other: Any) -> Any:
        return self._stop(" (arithmetic)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _arith
    __lt__ = __le__ = __gt__ = __ge__ = _arith


class UnsetField(GpuResource):
    """A field a stopped constructor never set, read by the code that goes on without it.

    A wrapper backend (MiniCPM's around FlashAttention's, a multi-step draft
    backend around its per-step ones) builds an inner backend, copies some of
    its fields and then makes its own checks. When the inner constructor
    stopped at a GPU step, the wrapper gets this stand-in for each field it
    never set: copying it is free, any use (an attribute, a call, a truth
    value, arithmetic, ``==``) is the GPU step, so the wrapper's own checks
    that come before such a use still run, as they do on a GPU host.

    What it cannot stop: ``x is None`` (False here) and ``isinstance`` (never
    the real type); a check written that way on a copied field would take the
    branch of a non-None object of another class.
    """

    __slots__ = ("_mla_unset",)

    def __init__(self, name: str, why: str) -> None:
        super().__init__(name)
        object.__setattr__(self, "_mla_unset", why)

    def _stop(self, what: str) -> Any:
        raise GpuStep(f"{object.__getattribute__(self, '_mla_name')}{what}, {object.__getattribute__(self, '_mla_unset')}")

    def __eq__(self, other: Any) -> bool:
        return self._stop(" (==)")

    def __ne__(self, other: Any) -> bool:
        return self._stop(" (!=)")

    __hash__ = object.__hash__


class _KernelName:
    """A name inside a kernel library that is not installed here: using it is a GPU step."""

    __slots__ = ("_mla_path",)

    def __init__(self, path: str) -> None:
        object.__setattr__(self, "_mla_path", path)

    def _stop(self, what: str) -> Any:
        path = object.__getattribute__(self, "_mla_path")
        raise GpuStep(f"{path}{what} (kernel library {path.split('.', 1)[0]} is not installed here)")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _KernelName(f"{object.__getattribute__(self, '_mla_path')}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._stop("(...)")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # ``class X(library.Base)`` at import: X exists, building one is the GPU step.
        path = object.__getattribute__(self, "_mla_path")
        return (type(path.rsplit(".", 1)[-1], (), {"__init__": _stopper(f"{path}(...)")}),)

    def __bool__(self) -> bool:
        return self._stop(" (truth value)")

    def __repr__(self) -> str:
        return f"<not installed: {object.__getattribute__(self, '_mla_path')}>"

    def _compare(self, other: Any) -> Any:
        return self._stop(" (compared)")

    # Equality is identity (``typing.Optional[X]`` compares its arguments); ordering is a use.
    __lt__ = __le__ = __gt__ = __ge__ = _compare


class KernelLibraryStub(types.ModuleType):
    """A kernel library module that is not installed here: every name in it is a :class:`_KernelName`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _KernelName(f"{self.__name__}.{name}")


class _KernelLibraryFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of uninstalled kernel libraries (last on ``sys.meta_path``: real modules win)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(roots)
        self.made: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == r or fullname.startswith(r + ".") for r in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = KernelLibraryStub(spec.name)
        module.__path__ = []
        self.made.append(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def missing_libraries(names: Iterable[str]) -> list[str]:
    """The top-level module names among ``names`` that cannot be imported here."""
    missing = []
    for name in names:
        if name in sys.modules and not isinstance(sys.modules[name], KernelLibraryStub):
            continue
        try:
            found = importlib.machinery.PathFinder.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            missing.append(name)
    return missing


@contextlib.contextmanager
def kernel_library_stubs(roots: Iterable[str]) -> Iterator[list[str]]:
    """Inside: importing one of ``roots`` (not installed here) gives a :class:`KernelLibraryStub`.

    The stub modules are dropped from ``sys.modules`` afterwards, so code run
    outside (an engine's argument resolution) sees the libraries as absent,
    as before. Yields the list of stub modules made.
    """
    finder = _KernelLibraryFinder(roots)
    sys.meta_path.append(finder)
    try:
        yield finder.made
    finally:
        sys.meta_path.remove(finder)
        for name in finder.made:
            if isinstance(sys.modules.get(name), KernelLibraryStub):
                del sys.modules[name]


@contextlib.contextmanager
def stop_at_gpu_steps() -> Iterator[None]:
    """Inside: every step that needs a GPU raises :class:`GpuStep` (see the module docstring)."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _CudaGuard(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            why = needs_gpu(func, args, kwargs)
            if why is not None:
                raise GpuStep(why)
            return func(*args, **kwargs)

    cuda = torch.cuda
    saved = {name: cuda.__dict__[name] for name in (*_CUDA_CLASSES, "_lazy_init") if name in cuda.__dict__}
    try:
        for name in saved:
            setattr(cuda, name, _stopper("torch.cuda initialisation" if name == "_lazy_init"
                                         else f"torch.cuda.{name}()"))
        with _CudaGuard():
            yield
    finally:
        for name, value in saved.items():
            setattr(cuda, name, value)


def engine_frame(tb: types.TracebackType | None, package_dir: str) -> tuple[str, str] | None:
    """``(qualname, "file.py:line")`` of the innermost traceback frame under ``package_dir``."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if os.path.abspath(code.co_filename).startswith(package_dir):
            found = (getattr(code, "co_qualname", code.co_name), f"{os.path.basename(code.co_filename)}:{tb.tb_lineno}")
        tb = tb.tb_next
    return found


__all__ = ["GpuResource", "GpuStep", "KernelLibraryStub", "UnsetField", "cuda_absent", "engine_frame", "kernel_library_stubs",
           "missing_libraries", "needs_gpu", "stop_at_gpu_steps"]
