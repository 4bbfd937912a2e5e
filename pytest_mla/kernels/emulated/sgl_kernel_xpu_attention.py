"""sgl-kernel-xpu's MLA attention ops (``flash_mla_decode``, ``flash_mla_prefill``), emulated.

SGLang's ``intel_xpu`` backend (``xpu_backend.py``) does not run an MLA model
through sgl-kernel-xpu's ``flash_attn_with_kvcache``: with an MLA model
(``use_mla``) its decode calls ``sgl_kernel.flash_mla_decode`` and its extend
(prefill, target verify, draft extend) ``sgl_kernel.flash_mla_prefill``, on a
workspace sized by ``flash_mla_decode_get_workspace_size`` and
``flash_mla_prefill_get_workspace_size`` in ``init_forward_metadata``. So the
project's emulation of the CUDA sgl-kernel's FA3 ``flash_attn_with_kvcache``
(``flash_attn.py``) is not reused: these are other ops with another contract
(split q, one 576-wide latent cache, no LSE merge, no descales). Emulated
callables: ``sgl_kernel:flash_mla_decode``, ``sgl_kernel:flash_mla_prefill``,
``sgl_kernel:flash_mla_decode_get_workspace_size``,
``sgl_kernel:flash_mla_prefill_get_workspace_size``.

Read from sgl-kernel-xpu (github.com/sgl-project/sgl-kernel-xpu), commit
``9cf16bf9`` (2026-08-21): ``python/sgl_kernel/attention.py`` (the wrappers
and their asserts), ``src/sycl/mla_decode.cpp`` (``flash_mla_decode``,
``set_split_kv``, ``flash_mla_get_workspace_size``), ``src/sycl/mla_prefill.cpp``,
``src/sycl/kernels/mla/device/mla_decode_types.hpp`` (``runMla``'s workspace
check), ``kernels/mla/kernel/xe_mla_kernel.hpp`` (``SplitKVWorkspaceLayout``)
and ``tests/test_flash_mla_decode.py`` (reference: ``softmax(q . kv * scale)
@ kv[:, :512]`` over the first ``seq_len`` rows of the paged cache); and a
later ``tests/test_flash_mla_decode.py`` of the same repository, which imports
``flash_mla_decode_get_workspace_size`` (the name SGLang imports; the commit
read calls it ``flash_mla_get_workspace_size``, same parameters) and adds
``return_lse`` (base-2 LSE) and a 256/32 (MiniCPM3) split. The wrapper of
that later release was not read; where it may differ, that is said below.

The contract:

* **Split q, one latent cache.** ``q_nope [B, H, 512]`` and ``q_pe [B, H, 64]``
  (prefill: ``[total_q, H, ...]``, ragged by ``cu_seqlens_q``);
  ``kv_c_and_k_pe_cache [num_pages, page_size, 576]``: K is the whole row
  (latent then rope), V its first 512. Scores ``(q_nope . c + q_pe . k_pe) *
  sm_scale`` (the caller's scale, no default), natural-exp softmax, in float64
  here. Output ``[B, H, 512]`` in q's dtype. The 256/32 split of the later
  release is not modelled (``OutOfContractError``); any other width is the
  decode wrapper's ``AssertionError``, and not modelled for the prefill
  (whose wrapper asserts only that the cache row is q_nope's plus q_pe's).
* **Paging.** Page sizes 16, 32, 64, 128 only (``TORCH_CHECK``: a
  ``RuntimeError``; SGLang's default page of 1 is refused so). ``page_table
  [B, pages]`` int32, ``seq_lens`` int32: request ``b`` reads its first
  ``seq_lens[b]`` tokens through pages ``page_table[b, :ceil(seq_lens[b] /
  page_size)]``. The decode wrapper asserts ``pages % (128 / page_size) == 0``
  (the kernel packs pages into 128-token tiles) and ``pages > 0``. A length
  beyond the row's pages, or a page id outside the cache, raises
  ``OutOfRangeRead``. Which page-table entries past the live pages the kernel's
  last 128-token tile dereferences is not read: only the live pages are
  checked. A zero length is not modelled (``OutOfContractError``; the
  library's tests use lengths of 2 and more).
* **dtypes.** fp16 or bf16, one dtype for q_nope, q_pe and the cache (wrapper
  asserts); no fp8 cache, no k/v descales (the ops have no such parameters;
  SGLang converts its cache to q's dtype before the call).
* **Heads.** ``H <= 128`` (decode wrapper assert); on an XPU device the
  wrapper makes q contiguous and allocates ``[B, H, 512]`` itself. The
  emulation stands in for that device: the op's ``CHECK_INPUT`` device check
  is not applied, its contiguity check is (cache, seq_lens, page_table,
  workspace: ``RuntimeError``).
* **Splits and workspace.** ``num_kv_splits < 1`` picks ``set_split_kv(B, H,
  page_size * pages, page_size)``; more than one split needs a workspace of
  ``SplitKVWorkspaceLayout`` bytes (256-aligned ``B*H*splits*512*2`` plus two
  256-aligned ``B*H*splits*4``), else ``RuntimeError`` ("MLA workspace too
  small"). The split changes only the reduction order: the emulation's result
  is the same for any split. ``flash_mla_decode_get_workspace_size`` returns
  that size (0 for one split; its auto split checks ``num_heads > 0`` and the
  page size); ``flash_mla_prefill_get_workspace_size`` returns 0 (the prefill
  kernel is never split-KV; its arguments are ignored, after the wrapper's
  ``max_seq_len > 0``, ``num_batches > 0`` asserts).
* **LSE.** The op SGLang calls returns no LSE. ``return_lse=True`` (the later
  release's keyword, read from its test) returns ``(out, lse [B, H] float32)``
  with ``lse = log2(sum 2^(score * log2 e))``, the natural LSE over ln 2.
* **Prefill causality.** ``causal=False`` is a ``RuntimeError`` ("Non-causal
  MLA prefill is not supported yet"); ``num_kv_splits > 1`` likewise. Query
  ``i`` of request ``b`` (``q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]``)
  sits at ``seq_lens[b] - q_len + i`` and sees keys up to it (bottom-right
  aligned: the prefix unmasked, the new tokens triangular), as the wrapper's
  docstring states. ``q_len > seq_lens[b]`` is not modelled.

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .glue import OutOfContractError, OutOfRangeRead, as_float64, attend, bottom_right_visible, check_index_range

__all__ = ["EMULATIONS", "flash_mla_decode", "flash_mla_decode_get_workspace_size", "flash_mla_prefill",
           "flash_mla_prefill_get_workspace_size", "set_split_kv", "split_kv_workspace_bytes"]

D_LATENT, D_ROPE, MAX_HEADS = 512, 64, 128
PAGE_SIZES = (16, 32, 64, 128)
_DTYPES = (torch.float16, torch.bfloat16)
LN2 = math.log(2.0)


def set_split_kv(batch: int, num_heads_q: int, seq_len_kv: int, page_size: int) -> int:
    """``mla_decode.cpp`` ``set_split_kv``: the auto split count (C++ integer arithmetic)."""
    base_parallel = batch * num_heads_q
    total_pages = (seq_len_kv + page_size - 1) // page_size
    if page_size <= 16:
        kv_per_split = 256 if base_parallel <= 64 else 128
    elif page_size <= 32:
        kv_per_split = 192 if base_parallel <= 64 else 64
    elif page_size <= 64:
        kv_per_split = 128 if base_parallel <= 64 else 64
    else:
        kv_per_split = page_size
    pages_per_split = max(1, kv_per_split // page_size)
    num_splits = min(max(1, total_pages // pages_per_split), total_pages)
    if seq_len_kv > 8192:
        if page_size <= 16:
            min_pages = 64 if base_parallel <= 32 else 16
            num_splits = min(num_splits, max(1, total_pages // min_pages))
        if page_size <= 32 and base_parallel <= 32:
            num_splits = min(num_splits, max(1, total_pages // 32))
    return min(max(num_splits, 1), 128)


def split_kv_workspace_bytes(batch: int, num_heads: int, num_splits: int, elem_size: int = 2) -> int:
    """``SplitKVWorkspaceLayout(...).total_bytes`` for ``head_size_o = 512``."""
    def aligned(n: int) -> int:
        return (n + 255) & ~255
    rows = batch * num_heads * num_splits
    return aligned(rows * D_LATENT * elem_size) + 2 * aligned(rows * 4)


def _check_page_size(page_size: int, what: str) -> None:
    if page_size not in PAGE_SIZES:
        raise RuntimeError(f"Unsupported page size for MLA {what}: {page_size}. Supported: 16, 32, 64, 128")


def _check_contiguous(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if not x.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")


def _check_split(q_nope: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor, *, asserted: bool = True) -> None:
    """The 512/64 split; ``asserted``: another width is the decode wrapper's ``AssertionError`` (the prefill
    wrapper asserts only ``576 == 512 + 64``-style agreement: what its kernels do with another is not read)."""
    d_nope, d_pe, d_ckv = q_nope.shape[-1], q_pe.shape[-1], cache.shape[-1]
    if (d_nope, d_pe, d_ckv) == (256, 32, 288):
        raise OutOfContractError("q_nope", "the 256/32 latent split (MiniCPM3) of a later sgl-kernel-xpu is not "
                                           "modelled")
    if not asserted and (d_nope, d_pe) != (D_LATENT, D_ROPE):
        raise OutOfContractError("q_nope", f"a {d_nope}/{d_pe} split: the prefill kernels read are built for "
                                           f"{D_LATENT}/{D_ROPE}; another is not modelled")
    assert d_nope == D_LATENT, f"q_nope's last dim must be {D_LATENT}, got {d_nope}"
    assert d_pe == D_ROPE, f"q_pe's last dim must be {D_ROPE}, got {d_pe}"
    assert d_ckv == D_LATENT + D_ROPE, f"kv_c_and_k_pe_cache's last dim must be {D_LATENT + D_ROPE}, got {d_ckv}"


def _rows(cache: torch.Tensor, pages: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """Request ``b``'s first ``n`` cache rows ``[n, 576]`` in float64, read through its page-table row."""
    page_size = cache.shape[1]
    needed = -(-n // page_size)
    if needed > pages.numel():
        raise OutOfRangeRead("seq_lens", f"request {b}: {n} tokens need {needed} pages of {page_size}, its page-table "
                                         f"row holds {pages.numel()}: the kernel would read past the row")
    used = pages[:needed].to("cpu", torch.int64)
    check_index_range("page_table", used, cache.shape[0])
    return as_float64(cache[used.to(cache.device)].reshape(needed * page_size, -1)[:n])


def _scores(q_nope: torch.Tensor, q_pe: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """``[H, q, n]`` scaled scores of queries ``[q, H, 512]`` / ``[q, H, 64]`` against rows ``[n, 576]``."""
    return (torch.einsum("qhd,nd->hqn", as_float64(q_nope), rows[:, :D_LATENT])
            + torch.einsum("qhd,nd->hqn", as_float64(q_pe), rows[:, D_LATENT:])) * float(scale)


def flash_mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_and_k_pe_cache: torch.Tensor,
                     seq_lens: torch.Tensor, page_table: torch.Tensor, workspace: torch.Tensor, sm_scale: float,
                     num_kv_splits: int = 1, return_lse: bool = False) -> Any:
    """``sgl_kernel.flash_mla_decode`` (XPU): ``out [B, H, 512]``, or ``(out, lse)`` with ``return_lse``."""
    assert q_nope.ndim == 3, f"q_nope must be a 3D tensor, but got {q_nope.ndim}"
    assert q_pe.ndim == 3, f"q_pe must be a 3D tensor, but got {q_pe.ndim}"
    cache = kv_c_and_k_pe_cache
    assert cache.ndim == 3, f"kv_c_and_k_pe_cache must be a 3D tensor, but got {cache.ndim}"
    b, h, _ = q_nope.shape
    assert q_pe.shape[:2] == (b, h)
    page_size = cache.shape[1]
    _check_split(q_nope, q_pe, cache)
    assert h <= MAX_HEADS, f"H must be <= {MAX_HEADS}, but got {h}"
    assert len(page_table.shape) == 2
    rows_b, block_num = page_table.shape
    assert rows_b == b
    assert block_num > 0, f"block num must be greater than 0, got {block_num}"
    assert block_num % (128 / page_size) == 0
    assert q_nope.dtype in _DTYPES, f"q_nope.dtype needs to be fp16 or bf16 but got {q_nope.dtype}."
    assert q_nope.dtype == q_pe.dtype == cache.dtype
    assert seq_lens.dtype == torch.int32, f"seq_lens.dtype needs to be int32 but got {seq_lens.dtype}."
    assert page_table.dtype == torch.int32, f"page_table.dtype needs to be int32 but got {page_table.dtype}."
    _check_contiguous(kv_c_and_k_pe_cache=cache, seq_lens=seq_lens, page_table=page_table, workspace=workspace)
    _check_page_size(page_size, "decode")
    splits = int(num_kv_splits)
    if splits < 1:
        splits = set_split_kv(b, h, page_size * block_num, page_size)
    if splits > 1:
        need = split_kv_workspace_bytes(b, h, splits, q_nope.element_size())
        if workspace.numel() < need:
            raise RuntimeError(f"MLA workspace too small: need {need} bytes for num_kv_splits={splits}, but got "
                               f"{workspace.numel()} bytes.")
    lens = seq_lens.to("cpu", torch.int64)
    if lens.shape != (b,):
        raise OutOfContractError("seq_lens", f"shape {tuple(seq_lens.shape)} for {b} requests")
    out = torch.zeros(b, h, D_LATENT, dtype=torch.float64)
    lse = torch.zeros(b, h, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        if n <= 0:
            raise OutOfContractError("seq_lens", f"request {i} has length {n}: an empty (or negative) length is not "
                                                 "modelled")
        rows = _rows(cache, page_table[i], n, i)
        o, l = attend(_scores(q_nope[i][None], q_pe[i][None], rows, sm_scale),
                      rows[:, None, :D_LATENT].expand(n, h, D_LATENT), torch.ones(1, n, dtype=torch.bool))
        out[i], lse[i] = o[0], l[:, 0]
    result = out.to(q_nope.dtype).to(q_nope.device)
    if return_lse:
        return result, (lse / LN2).to(torch.float32).to(q_nope.device)
    return result


def flash_mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_and_k_pe_cache: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, seq_lens_k: torch.Tensor, max_seqlen_q: int,
                      page_table: torch.Tensor, workspace: torch.Tensor, sm_scale: float, causal: bool = True,
                      num_kv_splits: int = -1) -> torch.Tensor:
    """``sgl_kernel.flash_mla_prefill`` (XPU): ``out [total_q, H, 512]``, causal bottom-right (see the module)."""
    cache = kv_c_and_k_pe_cache
    assert q_nope.ndim == 3, f"q_nope must be 3D (total_q, heads, dim), got {q_nope.ndim}"
    assert q_pe.ndim == 3, f"q_pe must be 3D (total_q, heads, dim), got {q_pe.ndim}"
    assert cache.ndim == 3, f"kv_c_and_k_pe_cache must be 3D (pages, page_size, dim), got {cache.ndim}"
    total_q, h, _ = q_nope.shape
    assert cache.shape[-1] == q_nope.shape[-1] + q_pe.shape[-1], \
        f"kv dim {cache.shape[-1]} must equal D_latent({q_nope.shape[-1]}) + D_rope({q_pe.shape[-1]})"
    assert q_nope.dtype in _DTYPES, f"q_nope.dtype must be fp16 or bf16, got {q_nope.dtype}"
    assert q_nope.dtype == q_pe.dtype == cache.dtype
    assert cu_seqlens_q.dtype == torch.int32
    assert seq_lens_k.dtype == torch.int32
    assert page_table.dtype == torch.int32
    batch = cu_seqlens_q.shape[0] - 1
    assert seq_lens_k.shape[0] == batch
    _check_contiguous(kv_c_and_k_pe_cache=cache, cu_seqlens_q=cu_seqlens_q, page_table=page_table,
                      workspace=workspace)
    page_size = cache.shape[1]
    if int(num_kv_splits) > 1:
        raise RuntimeError("Manual KV splits are not supported yet.")
    if not causal:
        raise RuntimeError("Non-causal MLA prefill is not supported yet.")
    _check_page_size(page_size, "prefill")
    _check_split(q_nope, q_pe, cache, asserted=False)
    starts = cu_seqlens_q.to("cpu", torch.int64)
    lens = seq_lens_k.to("cpu", torch.int64)
    if int(starts[0]) != 0 or int(starts[-1]) != total_q or bool((starts[1:] < starts[:-1]).any()):
        raise OutOfContractError("cu_seqlens_q", f"{starts.tolist()} does not partition {total_q} query rows")
    out = torch.zeros(total_q, h, D_LATENT, dtype=torch.float64)
    for i in range(batch):
        lo, hi, n = int(starts[i]), int(starts[i + 1]), int(lens[i])
        q_len = hi - lo
        if q_len == 0:
            continue
        if q_len > int(max_seqlen_q):
            raise OutOfContractError("max_seqlen_q", f"request {i} has {q_len} query rows, above {int(max_seqlen_q)}")
        if n < q_len:
            raise OutOfContractError("seq_lens_k", f"request {i}: {q_len} new queries but {n} keys; not modelled")
        rows = _rows(cache, page_table[i], n, i)
        visible = bottom_right_visible(q_len, torch.arange(n), n, causal=True)
        o, _ = attend(_scores(q_nope[lo:hi], q_pe[lo:hi], rows, sm_scale),
                      rows[:, None, :D_LATENT].expand(n, h, D_LATENT), visible)
        out[lo:hi] = o
    return out.to(q_nope.dtype).to(q_nope.device)


def flash_mla_decode_get_workspace_size(max_seq_len: int, num_batches: int, num_heads: int = 0, page_size: int = 0,
                                        num_kv_splits: int = -1) -> int:
    """``sgl_kernel.flash_mla_decode_get_workspace_size`` (the commit read: ``flash_mla_get_workspace_size``)."""
    assert max_seq_len > 0, f"max_seq_len must be greater than 0, got {max_seq_len}"
    assert num_batches > 0, f"num_batches must be greater than 0, got {num_batches}"
    splits = int(num_kv_splits)
    if splits < 1:
        if num_heads <= 0:
            raise RuntimeError("num_heads must be > 0 when num_kv_splits is auto-selected")
        if page_size not in PAGE_SIZES:
            raise RuntimeError(f"Unsupported page size: {page_size}")
        splits = set_split_kv(int(num_batches), int(num_heads), int(max_seq_len), int(page_size))
    if splits == 1:
        return 0
    if page_size not in PAGE_SIZES:
        raise RuntimeError(f"Unsupported page size: {page_size}")
    return split_kv_workspace_bytes(int(num_batches), int(num_heads), splits)  # sized for cutlass::half_t


def flash_mla_prefill_get_workspace_size(max_seq_len: int, num_batches: int, num_heads: int = 0, page_size: int = 0,
                                         num_kv_splits: int = -1) -> int:
    """``sgl_kernel.flash_mla_prefill_get_workspace_size``: 0 (the prefill kernel is never split-KV)."""
    assert max_seq_len > 0, f"max_seq_len must be > 0, got {max_seq_len}"
    assert num_batches > 0, f"num_batches must be > 0, got {num_batches}"
    return 0


EMULATIONS = {
    "sgl_kernel:flash_mla_decode": flash_mla_decode,
    "sgl_kernel:flash_mla_prefill": flash_mla_prefill,
    "sgl_kernel:flash_mla_decode_get_workspace_size": flash_mla_decode_get_workspace_size,
    "sgl_kernel:flash_mla_prefill_get_workspace_size": flash_mla_prefill_get_workspace_size,
}
