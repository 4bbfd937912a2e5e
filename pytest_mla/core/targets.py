"""``module:attr`` import strings, resolved in one place (engines, kernels, hooks)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TargetError", "import_target"]


class TargetError(ImportError):
    """A ``module:attr`` string that does not name an importable object."""


def import_target(text: str) -> Any:
    """The object ``"package.module:attr.sub"`` names (``attr`` may be dotted: a class method).

    Raises ``TargetError`` for a malformed string or a missing attribute; an
    ``ImportError`` raised while importing the module propagates unchanged
    (its ``name`` says which module is missing).
    """
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"expected 'module:attr', got {text!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{text!r}: {module_name!r} has no attribute {attr!r}") from None
    return obj
