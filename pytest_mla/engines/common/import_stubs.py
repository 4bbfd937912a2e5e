"""Import stubs for CUDA-linked modules that block importing a real engine on a CPU machine.

A stub answers ``import NAME`` and ``import NAME.anything`` with modules whose
attributes are inert placeholders (classes that cannot do anything useful; a
placeholder called as a function, a lower-case name, returns a ``StubResult``,
whose first use raises ``StubCalled``).
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
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        """A placeholder class is built (its engine may subclass or instantiate it); a placeholder for a
        function (a lower-case name) returns a ``StubResult``: the engine may call it for its side effect
        (a warm-up) or keep its answer, but any use of the answer raises ``StubCalled`` naming the
        function, where a placeholder object would have let the engine go on and fail far from the call."""
        if cls.__module__ == "stub" and cls.__qualname__.rsplit(".", 1)[-1][:1].islower():
            return StubResult(cls.__qualname__)
        return super().__call__(*args, **kwargs)

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


class StubResult:
    """What a placeholder function returned: using it (unpacking, indexing, arithmetic, a tensor op,
    an attribute) raises ``StubCalled`` naming the function; keeping it or dropping it does not."""

    __slots__ = ("_stub_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_stub_name", name)

    def _used(self, *args: Any, **kwargs: Any) -> Any:
        from ...core.errors import StubCalled

        raise StubCalled(object.__getattribute__(self, "_stub_name"))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._used()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        stub = next(a for a in list(args) + list((kwargs or {}).values()) if isinstance(a, StubResult))
        return stub._used()

    __iter__ = __getitem__ = __len__ = __call__ = __int__ = __float__ = __index__ = _used
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _used
    __floordiv__ = __mod__ = __pow__ = __neg__ = __lt__ = __le__ = __gt__ = __ge__ = __matmul__ = _used


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
