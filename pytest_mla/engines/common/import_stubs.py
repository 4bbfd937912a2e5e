"""Import stubs for CUDA-linked modules that block importing a real engine on a CPU machine.

A stub answers ``import NAME`` and ``import NAME.anything`` with modules whose
attributes are inert placeholders (classes that cannot do anything useful).
Only modules that are imported for their names, never called during argument
validation, may be stubbed; each adapter lists its stubs in ``metadata()``.

Nothing here runs at import: ``install_stubs`` is called by an adapter when it
loads its engine.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Iterable, Mapping


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{cls.__qualname__}.{name}")
        setattr(cls, name, value)
        return value


class _Placeholder(metaclass=_PlaceholderMeta):
    """Stands for any name a stubbed module is asked for; fails loudly only if used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{type(self).__qualname__} is an import stub (pytest-mla): not callable here")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)


def _placeholder(qualname: str) -> type:
    return type(qualname.rsplit(".", 1)[-1], (_Placeholder,), {"__qualname__": qualname, "__module__": "stub"})


class StubModule(types.ModuleType):
    """A module whose missing attributes are placeholder classes."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def __init__(self, attrs: Mapping[str, Any]) -> None:
        self.attrs = attrs

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []  # a package, so that any submodule imports
        module.__dict__.update(self.attrs.get(spec.name, {}))
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class StubFinder(importlib.abc.MetaPathFinder):
    """Answers imports of ``roots`` and their submodules with ``StubModule``s."""

    def __init__(self, roots: Iterable[str], attrs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.roots = tuple(roots)
        self.loader = _StubLoader(attrs or {})

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == r or fullname.startswith(r + ".") for r in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=True)
        return None


def install_stubs(roots: Iterable[str], attrs: Mapping[str, Mapping[str, Any]] | None = None,
                  *, force: bool = False) -> list[str]:
    """Make ``roots`` (and submodules) import as stubs; returns the roots newly stubbed.

    A root that is importable for real is left alone (a stub never shadows a
    working module) unless ``force``: compiled extensions whose file exists but
    cannot load against CPU torch.
    """
    installed = []
    todo = []
    for root in roots:
        if root in sys.modules and not isinstance(sys.modules[root], StubModule):
            continue
        if force:
            todo.append(root)
            continue
        try:
            found = importlib.machinery.PathFinder.find_spec(root)
        except (ImportError, ValueError):
            found = None
        if found is not None:
            continue
        todo.append(root)
    if todo:
        sys.meta_path.insert(0, StubFinder(todo, attrs))
        installed.extend(todo)
    return installed
