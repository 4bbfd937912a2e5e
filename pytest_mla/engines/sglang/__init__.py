"""The SGLang adapter.

* ``adapter``: the ``Engine`` the runner drives (``SGLangEngine``: configure,
  refusals, metadata, registered backends, known archs, checks of other platforms).
* ``startup``: start-up validation — SGLang's argument parsing and resolution, its
  attention-backend factories and constructors up to their first GPU step, the
  EAGLE draft worker — with the cell's GPU arch faked; ``platforms``: SGLang's
  platforms answering for the cell's device.
* ``backends``: one record per SGLang attention backend (``BACKENDS``), what the
  modules below read instead of tables of their own.
* ``checks``: which numeric check an accepted cell runs (``kernel_for``) and the
  engine runner the harness calls per DCP rank (``run``); ``emulation``: a CUDA
  backend's own code on a CPU around emulated kernel libraries;
  ``platform_check``: another platform's cell checked in that platform's child.
* ``rank``: SGLang's own server args, pools, allocator, translator, backend and
  forward batch for one rank; ``batch``: the requests' cache slots and the verify
  input from SGLang's draft-tree code; ``model``: the DeepSeek model's
  absorbed-MLA attention path.
* ``support``: small pieces the modules above share.
"""

from typing import Any

__all__ = ["SGLangEngine"]


def __getattr__(name: str) -> Any:
    # Lazy: ``adapter`` imports sglang itself (ImportError where it is not installed), while
    # ``checks`` and its helpers must stay importable without it.
    if name == "SGLangEngine":
        from .adapter import SGLangEngine

        return SGLangEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
