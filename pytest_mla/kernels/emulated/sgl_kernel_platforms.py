"""sgl-kernel's KV-cache writes of its CPU and XPU builds, emulated.

SGLang's pools write a GQA token's K and V rows through a platform op where
the platform has one (``memory_pool.py`` ``_set_kv_buffer_impl``): on the CPU
platform with AMX tiles ``torch.ops.sgl_kernel.store_cache_cpu`` (sgl-kernel's
CPU build), on XPU ``sgl_kernel.store_cache_xpu`` (sgl-kernel-xpu), each with
equal K and V row widths. Neither exists on this host. Emulated callables:
``torch.ops.sgl_kernel:store_cache_cpu``, ``sgl_kernel:store_cache_xpu``.

``store_cache_cpu`` is read from sgl-kernel's ``csrc/cpu/kvcache.cpp``
(``store_cache_cpu``, ``store_cache_kernel_impl``) and SGLang's CPU test of it
(``_store_cache_cpu``: ``row_dim = k.size(1) * k.size(2)``, bf16 / fp16 / uint8
rows); ``store_cache_xpu`` from sgl-kernel-xpu's SYCL ``store_cache_xpu``
(``StoreCacheKernel``) and its ``test_store_cache_xpu.py`` (reference:
``k_cache[indices] = k``). The contract:

* **store_cache_cpu arguments.** ``k``, ``v`` ``[batch, num_heads, head_size]``;
  ``k_cache``, ``v_cache`` ``[num_slots, num_heads, head_size]``; each 3-D with
  its last two dimensions contiguous (``CHECK_LAST2_DIM_CONTIGUOUS``);
  ``indices`` ``[batch]``, contiguous, int32 or int64; ``row_dim`` (optional)
  must equal ``num_heads * head_size`` (``CHECK_EQ``). All four tensors of one
  dtype, bfloat16, float16 or uint8 (an fp8 cache stored as bytes).
* **store_cache_xpu arguments.** ``k``, ``v`` ``[num_tokens, row_dim]``,
  ``k_cache``, ``v_cache`` ``[cache_size, row_dim]``, ``indices`` ``[num_tokens]``,
  all contiguous; ``v`` shaped as ``k``, ``v_cache`` as ``k_cache``, one
  ``row_dim``; int64 indices only; one dtype of float32, float64, float16 or
  bfloat16 (``SYCL_DISPATCH_FLOATING_TYPES``). An fp8 cache stored as uint8
  is not among them in the sources read, but the build SGLang pins may differ:
  uint8 rows are refused as not modelled (``OutOfContractError``), a candidate
  finding (SGLang's XPU pool hands the op uint8 rows for an fp8 cache), not a
  claim.
* Each argument check above is a ``RuntimeError`` here, as the op raises it.
* **Effect.** Row ``b`` of ``k`` / ``v`` (copied as it is: no scale, no
  conversion) goes to slot ``indices[b]`` of ``k_cache`` / ``v_cache``, in
  place; nothing is returned. ``store_cache_xpu`` skips a negative slot (other
  DCP ranks' rows, SGLang's XPU backend writes them at -1); ``store_cache_cpu``
  skips none. Neither checks bounds: a slot outside the cache (for the CPU op
  a negative one included) would be written into foreign memory, so it raises
  ``OutOfRangeRead`` here, before anything is written.
* **No attention.** The ops compute nothing (no softmax scale, no LSE); the
  attention that reads these rows is the backend's own (Triton, SDPA).
"""

from __future__ import annotations

from typing import Any

import torch

from .glue import OutOfContractError, check_index_range

__all__ = ["EMULATIONS", "store_cache_cpu", "store_cache_xpu"]

_DTYPES = (torch.bfloat16, torch.float16, torch.uint8)


def _check_last2_contiguous(name: str, x: torch.Tensor) -> None:
    if x.dim() != 3:
        raise RuntimeError(f"{name} must have 3 dimensions")
    if x.stride(-1) != 1 or x.stride(-2) != x.size(-1):
        raise RuntimeError(f"{name} must be contiguous at the last two dimensions")


def store_cache_cpu(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    indices: torch.Tensor, row_dim: Any = None) -> None:
    """``torch.ops.sgl_kernel.store_cache_cpu``: ``k_cache[indices[b]] = k[b]``, the same for V (see the module)."""
    for name, x in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_last2_contiguous(name, x)
    if not indices.is_contiguous():
        raise RuntimeError("indices must be contiguous")
    batch, heads, head_size = k.shape
    if row_dim is not None and int(row_dim) != heads * head_size:
        raise RuntimeError(f"Expected row_dim == num_heads * head_size ({int(row_dim)} vs. {heads * head_size})")
    if indices.size(0) != batch:
        raise RuntimeError(f"Expected indices.size(0) == batch_size ({indices.size(0)} vs. {batch})")
    if not all(x.dtype == k.dtype for x in (v, k_cache, v_cache)):
        raise RuntimeError("store_cache_cpu: input tensors must have the same dtype")
    if indices.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("indices must be int64 or int32")
    if k.dtype not in _DTYPES:
        raise RuntimeError(f"\"store_cache_cpu\" not implemented for '{str(k.dtype).removeprefix('torch.')}'")
    check_index_range("indices", indices, k_cache.size(0), access="write")
    rows = indices.to(torch.int64)
    # the kernel copies row_dim elements from row b of each input (its stride(0)) to row idx of each cache
    k_cache.view(k_cache.size(0), -1)[rows] = k.reshape(batch, -1)
    v_cache.view(v_cache.size(0), -1)[rows] = v.reshape(batch, -1)


def store_cache_xpu(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    indices: torch.Tensor) -> None:
    """``sgl_kernel.store_cache_xpu``: ``k_cache[i] = k[b]`` for each ``i = indices[b] >= 0``, the same for V."""
    for name, x in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("indices", indices)):
        if not x.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")
    for name, x, shape in (("k", k, "[num_tokens, row_dim]"), ("v", v, "[num_tokens, row_dim]"),
                           ("k_cache", k_cache, "[cache_size, row_dim]"), ("v_cache", v_cache, "[cache_size, row_dim]")):
        if x.dim() != 2:
            raise RuntimeError(f"{name} must be 2D {shape}")
    if indices.dim() != 1:
        raise RuntimeError("indices must be 1D [num_tokens]")
    if v.shape != k.shape:
        raise RuntimeError("v shape must match k shape")
    if v_cache.shape != k_cache.shape:
        raise RuntimeError("v_cache shape must match k_cache shape")
    if k.size(1) != k_cache.size(1):
        raise RuntimeError("k row_dim must match k_cache row_dim")
    if indices.size(0) != k.size(0):
        raise RuntimeError("indices length must match num_tokens")
    if indices.dtype != torch.int64:
        raise RuntimeError("indices must be int64")
    for name, x in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype != k.dtype:
            raise RuntimeError(f"k and {name} must have the same dtype")
    if k.size(0) == 0:
        return
    if k.dtype == torch.uint8:
        # what SGLang hands it for an fp8 cache (rows viewed as its uint8 store dtype)
        raise OutOfContractError("dtype", "uint8 rows (an fp8 cache stored as bytes): the SYCL dispatch read in "
                                          "sgl-kernel-xpu has no uint8 kernel (it would raise \"not implemented for "
                                          "'Byte'\"); whether the build SGLang pins has one is not known here")
    if k.dtype not in _XPU_DTYPES:
        raise RuntimeError(f"\"store_cache_xpu\" not implemented for '{_ATEN_NAMES.get(k.dtype, str(k.dtype))}'")
    kept = indices >= 0  # the kernel returns early for a negative slot
    check_index_range("indices", indices[kept], k_cache.size(0), access="write")
    k_cache[indices[kept]] = k[kept]
    v_cache[indices[kept]] = v[kept]


_XPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: How ATen's dispatch names a dtype it has no kernel for.
_ATEN_NAMES = {torch.uint8: "Byte", torch.int8: "Char", torch.float8_e4m3fn: "Float8_e4m3fn",
               torch.float8_e5m2: "Float8_e5m2"}

EMULATIONS = {"torch.ops.sgl_kernel:store_cache_cpu": store_cache_cpu, "sgl_kernel:store_cache_xpu": store_cache_xpu}
