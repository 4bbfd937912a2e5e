"""Installed MLA decode libraries behind ``mla_decode``'s signature: FlashMLA, FlashInfer MLA, TRT-LLM MLA.

Each public ``*_decode`` wrapper takes exactly the arguments of
:func:`pytest_mla.kernels.triton_mla.mla_decode` (absorbed ``q [b, s_q, h_q, 576]``,
a paged latent cache ``[num_pages, page_size, 1, 576]``, an int32 block table and
lengths), maps them onto the library's own API, runs it, and converts the
result back to this project's conventions:

* ``out [b, s_q, h_q, d_v]`` in q's dtype; ``lse [b, h_q, s_q]`` fp32, **natural log**;
* a query with nothing to attend has ``lse = -inf`` (FlashMLA says ``+inf``; FlashInfer
  and TRT-LLM MLA report base-2 LSE unless asked for base e).

What a library cannot do is refused with :class:`KernelUnsupported` (a
``ValueError``) before any launch, naming the feature: tree masks, DCP global
positions with more than one query token, fp8 caches, GQA caches, other head
dims or dtypes. The wrappers never compute attention themselves; the only
host-side data movement is (a) re-paging a cache whose page size the library
cannot read into one it can (``repage=True``, the default; the engine forces the
same page size, see ``engines/reference.py: FORCED_PAGE_SIZES``) and (b) for
TRT-LLM MLA, leaving requests with zero cached tokens out of the launch (its
kernel does not write those rows) and giving them ``out = 0``, ``lse = -inf``.

Nothing here imports torch or a library at module import: the plugin imports
the engines, which import :mod:`library_hook`, which imports this module.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import math
import sys
from typing import Any, Callable, Sequence

__all__ = [
    "LIBRARY_KERNELS",
    "KernelUnsupported",
    "LibraryKernel",
    "available_library_kernels",
    "bench_library_kernels",
    "flash_mla_decode",
    "flashinfer_mla_decode",
    "is_arch_supported",
    "library_status",
    "trtllm_mla_decode",
]

_LN2 = math.log(2.0)
FLASHINFER_MLA_BACKEND = "auto"  # BatchMLAPagedAttentionWrapper backend: "auto" (fa3 on sm90, fa2 elsewhere), "fa2", ...
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace; also TRT-LLM MLA's
_WORKSPACES: dict[tuple[str, str], Any] = {}  # (kind, device) -> workspace tensor, allocated on first use


class KernelUnsupported(ValueError):
    """The library cannot compute this call (a feature, dtype, shape or page size it lacks)."""


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LibraryKernel:
    """One wrapper: what it needs on the host and what it can compute."""

    backend: str  # engine backend it checks ("flashmla", "flashinfer", "trtllm_mla")
    target: str  # "module:attr" of the wrapper (mla_decode's signature)
    module: str  # top-level Python module of the library
    library: str  # the library in words, for messages
    archs: tuple[str, ...]  # GPU archs it runs on ("sm90", ...); "sm80+" style is spelled out
    page_sizes: tuple[int, ...] | None  # native page sizes; None = any (others are re-paged)
    dtypes: tuple[str, ...]  # q / cache / out dtypes
    d_qk: tuple[int, ...]  # key widths (kv_lora_rank + qk_rope_head_dim)
    d_v: tuple[int, ...]  # value widths (kv_lora_rank)
    returns_lse: bool  # returns a rank-local LSE (DCP merge)
    dcp_positions: bool  # masks by DCP global positions (DCP + spec verify)
    tree_mask: bool  # takes a speculative tree mask
    non_causal_multi_query: bool  # s_q > 1 without the causal mask
    note: str = ""

    def describe(self) -> dict[str, Any]:
        """Plain values for reports and the capability table."""
        d = dataclasses.asdict(self)
        d["page_sizes"] = list(self.page_sizes) if self.page_sizes else "any"
        for key in ("archs", "dtypes", "d_qk", "d_v"):
            d[key] = list(d[key])
        return d


_SM80_PLUS = ("sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121")

LIBRARY_KERNELS: dict[str, LibraryKernel] = {
    "flashmla": LibraryKernel(
        backend="flashmla", target="pytest_mla.kernels.libraries:flash_mla_decode", module="flash_mla",
        library="FlashMLA (flash_mla.flash_mla_with_kvcache)", archs=("sm90",), page_sizes=(64,),
        dtypes=("bf16", "fp16"), d_qk=(576,), d_v=(512,), returns_lse=True, dcp_positions=False,
        tree_mask=False, non_causal_multi_query=True,
        note="dense decode is SM90a-only in FlashMLA (csrc/api/dense_decode.h); LSE +inf for empty queries",
    ),
    "flashinfer": LibraryKernel(
        backend="flashinfer", target="pytest_mla.kernels.libraries:flashinfer_mla_decode", module="flashinfer",
        library="FlashInfer MLA (flashinfer.mla.BatchMLAPagedAttentionWrapper)", archs=_SM80_PLUS,
        page_sizes=None, dtypes=("bf16", "fp16"), d_qk=(576,), d_v=(512,), returns_lse=True,
        dcp_positions=False, tree_mask=False, non_causal_multi_query=True,
        note="backend 'auto' (fa3 on sm90, fa2 elsewhere); LSE base 2 unless return_lse_base_on_e",
    ),
    "trtllm_mla": LibraryKernel(
        backend="trtllm_mla", target="pytest_mla.kernels.libraries:trtllm_mla_decode", module="flashinfer",
        library="TRT-LLM MLA (flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla, trtllm-gen)",
        archs=("sm100", "sm103"), page_sizes=(32, 64), dtypes=("bf16",), d_qk=(576,), d_v=(512,),
        returns_lse=True, dcp_positions=False, tree_mask=False, non_causal_multi_query=False,
        note="LSE needs flashinfer >= 0.6.12 (return_lse; base 2); rows with seq_lens == 0 are not written",
    ),
}

_DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def is_arch_supported(lib: LibraryKernel, host_arch: str) -> bool:
    """True when ``host_arch`` (``"sm90"``, ``"sm90a"``, ``"cpu"``, ``"interpreter"``) is one the library runs on."""
    base = host_arch.rstrip("af") if host_arch.startswith("sm") else host_arch
    return base in lib.archs


def _is_installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _trtllm_function(flashinfer_module: Any) -> Callable | None:
    for sub in ("decode", "mla"):
        mod = getattr(flashinfer_module, sub, None)
        if mod is None:
            try:
                mod = importlib.import_module(f"flashinfer.{sub}")
            except ImportError:
                continue
        fn = getattr(mod, "trtllm_batch_decode_with_kv_cache_mla", None)
        if fn is not None:
            return fn
    return None


def _accepts(fn: Callable, name: str, *, explicit: bool = False) -> bool:
    """True when ``fn`` takes keyword ``name`` (``explicit``: named in its signature, not just ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or (not explicit and any(p.kind is p.VAR_KEYWORD for p in params.values()))


def library_status(backend: str, host_arch: str) -> tuple[bool, str | None]:
    """``(runnable, reason)`` for one wrapper on a host of ``host_arch``.

    Without a matching GPU nothing is imported (``find_spec`` only), so this is
    cheap and torch-free on a CPU host. On a matching GPU the library is
    imported, so a broken build is reported as such.
    """
    lib = LIBRARY_KERNELS.get(backend)
    if lib is None:
        return False, f"no library wrapper for backend {backend!r} (wrapped: {', '.join(LIBRARY_KERNELS)})"
    reasons = []
    installed = _is_installed(lib.module)
    if not installed:
        reasons.append(f"{lib.module} not installed")
    if not is_arch_supported(lib, host_arch):
        reasons.append(f"{lib.library} needs {'/'.join(lib.archs)}, host is {host_arch}")
    if reasons:
        return False, f"{backend}: " + "; ".join(reasons)
    try:
        module = importlib.import_module(lib.module)
    except Exception as exc:  # a library built for another CUDA / torch fails here, not in the cell
        return False, f"{backend}: import {lib.module} failed: {type(exc).__name__}: {exc}"
    if backend == "trtllm_mla":
        fn = _trtllm_function(module)
        version = getattr(module, "__version__", "?")
        if fn is None:
            return False, f"trtllm_mla: flashinfer {version} has no trtllm_batch_decode_with_kv_cache_mla"
        if not _accepts(fn, "return_lse"):
            return False, (f"trtllm_mla: flashinfer {version} returns no LSE from "
                           "trtllm_batch_decode_with_kv_cache_mla (needs return_lse, flashinfer >= 0.6.12)")
    if backend == "flashinfer":
        mla = getattr(module, "mla", None) or importlib.import_module("flashinfer.mla")
        if getattr(mla, "BatchMLAPagedAttentionWrapper", None) is None:
            return False, f"flashinfer: {getattr(module, '__version__', '?')} has no mla.BatchMLAPagedAttentionWrapper"
    if backend == "flashmla" and not hasattr(module, "flash_mla_with_kvcache"):
        return False, "flashmla: flash_mla has no flash_mla_with_kvcache"
    return True, None


def _kernel_spec(lib: LibraryKernel):
    from ..core.kernelspec import KernelSpec  # the engine-facing type; imported only when asked for

    return KernelSpec(lib.backend, lib.target, returns_lse=lib.returns_lse, dcp_positions=lib.dcp_positions,
                      tree_mask=lib.tree_mask)


def available_library_kernels(host_arch: str) -> dict[str, tuple[Any, str | None]]:
    """``{backend: (KernelSpec, None) or (None, reason)}`` for every wrapper, on a host of ``host_arch``."""
    result: dict[str, tuple[Any, str | None]] = {}
    for backend, lib in LIBRARY_KERNELS.items():
        ok, reason = library_status(backend, host_arch)
        result[backend] = (_kernel_spec(lib), None) if ok else (None, reason)
    return result


# --------------------------------------------------------------------------------------------
# Shared argument checks and conversions
# --------------------------------------------------------------------------------------------


def _unsupported(lib: LibraryKernel, what: str) -> KernelUnsupported:
    return KernelUnsupported(f"{lib.backend}: {lib.library} cannot {what}")


def _check_call(lib: LibraryKernel, q, kv_cache, block_table, cache_seqlens, head_dim_v, causal, kv_scale,
                v_cache, tree_mask, dcp_world_size, global_seqlens) -> None:
    """Refuse what the library cannot compute; shapes it can take pass through to it."""
    import torch

    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise KernelUnsupported(f"{lib.backend}: q must be a 4-D tensor [b, s_q, h_q, d_qk]")
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
        raise KernelUnsupported(f"{lib.backend}: kv_cache must be a 4-D tensor [num_pages, page_size, h_kv, d_qk]")
    b, s_q, h_q, d_qk = q.shape
    dtype = _DTYPE_NAMES.get(str(q.dtype), str(q.dtype))
    if dtype not in lib.dtypes:
        raise _unsupported(lib, f"compute in {dtype} (supports {', '.join(lib.dtypes)})")
    if kv_scale is not None or kv_cache.dtype != q.dtype:
        raise _unsupported(lib, f"read a {kv_cache.dtype} cache with a per-tensor kv_scale "
                                f"(this wrapper passes q's dtype {q.dtype} caches only)")
    if v_cache is not None or kv_cache.shape[2] != 1:
        raise _unsupported(lib, f"serve a GQA cache (h_kv={kv_cache.shape[2]}, separate V): MLA latent cache only")
    if d_qk not in lib.d_qk or head_dim_v not in lib.d_v or kv_cache.shape[3] != d_qk:
        raise _unsupported(lib, f"use head dims d_qk={d_qk} (cache {kv_cache.shape[3]}), d_v={head_dim_v} "
                                f"(supports d_qk {lib.d_qk}, d_v {lib.d_v})")
    if tree_mask is not None:
        raise _unsupported(lib, "take a speculative tree mask (topk > 1)")
    if s_q > 1 and not causal and not lib.non_causal_multi_query:
        raise _unsupported(lib, f"run {s_q} query tokens without the causal mask")
    if dcp_world_size > 1 and s_q > 1:
        raise _unsupported(lib, f"mask {s_q} query tokens by DCP global positions (dcp_world_size="
                                f"{dcp_world_size}): it takes only rank-local lengths")
    if dcp_world_size == 1 and s_q > 1 and causal and global_seqlens is not None:
        if not torch.equal(global_seqlens.to(cache_seqlens.device, torch.int32), cache_seqlens.to(torch.int32)):
            raise _unsupported(lib, "place queries by global_seqlens that differ from cache_seqlens")
    if block_table.dtype != torch.int32 or cache_seqlens.dtype != torch.int32:
        raise KernelUnsupported(f"{lib.backend}: block_table and cache_seqlens must be int32")
    if block_table.shape[0] != b or cache_seqlens.shape[0] != b:
        raise KernelUnsupported(f"{lib.backend}: block_table {tuple(block_table.shape)} and cache_seqlens "
                                f"{tuple(cache_seqlens.shape)} must have b = {b} rows")


def _repage(kv_cache, block_table, cache_seqlens, page_size: int, *, width_multiple: int = 1):
    """Copy each request's tokens into a cache of ``page_size`` pages: ``(cache, block_table)``.

    Pages are assigned in reverse order (the table is not the identity), slots
    past each length and one spare page are NaN, unused table entries are
    ``UNUSED_PAGE``, and the table width is a multiple of ``width_multiple``.
    """
    import torch

    from .inputs import UNUSED_PAGE

    _, old_page, h_kv, d = kv_cache.shape
    lengths = [int(n) for n in cache_seqlens.tolist()]
    pages_per_req = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_req) + 1
    width = max(pages_per_req, default=0) + 1
    width = -(-width // width_multiple) * width_multiple
    cache = torch.full((num_pages, page_size, h_kv, d), math.nan, dtype=kv_cache.dtype, device=kv_cache.device)
    table = torch.full((len(lengths), width), UNUSED_PAGE, dtype=torch.int32, device=block_table.device)
    next_page = num_pages - 1
    for i, (n, n_pages) in enumerate(zip(lengths, pages_per_req)):
        if n == 0:
            continue
        old_pages = block_table[i, : -(-n // old_page)].long()
        rows = kv_cache[old_pages].reshape(-1, h_kv, d)[:n]  # [n, h_kv, d]
        ids = torch.arange(next_page, next_page - n_pages, -1, device=kv_cache.device)
        next_page -= n_pages
        padded = torch.full((n_pages * page_size, h_kv, d), math.nan, dtype=kv_cache.dtype, device=kv_cache.device)
        padded[:n] = rows
        cache[ids] = padded.view(n_pages, page_size, h_kv, d)
        table[i, :n_pages] = ids.to(torch.int32)
    return cache, table


def _native_pages(lib: LibraryKernel, kv_cache, block_table, cache_seqlens, repage: bool, width_multiple=None):
    page_size = kv_cache.shape[1]
    if lib.page_sizes is None or page_size in lib.page_sizes:
        return kv_cache, block_table
    if not repage:
        raise _unsupported(lib, f"read pages of {page_size} tokens (supports {', '.join(map(str, lib.page_sizes))}; "
                                "repage=True copies the cache into native pages)")
    target = lib.page_sizes[-1]
    return _repage(kv_cache, block_table, cache_seqlens, target,
                   width_multiple=width_multiple(target) if width_multiple else 1)


def _finish(out_lib, lse_lib, out, return_lse):
    """Empty queries to ``-inf``; write into ``out`` when given; ``(out, lse)`` or ``out``."""
    import torch

    lse = torch.where(torch.isposinf(lse_lib), -math.inf, lse_lib).to(torch.float32)
    if out is not None:
        out.copy_(out_lib)
        out_lib = out
    return (out_lib, lse) if return_lse else out_lib


def _workspace(kind: str, device, *, zero: bool):
    import torch

    key = (kind, str(device))
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() != WORKSPACE_BYTES:
        alloc = torch.zeros if zero else torch.empty
        buf = alloc(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _WORKSPACES[key] = buf
    return buf


@dataclasses.dataclass
class _Prepared:
    """A library call with its metadata built: ``launch()`` runs only the library (what a benchmark times)."""

    launch: Callable[[], tuple[Any, Any]]  # -> (out, lse) in our layout, lse natural log (+inf allowed)


# --------------------------------------------------------------------------------------------
# FlashMLA
# --------------------------------------------------------------------------------------------


def _prepare_flash_mla(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal) -> _Prepared:
    import flash_mla

    b, s_q, h_q, d_qk = q.shape
    h_kv = kv_cache.shape[2]
    q = q.contiguous()  # [b, s_q, h_q, 576]
    # Old API: (tile_scheduler_metadata, num_splits) tensors; FlashMLA >= 1.0: (FlashMLASchedMeta, None),
    # filled on the first call. Both take (cache_seqlens, s_q * h_q // h_kv, h_kv) positionally.
    sched, splits = flash_mla.get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)

    def launch():
        out, lse = flash_mla.flash_mla_with_kvcache(
            q, kv_cache, block_table, cache_seqlens, head_dim_v, sched, splits,
            softmax_scale=softmax_scale, causal=causal,
        )
        return out, lse  # [b, s_q, h_q, d_v], [b, h_q, s_q] natural log, +inf where nothing is visible

    return _Prepared(launch)


def flash_mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True,
                     kv_scale=None, num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None,
                     dcp_rank=0, dcp_world_size=1, dcp_interleave=1, global_seqlens=None, out=None, repage=True):
    """FlashMLA dense decode (SM90, bf16/fp16, 576/512, pages of 64) with ``mla_decode``'s signature.

    ``num_splits`` is ignored (FlashMLA schedules its own splits). With
    ``dcp_world_size > 1`` only ``s_q == 1`` is accepted: one query at the end
    of the request sees every local key, so the global positions change nothing.
    Raises :class:`KernelUnsupported` for what FlashMLA cannot compute.
    """
    lib = LIBRARY_KERNELS["flashmla"]
    _check_call(lib, q, kv_cache, block_table, cache_seqlens, head_dim_v, causal, kv_scale, v_cache, tree_mask,
                dcp_world_size, global_seqlens)
    kv_cache, block_table = _native_pages(lib, kv_cache, block_table, cache_seqlens, repage)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    prepared = _prepare_flash_mla(q, kv_cache, block_table, cache_seqlens, head_dim_v, scale, causal)
    return _finish(*prepared.launch(), out, return_lse)


# --------------------------------------------------------------------------------------------
# FlashInfer MLA (BatchMLAPagedAttentionWrapper)
# --------------------------------------------------------------------------------------------


def _paged_indices(block_table, cache_seqlens, page_size: int):
    """FlashInfer's CSR page list: ``(kv_indptr [b+1], kv_indices [total_pages])`` int32 from the block table."""
    import torch

    pages = (cache_seqlens.to(torch.int64) + page_size - 1) // page_size  # [b]
    kv_indptr = torch.zeros(pages.shape[0] + 1, dtype=torch.int32, device=block_table.device)
    kv_indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    used = cols[None, :] < pages.to(block_table.device)[:, None]  # [b, max_pages]
    kv_indices = block_table[used].to(torch.int32)  # row-major: request 0's pages, then request 1's, ...
    return kv_indptr, kv_indices


def _prepare_flashinfer(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal) -> _Prepared:
    import torch
    from flashinfer.mla import BatchMLAPagedAttentionWrapper

    b, s_q, h_q, d_qk = q.shape
    page_size = kv_cache.shape[1]
    q_nope = q[..., :head_dim_v].reshape(b * s_q, h_q, head_dim_v).contiguous()  # [b*s_q, h_q, 512]
    q_pe = q[..., head_dim_v:].reshape(b * s_q, h_q, d_qk - head_dim_v).contiguous()  # [b*s_q, h_q, 64]
    ckv = kv_cache[:, :, 0, :head_dim_v]  # [num_pages, page_size, 512] (view)
    kpe = kv_cache[:, :, 0, head_dim_v:]  # [num_pages, page_size, 64] (view)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=q.device) * s_q
    kv_indptr, kv_indices = _paged_indices(block_table, cache_seqlens, page_size)

    wrapper = BatchMLAPagedAttentionWrapper(_workspace("flashinfer", q.device, zero=False),
                                            backend=FLASHINFER_MLA_BACKEND)
    # The LSE base: newest releases choose it at plan time (lse_mode), earlier ones at run time
    # (return_lse_base_on_e), the oldest always return base 2.
    plan_lse_mode = _accepts(wrapper.plan, "lse_mode", explicit=True)
    run_base_flag = not plan_lse_mode and _accepts(wrapper.run, "return_lse_base_on_e", explicit=True)
    base_e = plan_lse_mode or run_base_flag
    wrapper.plan(
        qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=cache_seqlens,
        num_heads=h_q, head_dim_ckv=head_dim_v, head_dim_kpe=d_qk - head_dim_v, page_size=page_size,
        causal=causal and s_q > 1, sm_scale=softmax_scale, q_data_type=q.dtype, kv_data_type=kv_cache.dtype,
        **({"lse_mode": "basee"} if plan_lse_mode else {}),
    )
    extra = {"return_lse_base_on_e": True} if run_base_flag else {}

    def launch():
        o, lse = wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=True, **extra)  # [b*s_q, h_q, 512], [b*s_q, h_q]
        if not base_e:
            lse = lse * _LN2  # base 2 -> natural log
        return o.view(b, s_q, h_q, head_dim_v), lse.view(b, s_q, h_q).permute(0, 2, 1)

    return _Prepared(launch)


def flashinfer_mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True,
                          kv_scale=None, num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None,
                          dcp_rank=0, dcp_world_size=1, dcp_interleave=1, global_seqlens=None, out=None,
                          repage=True):
    """FlashInfer's paged MLA decode (``BatchMLAPagedAttentionWrapper``) with ``mla_decode``'s signature.

    q is split into ``q_nope`` (first ``d_v``) and ``q_pe`` (the rope tail), the
    latent cache into ``ckv`` / ``kpe`` views; ``kv_indptr`` / ``kv_indices`` list
    each request's pages from the block table. LSE comes back in base e
    (``return_lse_base_on_e`` where the installed version has it, else converted
    from base 2). Any page size; ``num_splits`` ignored.
    """
    lib = LIBRARY_KERNELS["flashinfer"]
    _check_call(lib, q, kv_cache, block_table, cache_seqlens, head_dim_v, causal, kv_scale, v_cache, tree_mask,
                dcp_world_size, global_seqlens)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    prepared = _prepare_flashinfer(q, kv_cache, block_table, cache_seqlens, head_dim_v, scale, causal)
    return _finish(*prepared.launch(), out, return_lse)


# --------------------------------------------------------------------------------------------
# TRT-LLM MLA (flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla, trtllm-gen backend)
# --------------------------------------------------------------------------------------------

_TRTLLM_QK_NOPE_HEAD_DIM = 128  # only validated by the library (DeepSeek's value); the scale is passed explicitly


def _trtllm_table_multiple(page_size: int) -> int:
    """Older flashinfer requires ``block_table.shape[1] % (128 / page_size) == 0``."""
    return max(1, 128 // page_size)


def _prepare_trtllm(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale) -> _Prepared:
    import flashinfer
    import torch

    fn = _trtllm_function(flashinfer)
    if fn is None:
        raise KernelUnsupported("trtllm_mla: installed flashinfer has no trtllm_batch_decode_with_kv_cache_mla")
    if not _accepts(fn, "return_lse"):
        raise KernelUnsupported("trtllm_mla: installed flashinfer returns no LSE from "
                                "trtllm_batch_decode_with_kv_cache_mla (needs flashinfer >= 0.6.12)")
    b, s_q, h_q, d_qk = q.shape
    num_pages, page_size = kv_cache.shape[:2]
    multiple = _trtllm_table_multiple(page_size)
    if block_table.shape[1] % multiple:
        pad = multiple - block_table.shape[1] % multiple
        block_table = torch.cat([block_table, block_table[:, -1:].expand(b, pad)], dim=1)
    max_seq_len = int(cache_seqlens.max()) if b else 0
    base_e = _accepts(fn, "return_lse_base_on_e", explicit=True)
    extra = {"return_lse_base_on_e": True} if base_e else {}
    kwargs = dict(
        query=q.contiguous(),  # [b, s_q, h_q, 576]
        kv_cache=kv_cache.view(num_pages, page_size, d_qk).unsqueeze(1),  # [num_pages, 1, page_size, 576]
        workspace_buffer=_workspace("trtllm", q.device, zero=True),
        qk_nope_head_dim=_TRTLLM_QK_NOPE_HEAD_DIM, kv_lora_rank=head_dim_v, qk_rope_head_dim=d_qk - head_dim_v,
        block_tables=block_table, seq_lens=cache_seqlens, max_seq_len=max_seq_len,
        bmm1_scale=softmax_scale,  # q_scale * k_scale * softmax scale, with unit q/k scales (bf16)
        bmm2_scale=1.0,  # v_scale * o_scale
        backend="trtllm-gen", return_lse=True, **extra,
    )

    def launch():
        o, lse = fn(**kwargs)  # [b, s_q, h_q, 512] bf16, [b*s_q, h_q] fp32 (base 2 from trtllm-gen)
        if not base_e:
            lse = lse * _LN2
        return o.view(b, s_q, h_q, head_dim_v), lse.view(b, s_q, h_q).permute(0, 2, 1)

    return _Prepared(launch)


def trtllm_mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True,
                      kv_scale=None, num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None,
                      dcp_rank=0, dcp_world_size=1, dcp_interleave=1, global_seqlens=None, out=None, repage=True):
    """TRT-LLM's MLA decode (trtllm-gen, SM100, bf16, pages of 32/64) with ``mla_decode``'s signature.

    ``bmm1_scale`` is the softmax scale (unit q/k scales), ``bmm2_scale`` 1.
    Several query tokens are always causal. Requests with no cached token are
    left out of the launch and get ``out = 0``, ``lse = -inf``; the LSE is
    converted from base 2. ``num_splits`` ignored.
    """
    import torch

    lib = LIBRARY_KERNELS["trtllm_mla"]
    _check_call(lib, q, kv_cache, block_table, cache_seqlens, head_dim_v, causal, kv_scale, v_cache, tree_mask,
                dcp_world_size, global_seqlens)
    b, s_q, h_q, _ = q.shape
    kv_cache, block_table = _native_pages(lib, kv_cache, block_table, cache_seqlens, repage,
                                          width_multiple=_trtllm_table_multiple)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    full_out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
    full_lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float32, device=q.device)
    rows = torch.nonzero(cache_seqlens > 0).flatten()  # the kernel leaves rows with seq_lens == 0 unwritten
    if rows.numel():
        all_rows = rows.numel() == b
        sub = (lambda x: x) if all_rows else (lambda x: x.index_select(0, rows))
        prepared = _prepare_trtllm(sub(q), kv_cache, sub(block_table), sub(cache_seqlens), head_dim_v, scale)
        o, lse = prepared.launch()
        full_out[rows] = o.to(q.dtype)
        full_lse[rows] = lse.to(torch.float32)
    return _finish(full_out, full_lse, out, return_lse)


WRAPPERS: dict[str, Callable] = {
    "flashmla": flash_mla_decode,
    "flashinfer": flashinfer_mla_decode,
    "trtllm_mla": trtllm_mla_decode,
}


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------

#: FlashMLA's roofline shapes: (b, s_q, h_q, s_k).
BENCH_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (128, 1, 16, 4096), (128, 1, 128, 4096), (128, 2, 128, 4096), (128, 1, 128, 8192),
)


def _bench_inputs(b, s_q, h_q, s_k, page_size, dtype, device, d_qk=576):
    import torch

    pages = -(-s_k // page_size)
    q = (torch.randn(b, s_q, h_q, d_qk, device=device) / 10).to(dtype)  # [b, s_q, h_q, 576]
    kv = (torch.randn(b * pages, page_size, 1, d_qk, device=device) / 10).to(dtype)  # [pages, page_size, 1, 576]
    table = torch.randperm(b * pages, device=device).to(torch.int32).view(b, pages)  # [b, pages]
    lens = torch.full((b,), s_k, dtype=torch.int32, device=device)
    return q, kv, table, lens


def bench_library_kernels(shapes: Sequence[tuple[int, int, int, int]] | None = None, *, host_arch: str | None = None,
                          dtype: str = "bf16", include_triton: bool = True,
                          print_fn: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Time each runnable wrapper (and the project's Triton kernel) with ``triton.testing.do_bench``.

    ``shapes`` are ``(b, s_q, h_q, s_k)``; each library gets its native page size,
    so only its launch is timed (metadata is built once, as an engine does).
    Prints one line per (kernel, shape) with ms, GB/s and TFLOP/s (FlashMLA's
    roofline formulas) and returns the rows. Without a CUDA GPU it prints why
    and returns ``[]``.
    """
    import torch

    if not torch.cuda.is_available():
        print_fn("bench_library_kernels: skipped, no CUDA GPU here (library kernels need sm80+)")
        return []
    from ._mode import ensure_triton_mode

    arch = host_arch or ensure_triton_mode()
    import triton.testing

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kernels: list[tuple[str, int, Callable]] = []
    for backend, (spec, reason) in available_library_kernels(arch).items():
        if spec is None:
            print_fn(f"{backend:<11} skipped: {reason}")
            continue
        lib = LIBRARY_KERNELS[backend]
        if dtype not in lib.dtypes:
            print_fn(f"{backend:<11} skipped: {dtype} not supported")
            continue
        kernels.append((backend, (lib.page_sizes or (64,))[-1], _bench_launcher(backend)))
    if include_triton:
        from .triton_mla import mla_decode

        kernels.append(("triton", 64, lambda q, kv, t, lens, scale: (lambda: mla_decode(q, kv, t, lens, 512, scale))))
    rows = []
    for b, s_q, h_q, s_k in shapes or BENCH_SHAPES:
        nbytes = b * (s_k * 576 * 2 + s_q * h_q * 576 * 2 + s_q * h_q * 512 * 2)
        flops = 2 * b * s_q * h_q * s_k * (576 + 512)
        for name, page_size, make in kernels:
            q, kv, table, lens = _bench_inputs(b, s_q, h_q, s_k, page_size, torch_dtype, "cuda")
            try:
                launch = make(q, kv, table, lens, 576 ** -0.5)
                ms = triton.testing.do_bench(launch)
            except Exception as exc:  # one library failing must not hide the others
                print_fn(f"{name:<11} b={b} s_q={s_q} h_q={h_q} s_k={s_k}: failed: {type(exc).__name__}: {exc}")
                continue
            row = {"kernel": name, "b": b, "s_q": s_q, "h_q": h_q, "s_k": s_k, "page_size": page_size,
                   "dtype": dtype, "ms": ms, "gb_s": nbytes / ms / 1e6, "tflop_s": flops / ms / 1e9}
            rows.append(row)
            print_fn(f"{name:<11} b={b:<4} s_q={s_q} h_q={h_q:<4} s_k={s_k:<6} {ms * 1e3:9.1f} us "
                     f"{row['gb_s']:8.0f} GB/s {row['tflop_s']:7.1f} TFLOP/s")
    return rows


def _bench_launcher(backend: str) -> Callable:
    """``make(q, kv, table, lens, scale) -> launch``: metadata built once, the launch timed alone."""
    def make(q, kv, table, lens, scale):
        if backend == "flashmla":
            return _prepare_flash_mla(q, kv, table, lens, 512, scale, True).launch
        if backend == "flashinfer":
            return _prepare_flashinfer(q, kv, table, lens, 512, scale, True).launch
        return _prepare_trtllm(q, kv, table, lens, 512, scale).launch

    return make
