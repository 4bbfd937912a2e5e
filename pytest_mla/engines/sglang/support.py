"""Small pieces the SGLang adapter and its kernel-check modules share (no module of theirs imported here)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

from ...core.errors import AdapterError

__all__ = ["STUBS", "adapter_error", "make_dataclass"]

#: CUDA-linked or host-specific modules replaced by import stubs (imported for names only).
STUBS = {"torchvision": {"torchvision": {"__version__": "0.28.0"}}, "setproctitle": {}}


def adapter_error(step: str, message: str) -> AdapterError:
    """The adapter's own failure at ``step`` (verdict ``error``, never a finding)."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return AdapterError(step, message, engine="sglang", version=version)


def make_dataclass(cls: type, **values: Any) -> Any:
    """An instance of a (data)class from the fields it has; missing required fields raise."""
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(values)
    return cls(**{k: v for k, v in values.items() if k in names})
