"""Find an engine adapter by name (``reference``, ``sglang``, ``vllm``) or ``module:attr``."""

from __future__ import annotations

from typing import Any

from ..core.errors import STEP_FAILURES, describe_failure
from ..core.targets import TargetError, import_target
from .protocol import Engine

BUILTIN_ENGINES = {
    "reference": "pytest_mla.engines.reference:ReferenceEngine",
    "sglang": "pytest_mla.engines.sglang:SGLangEngine",
    "vllm": "pytest_mla.engines.vllm:VLLMEngine",
}


#: How to get a built-in adapter's engine into this environment.
INSTALL_HINTS = {
    "sglang": "pip install sglang (a CPU-only machine: see docs/engines.md for the pinned venv that "
              "tools/conformance.sh builds)",
    "vllm": "pip install vllm (a CPU-only machine: see docs/engines.md for the pinned venv that "
            "tools/conformance.sh builds)",
}


class EngineNotFoundError(LookupError):
    """No usable adapter of that name: a mistake in the matrix file, or a broken adapter.
    ``module_missing``: the adapter's module was not found (a path problem, not a broken module)."""

    def __init__(self, message: str, *, module_missing: bool = False) -> None:
        super().__init__(message)
        self.module_missing = module_missing


class EngineUnavailableError(RuntimeError):
    """The adapter exists but its engine cannot be imported here (not installed)."""


def load_engine(name: str, extra: dict[str, Any] | None = None) -> Engine:
    """Instantiate an engine adapter. ``extra`` maps names to factories registered by hooks.

    However a step fails (an import that raises, ``sys.exit()`` at import, a constructor that
    raises, an object that is not an adapter) the error is one line naming the adapter, the step
    and the cause: ``EngineNotFoundError`` (the matrix names no usable adapter) or
    ``EngineUnavailableError`` (a built-in adapter whose optional engine is not installed).
    """
    if extra and name in extra:
        factory, target = extra[name], f"registered by a pytest_mla_engines hook as {name!r}"
    else:
        target = BUILTIN_ENGINES.get(name, name)
        if ":" not in target:
            known = sorted(set(BUILTIN_ENGINES) | set(extra or {}))
            raise EngineNotFoundError(f"unknown engine {name!r} (known: {', '.join(known)}; or 'module:attr')")
        factory = _import_adapter(name, target)
    try:
        engine = factory() if isinstance(factory, type) or callable(factory) else factory
    except STEP_FAILURES as exc:
        if isinstance(exc, ImportError) and name in BUILTIN_ENGINES and not (extra and name in extra):
            raise _unavailable(name, exc) from exc  # a built-in adapter imports its engine on construction
        raise EngineNotFoundError(f"engine {name!r} ({target}): constructing the adapter raised "
                                  f"{describe_failure(exc)}") from None
    check_adapter(engine, f"engine {name!r} ({target})")
    return engine


def _import_adapter(name: str, target: str) -> Any:
    module_name = target.partition(":")[0]
    try:
        return import_target(target)
    except TargetError as exc:
        raise EngineNotFoundError(f"engine {name!r}: {exc}") from None
    except ImportError as exc:
        if name in BUILTIN_ENGINES:  # an optional engine (sglang, vllm) that is not installed here
            raise _unavailable(name, exc) from exc
        # A module:attr the user wrote: a mistake to report, not an engine to skip.
        raise EngineNotFoundError(f"engine {name!r}: cannot import module {module_name!r}: "
                                  f"{type(exc).__name__}: {exc}", module_missing=True) from None
    except STEP_FAILURES as exc:  # installed but broken: an error, never a skip
        raise EngineNotFoundError(f"engine {name!r}: importing module {module_name!r} raised "
                                  f"{describe_failure(exc)}") from None


def _unavailable(name: str, exc: ImportError) -> EngineUnavailableError:
    hint = INSTALL_HINTS.get(name)
    return EngineUnavailableError(f"engine {name!r} is not available here: {exc}"
                                  + (f"; install it with: {hint}" if hint else ""))


def check_adapter(engine: Any, shown: str) -> None:
    """The protocol's required parts, asked once at load so that no cell meets a broken one:
    ``name`` and ``version`` (non-empty text), ``configure`` (callable), ``refusal_errors``
    (an exception class or a tuple of them: anything else breaks the ``except`` of every cell)."""
    for needed in ("name", "version", "configure"):
        try:
            value = getattr(engine, needed)
        except AttributeError:
            raise EngineNotFoundError(f"{shown} lacks {needed!r}: not an Engine adapter") from None
        except STEP_FAILURES as exc:
            raise EngineNotFoundError(f"{shown}: reading its {needed!r} raised {describe_failure(exc)}") from None
        if needed == "configure":
            if not callable(value):
                raise EngineNotFoundError(f"{shown}: 'configure' must be callable, got {type(value).__name__}")
        elif not isinstance(value, str) or not value.strip():
            raise EngineNotFoundError(f"{shown}: {needed!r} must be non-empty text, got {value!r}")
    try:
        errors = getattr(engine, "refusal_errors", ())
    except STEP_FAILURES as exc:
        raise EngineNotFoundError(f"{shown}: reading its 'refusal_errors' raised {describe_failure(exc)}") from None
    listed = errors if isinstance(errors, tuple) else (errors,)
    if not all(isinstance(e, type) and issubclass(e, BaseException) for e in listed):
        raise EngineNotFoundError(f"{shown}: 'refusal_errors' must be an exception class or a tuple of them, "
                                  f"got {errors!r}")
