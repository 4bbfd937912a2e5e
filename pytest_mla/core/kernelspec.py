"""What a backend's decode kernel is and declares (pure data; kernels and engines share it).

Two kinds of check run behind the same harness:

* ``protocol="mla_decode"``: ``target`` is a callable with ``mla_decode``'s
  signature (our Triton kernel, a library wrapper). The harness shards the
  cache for DCP, calls it once per rank and merges the partials itself.
* ``protocol="engine"``: ``target`` is an *engine runner* (see
  ``kernels/engine_check.py``): the engine's own backend or kernel entry
  point, called once per DCP rank on the unsharded inputs. The engine shards
  its cache, computes and merges with its own functions; the harness only
  generates the inputs, provides the ranks' collectives and compares with the
  float64 reference. ``level`` says whether the engine's backend object
  (``"backend"``) or its kernel entry point (``"kernel"``) ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

PROTOCOLS = ("mla_decode", "engine")
#: How DCP ranks run in a check: all in this process, or one ``torch.distributed`` process each.
DCP_MODES = ("in-process", "distributed")
#: ``emulated``: the engine's backend code ran with its innermost compiled calls replaced by float64
#: emulations of the kernel libraries' contracts (``kernels/emulated``); never shown as a kernel run.
LEVELS = ("ours", "backend", "kernel", "emulated")


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A backend's decode kernel and what it declares it can do."""

    name: str  # e.g. "triton"
    target: str  # import path "module:attr" (see ``protocol``)
    returns_lse: bool = True  # returns a rank-local LSE (needed for the DCP merge)
    dcp_positions: bool = True  # masks by global positions under DCP (needed for DCP + spec)
    tree_mask: bool = True  # takes a speculative tree mask
    #: Rounds q and the softmax weights to the fp8 cache dtype for its dots (an FP8 MMA);
    #: an fp8-cache check is then held to ``compare.FP8_DOT_TOLERANCES``.
    fp8_dots: bool = False
    protocol: str = "mla_decode"
    level: str = "ours"  # "ours" (this project's kernel or a library wrapper), "backend", "kernel", "emulated"
    function: str | None = None  # the engine function computing attention, "module:qualname"
    package: str | None = None  # the engine's top-level package ("sglang"): frames there are the engine's
    #: Plain, hashable values the engine runner reads (resolved server arguments and the like).
    options: tuple[tuple[str, Any], ...] = ()
    #: ``KernelCase`` fields the engine decides (``h_q`` of one DCP group, the resolved
    #: ``page_size`` and ``kv_dtype``): they override what the cell's coordinates give.
    case: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"KernelSpec.protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.level not in LEVELS:
            raise ValueError(f"KernelSpec.level must be one of {LEVELS}, got {self.level!r}")

    @property
    def option_map(self) -> dict[str, Any]:
        return dict(self.options)
