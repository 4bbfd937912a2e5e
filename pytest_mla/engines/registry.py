"""Find an engine adapter by name (``reference``, ``sglang``, ``vllm``) or ``module:attr``."""

from __future__ import annotations

from typing import Any

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
    try:
        factory = import_target(target)
    except TargetError as exc:
        raise EngineNotFoundError(f"engine {name!r}: {exc}") from None
    except ImportError as exc:
        module_name = target.partition(":")[0]
        if name in BUILTIN_ENGINES:  # an optional engine (sglang, vllm) that is not installed here
            hint = INSTALL_HINTS.get(name)
            raise EngineUnavailableError(f"engine {name!r} is not available here: {exc}"
                                         + (f"; install it with: {hint}" if hint else "")) from exc
        # A module:attr the user wrote: a mistake to report, not an engine to skip.
        raise EngineNotFoundError(f"engine {name!r}: cannot import module {module_name!r}: "
                                  f"{type(exc).__name__}: {exc}") from None
    engine = factory() if isinstance(factory, type) or callable(factory) else factory
    for needed in ("name", "version", "configure"):
        if not hasattr(engine, needed):
            raise EngineNotFoundError(f"engine {name!r} ({target}) lacks {needed!r}: not an Engine adapter")
    return engine

