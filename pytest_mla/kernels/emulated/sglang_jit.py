"""SGLang's own JIT CUDA kernels that its CUDA attention backends call, emulated in torch (they compute no attention).

The contract comes from the kernels' CUDA files and docstrings in the SGLang release
(``sglang/kernels/jit/csrc/attention/fixup_zero_kv.cuh`` and
``sglang/kernels/ops/attention/fixup_zero_kv.py``, 0.5.23;
``sglang/kernels/jit/csrc/attention/fused_fp8_qkv_kv_cache.cuh`` and
``sglang/kernels/ops/kvcache/fused_fp8_qkv_kv_cache.py``, identical in 0.5.22
and 0.5.23). The innermost compiled call is the JIT module the Python wrapper
loads (``_jit_fixup_module(dtype)``, ``_jit_fused_fp8_qkv_kv_cache_module(dtype,
use_pdl)``, built with ``load_jit`` on first use), so that loader is what is
replaced; SGLang's wrapper around it runs as shipped.

``fixup_zero_kv_rows(out, lse, kv_lens, cum_seq_lens, max_seq_len)``
(``fixup_zero_kv_rows_kernel``):

* shapes and dtypes the host launcher verifies: ``out [total_tokens, H, D]``
  bf16/fp16, ``lse [total_tokens, H]`` fp32, ``kv_lens [B]`` and
  ``cum_seq_lens [B + 1]`` int32 — anything else raises ``OutOfContractError``;
* for every sequence ``i`` with ``kv_lens[i] <= 0`` (the kernel returns early
  only for ``> 0``), token rows ``cum_seq_lens[i] + j`` for
  ``j < min(cum_seq_lens[i+1] - cum_seq_lens[i], max_seq_len)`` (one block per
  token, ``max_seq_len`` blocks per sequence) get ``out = 0`` and
  ``lse = -inf``; nothing else is written.

``fused_fp8_qkv_kv_cache(q, k, v, q_out, k_cache, v_cache, cache_loc, k_scale, v_scale)``
(``FusedFp8QkvKvCache<T, use_pdl>::run``):

* the host launcher's ``TensorMatcher`` checks: ``k`` / ``v`` ``[N, D]`` in the
  module's dtype (bf16/fp16) with unit inner stride, ``k_cache`` / ``v_cache``
  ``[S, D]`` ``float8_e4m3fn`` with unit inner stride, ``cache_loc [N]`` int32
  or int64, ``k_scale`` / ``v_scale`` ``[1]`` float32, ``q`` / ``q_out`` both
  given or both omitted (``q [N, Dq]`` in the module's dtype, ``q_out`` e4m3),
  ``N > 0`` — anything else raises ``OutOfContractError``;
* token ``t`` writes ``k_cache[cache_loc[t]] = e4m3(k[t] / k_scale)`` and
  ``v_cache[cache_loc[t]] = e4m3(v[t] / v_scale)`` (``static_cast<fp8_e4m3_t>``
  of ``x * (1 / scale)``: round to nearest, saturated to ±448, CUDA's
  ``__NV_SATFINITE``), and ``q_out[t] = e4m3(q[t])`` (no scale);
* a ``cache_loc`` outside ``[0, S)`` raises ``OutOfRangeRead`` (its message says
  write): the kernel would write past the cache, into foreign memory.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .glue import OutOfContractError, check_dtype, check_index_range

__all__ = ["EMULATIONS", "jit_fixup_module", "jit_fused_fp8_qkv_kv_cache_module"]


class _FixupModule:
    """The loaded JIT module: one entry point, ``fixup_zero_kv_rows``."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def fixup_zero_kv_rows(self, out: torch.Tensor, lse: torch.Tensor, kv_lens: torch.Tensor,
                           cum_seq_lens: torch.Tensor, max_seq_len: int) -> None:
        check_dtype("fixup_zero_kv_rows.out", out, (self.dtype,))
        check_dtype("fixup_zero_kv_rows.lse", lse, (torch.float32,))
        check_dtype("fixup_zero_kv_rows.kv_lens", kv_lens, (torch.int32,))
        check_dtype("fixup_zero_kv_rows.cum_seq_lens", cum_seq_lens, (torch.int32,))
        if out.dim() != 3 or lse.shape != out.shape[:2] or cum_seq_lens.shape[0] != kv_lens.shape[0] + 1:
            raise OutOfContractError("fixup_zero_kv_rows.shapes", f"out {list(out.shape)}, lse {list(lse.shape)}, "
                                     f"kv_lens {list(kv_lens.shape)}, cum_seq_lens {list(cum_seq_lens.shape)}")
        for i, n in enumerate(kv_lens.tolist()):
            if n > 0:
                continue
            start, end = int(cum_seq_lens[i]), int(cum_seq_lens[i + 1])
            end = min(end, start + int(max_seq_len))
            if end > start:
                out[start:end] = 0
                lse[start:end] = -math.inf


def jit_fixup_module(dtype: torch.dtype) -> Any:
    """``sglang.kernels.ops.attention.fixup_zero_kv._jit_fixup_module``: the JIT module, emulated."""
    if dtype not in (torch.bfloat16, torch.float16):
        raise OutOfContractError("fixup_zero_kv.dtype", f"the JIT kernel is built for bf16/fp16 only, not {dtype}")
    return _FixupModule(dtype)


_E4M3_MAX = 448.0


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """``static_cast<__nv_fp8_e4m3>(float)``: round to nearest even, saturated to the finite range."""
    return x.to(torch.float32).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn)


class _FusedFp8Module:
    """The loaded JIT module: one entry point, ``fused_fp8_qkv_kv_cache``."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def fused_fp8_qkv_kv_cache(self, q: Any, k: torch.Tensor, v: torch.Tensor, q_out: Any, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, cache_loc: torch.Tensor, k_scale: torch.Tensor,
                               v_scale: torch.Tensor) -> None:
        if (q is None) != (q_out is None):
            raise OutOfContractError("fused_fp8_qkv_kv_cache.q", "q and q_out must both be given or both omitted")
        for name, t in (("k", k), ("v", v)):
            check_dtype(f"fused_fp8_qkv_kv_cache.{name}", t, (self.dtype,))
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            check_dtype(f"fused_fp8_qkv_kv_cache.{name}", t, (torch.float8_e4m3fn,))
        check_dtype("fused_fp8_qkv_kv_cache.cache_loc", cache_loc, (torch.int32, torch.int64))
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            check_dtype(f"fused_fp8_qkv_kv_cache.{name}", t, (torch.float32,))
            if tuple(t.shape) != (1,):
                raise OutOfContractError(f"fused_fp8_qkv_kv_cache.{name}", f"shape {list(t.shape)}, expects [1]")
        tensors = [k, v, k_cache, v_cache] + ([q] if q is not None else [])
        n = k.shape[0]
        if (any(t.dim() != 2 or t.stride(-1) != 1 for t in tensors) or v.shape != k.shape
                or k_cache.shape[1:] != k.shape[1:] or v_cache.shape != k_cache.shape
                or cache_loc.shape != (n,) or n == 0 or (q is not None and (q.shape[0] != n or q_out.shape != q.shape))):
            raise OutOfContractError("fused_fp8_qkv_kv_cache.shapes",
                                     f"k {list(k.shape)}, v {list(v.shape)}, k_cache {list(k_cache.shape)}, "
                                     f"v_cache {list(v_cache.shape)}, cache_loc {list(cache_loc.shape)}")
        if q is not None:
            check_dtype("fused_fp8_qkv_kv_cache.q", q, (self.dtype,))
            check_dtype("fused_fp8_qkv_kv_cache.q_out", q_out, (torch.float8_e4m3fn,))
            q_out.copy_(_e4m3(q))
        check_index_range("fused_fp8_qkv_kv_cache.cache_loc", cache_loc, k_cache.shape[0], access="write")
        slots = cache_loc.to(k_cache.device, torch.int64)
        k_cache[slots] = _e4m3(k.float() * (1.0 / k_scale.float().to(k.device)))
        v_cache[slots] = _e4m3(v.float() * (1.0 / v_scale.float().to(v.device)))


def jit_fused_fp8_qkv_kv_cache_module(dtype: torch.dtype, use_pdl: bool) -> Any:
    """``sglang.kernels.ops.kvcache.fused_fp8_qkv_kv_cache._jit_fused_fp8_qkv_kv_cache_module``, emulated."""
    if dtype not in (torch.bfloat16, torch.float16):
        raise OutOfContractError("fused_fp8_qkv_kv_cache.dtype", f"the JIT kernel is built for bf16/fp16, not {dtype}")
    return _FusedFp8Module(dtype)


EMULATIONS = {
    "sglang.kernels.ops.attention.fixup_zero_kv:_jit_fixup_module": jit_fixup_module,
    "sglang.kernels.ops.kvcache.fused_fp8_qkv_kv_cache:_jit_fused_fp8_qkv_kv_cache_module":
        jit_fused_fp8_qkv_kv_cache_module,
}
