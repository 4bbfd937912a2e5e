"""What a backend's decode kernel is and declares (pure data; kernels and engines share it)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A backend's decode kernel and what it declares it can do."""

    name: str  # e.g. "triton"
    target: str  # import path "module:attr" of a callable with the mla_decode signature
    returns_lse: bool = True  # returns a rank-local LSE (needed for the DCP merge)
    dcp_positions: bool = True  # masks by global positions under DCP (needed for DCP + spec)
    tree_mask: bool = True  # takes a speculative tree mask
