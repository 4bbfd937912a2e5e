"""SGLang's own JIT CUDA kernels that its CUDA attention backends call, emulated in torch (they compute no attention).

The contract comes from the kernels' CUDA files and docstrings in the SGLang release
(``sglang/kernels/jit/csrc/attention/fixup_zero_kv.cuh`` and
``sglang/kernels/ops/attention/fixup_zero_kv.py``, 0.5.23). The innermost
compiled call is the JIT module the Python wrapper loads
(``_jit_fixup_module(dtype)``, built with ``load_jit`` on first use), so that
loader is what is replaced; SGLang's wrapper around it runs as shipped.

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
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .glue import OutOfContractError, check_dtype

__all__ = ["EMULATIONS", "jit_fixup_module"]


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


EMULATIONS = {
    "sglang.kernels.ops.attention.fixup_zero_kv:_jit_fixup_module": jit_fixup_module,
}
