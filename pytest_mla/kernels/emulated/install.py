"""Put emulations where an engine looks its kernels up, and log which ones it called.

An engine reaches a kernel library in one of three ways, and each is met here
for the duration of a ``with emulations_installed(names) as log:`` block:

* ``import flash_mla`` / ``from flashinfer.mla import X`` of a library that is
  not installed (a CPU host): a stand-in module is put in ``sys.modules``
  (with its parent packages and a module spec, so ``importlib.util.find_spec``
  finds it and an engine's "is the library available" probe says yes). It
  holds the emulations; any other name it is asked for is a placeholder that
  raises :class:`OutOfContractError` naming ``module.name`` when called, so
  importing an engine module works and only a kernel without an emulation stops.
* a module that exists (``vllm._custom_ops``, or a stand-in an adapter put
  there earlier): the attribute is replaced on it;
* ``torch.ops.<namespace>.<op>``: the op is set on the namespace object.

Modules that bound the previous object by name (``from x import y`` at import
time) are rebound too, and everything is put back afterwards. Every call of an
emulation is logged as its ``"module:qualname"`` (``log.called``): that list
is what a cell's record names as emulated — never the list of what was merely
installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import sys
import types
from typing import Any, Callable, Iterable, Iterator

from .glue import OutOfContractError

__all__ = ["CallLog", "emulations_installed"]


class CallLog:
    """The emulated callables an engine called, in first-call order."""

    def __init__(self) -> None:
        self.called: list[str] = []

    def note(self, name: str) -> None:
        if name not in self.called:
            self.called.append(name)


class _Placeholder:
    """A library name without an emulation: importable, refused when used."""

    def __init__(self, qualified: str) -> None:
        self._qualified = qualified

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise OutOfContractError(self._qualified, "has no emulation (pytest_mla.kernels.emulated)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualified}.{name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # `class X(flashinfer.Something)` at import time stays importable

    def __repr__(self) -> str:
        return f"<no emulation: {self._qualified}>"


class _StandIn(types.ModuleType):
    """A kernel library module that is not installed here, holding only emulations."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


def _logged(name: str, target: Any, log: CallLog) -> Any:
    if isinstance(target, type):
        class Logged(target):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                log.note(name)
                super().__init__(*args, **kwargs)

        Logged.__name__ = Logged.__qualname__ = target.__name__
        Logged.__module__ = target.__module__
        return Logged

    @functools.wraps(target)
    def call(*args: Any, **kwargs: Any) -> Any:
        log.note(name)
        return target(*args, **kwargs)

    return call


class _Patches:
    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        missing = object()
        old = owner.__dict__.get(name, missing) if hasattr(owner, "__dict__") else getattr(owner, name, missing)
        setattr(owner, name, value)
        self._undo.append(lambda: delattr(owner, name) if old is missing else setattr(owner, name, old))

    def module(self, name: str, module: types.ModuleType) -> None:
        old = sys.modules.get(name)
        sys.modules[name] = module
        self._undo.append(lambda: sys.modules.__setitem__(name, old) if old is not None else sys.modules.pop(name, None))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _module(path: str, patches: _Patches) -> Any:
    """The module object at ``path``: the real one if importable, else a stand-in (parents included)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        pass
    parent_path, _, leaf = path.rpartition(".")
    parent = _module(parent_path, patches) if parent_path else None
    module = _StandIn(path)
    module.__spec__ = importlib.machinery.ModuleSpec(path, loader=None, is_package=True)
    module.__path__ = []  # a package: its submodules can be stand-ins too
    module.__file__ = f"<pytest-mla emulated {path}>"
    patches.module(path, module)
    if parent is not None:
        patches.set(parent, leaf, module)
    return module


def _rebind(previous: Any, name: str, value: Any, patches: _Patches) -> None:
    """Modules that hold ``previous`` under ``name`` (a ``from x import name``) get ``value``."""
    if previous is None or isinstance(previous, (int, float, str, bool)):
        return
    for module in list(sys.modules.values()):
        if module is None or isinstance(module, _StandIn):
            continue
        try:
            held = module.__dict__.get(name)
        except AttributeError:
            continue
        if held is previous:
            patches.set(module, name, value)


@contextlib.contextmanager
def emulations_installed(names: Iterable[str], registry: dict[str, Any] | None = None) -> Iterator[CallLog]:
    """Install the emulations of ``names`` (``"module:qualname"`` keys of ``EMULATIONS``) for the block."""
    if registry is None:
        from . import EMULATIONS as registry  # noqa: N811 (the package's lazy registry)
    log = CallLog()
    patches = _Patches()
    try:
        for qualified in names:
            path, _, attr = qualified.partition(":")
            value = _logged(qualified, registry[qualified], log)
            if path.startswith("torch.ops."):
                import torch

                namespace = getattr(torch.ops, path[len("torch.ops."):])
                patches.set(namespace, attr, value)
                continue
            module = _module(path, patches)
            previous = module.__dict__.get(attr) if not isinstance(module, _StandIn) else None
            patches.set(module, attr, value)
            _rebind(previous, attr, value, patches)
        yield log
    finally:
        patches.undo()
