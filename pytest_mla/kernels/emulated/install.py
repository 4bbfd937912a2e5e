"""Put emulations where an engine looks its kernels up, and log which ones it called.

An engine reaches a kernel library in one of three ways, and each is met here
for the duration of a ``with emulations_installed(names) as log:`` block:

* ``import flash_mla`` / ``from flashinfer.mla import X`` of a library that is
  not installed (a CPU host), or of a subpackage of an installed one that fails
  to import (SGLang's vendored FlashAttention-4 needs NVIDIA's CuTe DSL): a
  stand-in module is put in ``sys.modules`` (only that package: the real
  parent's other modules import, or fail, as they do)
  (with its parent packages and a module spec, so ``importlib.util.find_spec``
  finds it and an engine's "is the library available" probe says yes). It
  holds the emulations; a name the emulated release does not define
  (``NOT_IN_LIBRARY``) is missing, as ``from x import name`` finds it on a
  host with that release; any other name it is asked for is a placeholder that
  raises :class:`OutOfContractError` naming ``module.name`` when called (a
  class name builds an inert instance whose methods raise so), so importing an
  engine module and building its unused wrappers works, and only a kernel
  without an emulation stops.
* a module that exists (``vllm._custom_ops``, or a stand-in an adapter put
  there earlier): the attribute is replaced on it;
* ``torch.ops.<namespace>.<op>``: the op is set on the namespace object.

Modules that bound the previous object by name (``from x import y`` at import
time) are rebound too. An engine module imported while the library was absent
skipped its guarded ``if library_available(): from library import A, B``:
with ``late_imports=("sglang",)`` the names such module-level imports of a
stood-in library would have bound are bound now, in the loaded modules of those
packages, where still missing or ``None`` (a guarded import's fallback) —
what the import does on a host that has the library. Everything is put back afterwards. Every call of an
emulation is logged as its ``"module:qualname"`` (``log.called``): that list
is what a cell's record names as emulated — never the list of what was merely
installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
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
        if self._qualified.rpartition(".")[2][:1].isupper():  # a class: constructing it is no kernel call
            return _Inert(self._qualified)
        raise OutOfContractError(self._qualified, "has no emulation (pytest_mla.kernels.emulated)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualified}.{name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # `class X(flashinfer.Something)` at import time stays importable

    def __repr__(self) -> str:
        return f"<no emulation: {self._qualified}>"


class _Inert:
    """An instance of a library class without an emulation (an engine builds wrappers it may not use):
    any method it is asked to run is refused, naming it."""

    def __init__(self, qualified: str) -> None:
        object.__setattr__(self, "_qualified", qualified)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualified}.{name}")

    def __repr__(self) -> str:
        return f"<no emulation: {self._qualified} instance>"


class _StandIn(types.ModuleType):
    """A kernel library module that is not installed here, holding only emulations.

    A package re-exports its submodules' emulations (``flashinfer`` exports
    ``flashinfer.mla.BatchMLAPagedAttentionWrapper``, as the library's
    ``__init__`` does); any other name is a placeholder.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _ABSENT.get(self.__name__, ()):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        current = sys.modules.get(self.__name__)
        if current is not self and isinstance(current, _StandIn):
            # an engine module kept this stand-in from an earlier installation (``import flash_mla`` at
            # its top): it answers with the installation in force, as a cached handle does
            return getattr(current, name)
        prefix = self.__name__ + "."
        for module_name, module in list(_STAND_INS.items()):
            if module_name.startswith(prefix) and sys.modules.get(module_name) is module and name in module.__dict__:
                return module.__dict__[name]
        return _Placeholder(f"{self.__name__}.{name}")


#: Stand-ins alive, by module name (a package's re-export lookup scans these, not all of sys.modules).
_STAND_INS: dict[str, _StandIn] = {}


#: Names the emulated releases do not define, by module (``NOT_IN_LIBRARY``), while installed.
_ABSENT: dict[str, frozenset[str]] = {}


#: The call log of the installation in force. Engines cache kernel handles across checks (SGLang's
#: ``cache_once`` loaders): a handle taken in an earlier check still reports to the current one, and
#: one called outside any installation refuses to run (it would compute unasked).
_CURRENT: list[CallLog] = []


def _note(name: str) -> None:
    if not _CURRENT:
        raise OutOfContractError(name, "an emulation kept from an earlier check was called outside one "
                                       "(pytest_mla.kernels.emulated.install)")
    _CURRENT[-1].note(name)


def _logged(name: str, target: Any, log: CallLog) -> Any:
    if isinstance(target, type):  # a library class: it ran once one of its public methods ran
        def method(attr: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def call(self: Any, *args: Any, **kwargs: Any) -> Any:
                _note(name)
                return fn(self, *args, **kwargs)
            return call

        members = {attr: method(attr, fn) for klass in reversed(target.__mro__[:-1])
                   for attr, fn in vars(klass).items() if not attr.startswith("_") and callable(fn)}
        return type(target.__name__, (target,), {**members, "__module__": target.__module__,
                                                  "__qualname__": target.__qualname__})

    @functools.wraps(target)
    def call(*args: Any, **kwargs: Any) -> Any:
        _note(name)
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
    _STAND_INS[path] = module
    patches._undo.append(lambda: _STAND_INS.pop(path, None))
    if parent is not None:
        patches.set(parent, leaf, module)
    return module


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import flashinfer.comm.x`` of a stood-in library: a stand-in submodule (its names placeholders),
    as the installed library would have one. Last on ``sys.meta_path``: a real module always wins."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        parent, _, leaf = fullname.rpartition(".")
        if _within(fullname, self.roots) and leaf not in _ABSENT.get(parent, ()):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        module.__file__ = f"<pytest-mla emulated {spec.name}>"
        _STAND_INS[spec.name] = module
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _outermost(paths: Iterable[str]) -> set[str]:
    """The stand-in packages not inside another: ``flashinfer`` for ``flashinfer.mla``, or a stood-in
    subpackage of a real package (``sglang.kernels.ops.attention.flash_attn.cute``), never the real parent."""
    paths = set(paths)
    return {p for p in paths if not any(p.startswith(q + ".") for q in paths)}


def _within(name: str, roots: Iterable[str]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


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


_IMPORTS_CACHE: dict[tuple[str, str], list[tuple[str, str, str]]] = {}


def _module_level_imports(module: types.ModuleType, libraries: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """Cached per module file; a module whose source names none of ``libraries`` is not parsed."""
    import inspect

    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return []
    libraries = tuple(libraries)
    if libraries and not any(library in source for library in libraries):
        return []
    key = (module.__name__, getattr(module, "__file__", None) or "")
    if key not in _IMPORTS_CACHE:
        _IMPORTS_CACHE[key] = _parse_module_level_imports(source)
    return _IMPORTS_CACHE[key]


def _parse_module_level_imports(source: str) -> list[tuple[str, str, str]]:
    """``(library module, name, bound as)`` of every ``from X import name`` and ``import X`` (name "")
    at module level (inside top-level ``if``/``try`` blocks too; never inside functions or classes)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: list[tuple[str, str, str]] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.extend((node.module, a.name, a.asname or a.name) for a in node.names)
            elif isinstance(node, ast.Import):  # `import x.y` binds x; `import x.y as z` binds z to x.y
                for a in node.names:
                    if a.asname:
                        parent, _, leaf = a.name.rpartition(".")
                        found.append((parent, leaf, a.asname) if parent else (a.name, "", a.asname))
                    else:
                        found.append((a.name.split(".")[0], "", a.name.split(".")[0]))
            elif isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    walk(block)

    walk(tree.body)
    return found


def _bind_late_imports(packages: Iterable[str], stood_in: set[str], patches: _Patches) -> None:
    prefixes = tuple(packages)
    for name, module in list(sys.modules.items()):
        if module is None or isinstance(module, _StandIn):
            continue
        if not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        imports = [i for i in _module_level_imports(module, stood_in) if _within(i[0], stood_in)]
        for library, attr, bound_as in imports:
            if module.__dict__.get(bound_as) is not None:
                continue  # bound; None is what a guarded import's fallback bound when the library was absent
            source = sys.modules.get(library) or _PlaceholderModule(library)
            if attr and attr in _ABSENT.get(library, ()):
                continue  # the import itself fails against that release: nothing would be bound
            patches.set(module, bound_as, getattr(source, attr) if attr else source)


class _PlaceholderModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Any:
        return _Placeholder(f"{self._name}.{name}")


@contextlib.contextmanager
def emulations_installed(names: Iterable[str], registry: dict[str, Any] | None = None, *,
                         late_imports: Iterable[str] = (), preload: Iterable[str] = (),
                         absent: dict[str, Iterable[str]] | None = None) -> Iterator[CallLog]:
    """Install the emulations of ``names`` (``"module:qualname"`` keys of ``EMULATIONS``) for the block.

    ``preload``: engine modules to import once the libraries are importable
    (a backend module that imports its library unguarded); ``late_imports``:
    packages (``"sglang"``) whose loaded modules then get the names their
    module-level imports of a stood-in library would have bound; ``absent``:
    module → names its stand-in does not offer (default: the package's
    ``NOT_IN_LIBRARY`` with the package's registry, none with another).
    """
    if registry is None:
        from . import EMULATIONS as registry  # noqa: N811 (the package's lazy registry)
        if absent is None:
            from . import NOT_IN_LIBRARY as absent
    saved_absent = dict(_ABSENT)
    for module_name, missing in (absent or {}).items():
        _ABSENT[module_name] = _ABSENT.get(module_name, frozenset()) | frozenset(missing)
    log = CallLog()
    patches = _Patches()
    patches._undo.append(lambda: (_ABSENT.clear(), _ABSENT.update(saved_absent)))
    _CURRENT.append(log)
    patches._undo.insert(0, lambda: _CURRENT.remove(log))
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
        roots = _outermost(path for path, module in _STAND_INS.items() if sys.modules.get(path) is module)
        if roots:
            finder = _StandInFinder(roots)
            sys.meta_path.append(finder)

            def forget() -> None:
                sys.meta_path.remove(finder)
                for name in [n for n in sys.modules if _within(n, roots)]:
                    if isinstance(sys.modules[name], _StandIn):
                        del sys.modules[name]
                        _STAND_INS.pop(name, None)

            patches._undo.append(forget)
        for module_name in preload:
            importlib.import_module(module_name)
        stood_in = _outermost(n for n, m in sys.modules.items() if isinstance(m, _StandIn))
        if late_imports and stood_in:
            _bind_late_imports(late_imports, stood_in, patches)
        yield log
    finally:
        patches.undo()
