"""Where the built-in engine asks whether an installed library can check a backend's numbers here.

``library_kernel_for(backend, host_arch, ...)`` answers for the backends that
have a wrapper in :mod:`libraries` (``flashmla``, ``flashinfer``,
``trtllm_mla``, see :mod:`library_probe`): a ``KernelSpec`` when the library is installed, the host GPU
is one it runs on and the configuration is one the wrapper can compute, else
``None`` and the reason. For any other backend it returns ``(None, None)``:
keep the engine's own reason.

The configuration arguments are optional; pass what the engine resolved so
that a configuration the library cannot compute (a non-MLA model, a tree
mask, DCP with several query tokens, an fp8 cache) becomes a ``not-run`` with
its reason instead of a crashed kernel check. Importing this module imports
neither torch nor any library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .library_probe import LIBRARY_KERNELS, kernel_spec, library_status

if TYPE_CHECKING:
    from ..core.kernelspec import KernelSpec

__all__ = ["library_kernel_for", "library_limit"]

_KV_DTYPES_SAME = ("auto", "bf16", "fp16", None)


def library_limit(backend: str, *, model: Any = None, spec: Any = None, dcp: int = 1,
                  kv_cache_dtype: str | None = "auto") -> str | None:
    """Why the ``backend`` wrapper cannot compute this configuration, or None when it can.

    ``model`` is a ``ModelConfig`` (``mla``, ``d_qk``, ``d_v``), ``spec`` a
    ``SpecSetting`` (``s_q``, ``topk``); both optional.
    """
    lib = LIBRARY_KERNELS[backend]
    if model is not None:
        if not getattr(model, "mla", True):
            return f"{backend}: the {lib.library} wrapper checks MLA models only ({model.name} is not MLA)"
        d_qk, d_v = getattr(model, "d_qk", None), getattr(model, "d_v", None)
        if (d_qk is not None and d_qk not in lib.d_qk) or (d_v is not None and d_v not in lib.d_v):
            return (f"{backend}: {lib.library} supports head dims d_qk {list(lib.d_qk)}, d_v {list(lib.d_v)}; "
                    f"{model.name} has {d_qk}/{d_v}")
    s_q = getattr(spec, "s_q", 1) if spec is not None else 1
    if spec is not None and getattr(spec, "topk", 1) > 1 and not lib.tree_mask:
        return f"{backend}: {lib.library} takes no speculative tree mask (topk > 1)"
    if dcp > 1 and s_q > 1 and not lib.dcp_positions:
        return (f"{backend}: {lib.library} takes no DCP global positions, so DCP with {s_q} query tokens "
                "cannot be checked")
    if dcp > 1 and not lib.returns_lse:
        return f"{backend}: {lib.library} returns no LSE for the DCP merge"
    if kv_cache_dtype not in _KV_DTYPES_SAME:
        return f"{backend}: the wrapper passes caches in the query dtype only, not kv-cache-dtype {kv_cache_dtype}"
    return None


def library_kernel_for(backend: str, host_arch: str, *, model: Any = None, spec: Any = None, dcp: int = 1,
                       kv_cache_dtype: str | None = "auto") -> tuple["KernelSpec | None", str | None]:
    """``(KernelSpec, None)`` when a library can check ``backend`` on this host; ``(None, reason)`` when not.

    ``(None, None)`` for a backend without a library wrapper. ``host_arch`` is
    where the kernel would run: ``"sm90"``, ``"sm100"``, ``"cpu"``, ``"interpreter"``
    (``pytest_mla.core.host.probe_host()["arch"]`` gives it without importing torch).
    """
    if backend not in LIBRARY_KERNELS:
        return None, None
    limit = library_limit(backend, model=model, spec=spec, dcp=dcp, kv_cache_dtype=kv_cache_dtype)
    if limit is not None:
        return None, limit
    ok, reason = library_status(backend, host_arch)
    if not ok:
        return None, reason
    return kernel_spec(LIBRARY_KERNELS[backend]), None
