"""Kernels: the project's Triton MLA decode, its float64 reference and the comparison helpers.

Importing this package imports neither torch nor triton; the Triton entry
points load on first use (PEP 562), after :func:`_mode.ensure_triton_mode`
has decided whether the interpreter is needed.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["mla_decode", "merge_attention_states", "merge_attention_states_torch", "default_num_splits"]

_LAZY = {name: "triton_mla" for name in __all__}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
