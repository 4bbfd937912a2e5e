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

What each wrapper can compute and whether this host can run it is in
:mod:`library_probe` (imported by the engines through :mod:`library_hook`);
this module is imported only when a check runs a wrapper, and even then
imports torch and the library inside the call.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .library_probe import LIBRARY_KERNELS, LibraryKernel, accepts, trtllm_function

__all__ = [
    "KernelUnsupported",
    "flash_mla_decode",
    "flashinfer_mla_decode",
    "prepare_launch",
    "trtllm_mla_decode",
]

_LN2 = math.log(2.0)
DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
FLASHINFER_MLA_BACKEND = "auto"  # BatchMLAPagedAttentionWrapper backend: "auto" (fa3 on sm90, fa2 elsewhere), "fa2", ...
WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace; also TRT-LLM MLA's
_WORKSPACES: dict[tuple[str, str], Any] = {}  # (kind, device) -> workspace tensor, allocated on first use


class KernelUnsupported(ValueError):
    """The library cannot compute this call (a feature, dtype, shape or page size it lacks)."""


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
    dtype = DTYPE_NAMES.get(str(q.dtype), str(q.dtype))
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


#: A library call with its metadata built: calling it runs only the library (what a benchmark times)
#: and returns ``(out, lse)`` in our layout, LSE natural log (+inf allowed).
Launch = Callable[[], tuple[Any, Any]]


# --------------------------------------------------------------------------------------------
# FlashMLA
# --------------------------------------------------------------------------------------------


def _prepare_flash_mla(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal) -> Launch:
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

    return launch


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
    return _finish(*prepared(), out, return_lse)


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


def _prepare_flashinfer(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal) -> Launch:
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
    plan_lse_mode = accepts(wrapper.plan, "lse_mode", explicit=True)
    run_base_flag = not plan_lse_mode and accepts(wrapper.run, "return_lse_base_on_e", explicit=True)
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

    return launch


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
    return _finish(*prepared(), out, return_lse)


# --------------------------------------------------------------------------------------------
# TRT-LLM MLA (flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla, trtllm-gen backend)
# --------------------------------------------------------------------------------------------

_TRTLLM_QK_NOPE_HEAD_DIM = 128  # only validated by the library (DeepSeek's value); the scale is passed explicitly


def _trtllm_table_multiple(page_size: int) -> int:
    """Older flashinfer requires ``block_table.shape[1] % (128 / page_size) == 0``."""
    return max(1, 128 // page_size)


def _prepare_trtllm(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale) -> Launch:
    import flashinfer
    import torch

    fn = trtllm_function(flashinfer)
    if fn is None:
        raise KernelUnsupported("trtllm_mla: installed flashinfer has no trtllm_batch_decode_with_kv_cache_mla")
    if not accepts(fn, "return_lse"):
        raise KernelUnsupported("trtllm_mla: installed flashinfer returns no LSE from "
                                "trtllm_batch_decode_with_kv_cache_mla (needs flashinfer >= 0.6.12)")
    b, s_q, h_q, d_qk = q.shape
    num_pages, page_size = kv_cache.shape[:2]
    multiple = _trtllm_table_multiple(page_size)
    if block_table.shape[1] % multiple:
        pad = multiple - block_table.shape[1] % multiple
        block_table = torch.cat([block_table, block_table[:, -1:].expand(b, pad)], dim=1)
    max_seq_len = int(cache_seqlens.max()) if b else 0
    base_e = accepts(fn, "return_lse_base_on_e", explicit=True)
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

    return launch


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
        o, lse = prepared()
        full_out[rows] = o.to(q.dtype)
        full_lse[rows] = lse.to(torch.float32)
    return _finish(full_out, full_lse, out, return_lse)


def prepare_launch(backend: str, q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale) -> Launch:
    """The library call of ``backend`` with its metadata built once (``benchmarks/libraries.py`` times it)."""
    if backend == "flashmla":
        return _prepare_flash_mla(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, True)
    if backend == "flashinfer":
        return _prepare_flashinfer(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, True)
    if backend == "trtllm_mla":
        return _prepare_trtllm(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale)
    raise ValueError(f"no library wrapper for backend {backend!r}")
