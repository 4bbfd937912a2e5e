"""Find an engine adapter by name (``reference``, ``sglang``, ``vllm``) or ``module:attr``."""

from __future__ import annotations

import importlib
from typing import Any

from .protocol import Engine

BUILTIN_ENGINES = {
    "reference": "pytest_mla.engines.reference:ReferenceEngine",
    "sglang": "pytest_mla.engines.sglang:SGLangEngine",
    "vllm": "pytest_mla.engines.vllm:VLLMEngine",
}


class EngineNotFoundError(LookupError):
    """No adapter of that name: a mistake in the matrix file."""


class EngineUnavailableError(RuntimeError):
    """The adapter exists but its engine cannot be imported here (not installed)."""


def load_engine(name: str, extra: dict[str, Any] | None = None) -> Engine:
    """Instantiate an engine adapter. ``extra`` maps names to factories registered by hooks."""
    if extra and name in extra:
        factory = extra[name]
        return factory() if callable(factory) else factory
    target = BUILTIN_ENGINES.get(name, name)
    if ":" not in target:
        known = sorted(set(BUILTIN_ENGINES) | set(extra or {}))
        raise EngineNotFoundError(f"unknown engine {name!r} (known: {', '.join(known)}; or 'module:attr')")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if name in BUILTIN_ENGINES or _is_missing(exc, module_name):
            raise EngineUnavailableError(f"engine {name!r} is not available here: {exc}") from exc
        raise
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise EngineNotFoundError(f"engine {name!r}: module {module_name!r} has no attribute {attr!r}") from None
    engine = factory() if isinstance(factory, type) or callable(factory) else factory
    for needed in ("name", "version", "configure"):
        if not hasattr(engine, needed):
            raise EngineNotFoundError(f"engine {name!r} ({target}) lacks {needed!r}: not an Engine adapter")
    return engine


def _is_missing(exc: ImportError, module_name: str) -> bool:
    missing = getattr(exc, "name", None) or ""
    return bool(missing) and (module_name == missing or module_name.startswith(missing + "."))
