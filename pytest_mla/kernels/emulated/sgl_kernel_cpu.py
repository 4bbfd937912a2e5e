"""sgl-kernel's CPU KV-cache write (``torch.ops.sgl_kernel.store_cache_cpu``), emulated.

SGLang's pools on the CPU platform with AMX tiles write a GQA token's K and V
rows through ``torch.ops.sgl_kernel.store_cache_cpu`` (``memory_pool.py``
``_set_kv_buffer_impl``: ``_is_cpu and _cpu_has_amx_support`` and equal K and
V row widths), an op only sgl-kernel's CPU build registers. Emulated callable:
``torch.ops.sgl_kernel:store_cache_cpu``.

Read from sgl-kernel's ``csrc/cpu/kvcache.cpp`` (``store_cache_cpu`` and
``store_cache_kernel_impl``) and SGLang's CPU test of it (``_store_cache_cpu``:
``row_dim = k.size(1) * k.size(2)``, bf16 / fp16 / uint8 rows). The contract:

* **Arguments.** ``k``, ``v`` ``[batch, num_heads, head_size]``; ``k_cache``,
  ``v_cache`` ``[num_slots, num_heads, head_size]``; each 3-D with its last two
  dimensions contiguous (``CHECK_LAST2_DIM_CONTIGUOUS``); ``indices``
  ``[batch]``, contiguous, int32 or int64; ``row_dim`` (optional) must equal
  ``num_heads * head_size`` (``CHECK_EQ``). All four tensors of one dtype,
  bfloat16, float16 or uint8 (an fp8 cache stored as bytes): the op's
  ``TORCH_CHECK`` and its dispatch. Each of these is a ``RuntimeError`` here,
  as the op raises it.
* **Effect.** Row ``b`` of ``k`` / ``v`` (``num_heads * head_size`` elements,
  copied as they are: no scale, no conversion) goes to slot ``indices[b]`` of
  ``k_cache`` / ``v_cache``, in place; nothing is returned. The op does no
  bounds check and skips no index: a slot outside ``[0, num_slots)`` (a
  negative one included) would be written into foreign memory, so it raises
  ``OutOfRangeRead`` here.
* **No attention.** The op computes nothing (no softmax scale, no LSE); the
  attention that reads these rows is the backend's own (Triton, SDPA).
"""

from __future__ import annotations

from typing import Any

import torch

from .glue import check_index_range

__all__ = ["EMULATIONS", "store_cache_cpu"]

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


EMULATIONS = {"torch.ops.sgl_kernel:store_cache_cpu": store_cache_cpu}
