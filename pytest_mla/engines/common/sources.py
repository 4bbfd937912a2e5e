"""Reading an installed engine's source without importing it (the adapters key on what a release contains)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["source_of"]


def source_of(module_name: str) -> str | None:
    """The text of ``module_name``'s file, or None when it is not installed (or has no file)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return Path(spec.origin).read_text()
