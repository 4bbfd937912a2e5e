"""FlashAttention-4's CuTe interface (as SGLang 0.5.22/0.5.23 vendor it), in float64.

Emulated callable: ``sglang.kernels.ops.attention.flash_attn.cute:flash_attn_varlen_func``,
the vendored copy of flash-attention's ``flash_attn/cute/interface.py`` that
SGLang's ``fa4`` backend reaches through its wrapper module
``sglang.kernels.ops.attention.flash_attention_v4`` (which stays SGLang's code
and runs: MLA head padding, the ``flash_attn_with_kvcache`` shim). Written from
the interface's docstring and ``_flash_attn_fwd``'s host-side checks, which are
kept (an ``AssertionError`` with the library's message, as on a GPU before any
kernel launches). The contract, all in one place:

* Layouts [docstring]: ``q (total_q, H, d)`` with ``cu_seqlens_q`` or
  ``(b, s_q, H, d)``; a paged cache ``k (num_pages, page_size, H_k, d)``,
  ``v (…, dv)`` with ``page_table (b, max_pages)`` int32, contiguous, and no
  ``cu_seqlens_k``; an unpaged one ``(total_k, H_k, ·)`` with ``cu_seqlens_k``
  or ``(b, s_k, H_k, ·)``. ``seqused_k (b,)`` int32 bounds each request's keys
  (else the request's whole span: ``max_pages · page_size`` when paged).
  ``cu_seqlens_*`` / ``seqused_*`` are int32 and contiguous.
* Scores ``softmax_scale · (q·k + qv·v)`` ("O = softmax(scale · (Q @ K.T + Qv @
  V.T)) @ V, where Q = q_pe, Qv = q_nope, K = pe_cache, V = kv_cache"). When
  ``k is v`` (one tensor object) and ``dv == 512``, ``FlashAttnVarlenFunc``
  drops ``q`` and ``k`` (``qv = q if qv is None else qv``): the scores are
  ``scale · qv·v``. ``softmax_scale`` defaults to ``d ** -0.5`` when ``q`` or
  ``qv`` is missing, else ``(d + dv) ** -0.5`` (``d``: the first query's width).
* GQA: query head ``h`` reads KV head ``h // (H / H_k)``; ``H % H_k == 0`` is asserted.
* Causal is bottom-right aligned per request (the flash-attention convention:
  query ``i`` of ``s_q`` sees key ``j`` iff ``j <= i + s_k - s_q``);
  ``window_size = (left, right)``, ``None`` unbounded, resolved as
  ``_resolve_causal_local_window`` does (causal sets ``right = 0``; a window
  with ``left + right < 0`` is no window).
* LSE: **natural log** (``Softmax.finalize``: ``(row_max · scale_log2 + log2
  row_sum) · ln 2``), ``-inf`` and a zero output for a row that sees nothing,
  float32. Layout ``(H, total_q)`` / ``(b, H, s_q)`` — but **``(total_q, H)`` /
  ``(b, s_q, H)`` with ``qv``** ("num_head contiguous better for MQA in MLA
  absorbed"). Returned as ``(out, lse)``, ``lse`` None unless ``return_lse``.
* Output dtype: bf16 when ``v`` is fp8, else the query's; written into ``out``
  when given (its shape and dtype checked as the interface does).
* fp8 (``v`` float8_e4m3fn / e5m2): q, k, v of one dtype, values ``x ·
  descale`` with ``q_descale``, ``k_descale``, ``v_descale`` of shape
  ``(b, H_k)`` float32 (1 when missing); descales with non-fp8 inputs are
  asserted away. Only on SM100: "FP8 is only supported on SM100 (compute
  capability 10.x) for FA4 CuTe."
* The arch is the interface's ``_get_device_arch``: ``FLASH_ATTENTION_ARCH`` if
  set, else ``torch.cuda.get_device_capability()`` (the cell's stated GPU).
  Asserted: a compute capability of 8.x-11.x; head dims per arch
  (``_validate_head_dims``: SM90 8..256 or both 512; SM100/110 8..128, (192,
  128), (64 or dv, 512), (256, 256); divisible by ``16 / element size``); with
  ``qv``: Blackwell only, ``dv == 512``, ``d == 64`` (when ``q`` is given), no
  window, no descales, no sink, softcap, score_mod or mask_mod.
* ``num_splits``, ``pack_gqa``, ``deterministic``, ``max_seqlen_*``,
  ``min_seqlen_k`` only schedule the work and are not checked. A zero-length
  problem (no keys or no queries) gives zeros and ``-inf``.
* Not modelled (raise ``OutOfContractError`` naming the flag): learnable sinks,
  softcap, score_mod / mask_mod, block sparsity, aux tensors and scalars,
  ``gather_kv_indices`` (top-k sparse MLA), relative bias, MXFP8 block scales
  (``sfq`` / ``sfk`` / ``sfv``), ``seqused_q``, the SM120 forward-host bridge.
* Out-of-range page ids raise (a GPU would read another request's rows).

PYTEST_DONT_REWRITE: its ``assert`` statements raise as plain Python's do, so a message
that reaches a report never changes with pytest's ``-v`` or ``$CI``.
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

import torch

from .flash_attn import _attend_request
from .glue import OutOfContractError, gather_pages, write_out

__all__ = ["EMULATIONS", "flash_attn_varlen_func"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _device_arch() -> int:
    """``_get_device_arch``: ``FLASH_ATTENTION_ARCH`` ('sm_80', '90a', '100'), else the device's capability."""
    override = os.environ.get("FLASH_ATTENTION_ARCH")
    if override is not None:
        match = re.match(r"^(?:sm_?|SM_?)?(\d+)(\d)([af]?)$", override)
        if not match:
            raise ValueError(f"Invalid arch format: {override}")
        return int(match.group(1)) * 10 + int(match.group(2))
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + int(minor)


def _validate_head_dims(head_dim: int, head_dim_v: int, major: int, alignment: int) -> None:
    deepseek = head_dim == 192 and head_dim_v == 128
    mla_absorbed = (head_dim == 64 or head_dim == head_dim_v) and head_dim_v == 512
    hd256 = head_dim == 256 and head_dim_v == 256
    standard = 8 <= head_dim <= 128 and 8 <= head_dim_v <= 128
    sm90_range = (8 <= head_dim <= 256 and 8 <= head_dim_v <= 256) or head_dim == head_dim_v == 512
    aligned = head_dim % alignment == 0 and head_dim_v % alignment == 0
    if major == 9:
        assert sm90_range and aligned, (
            f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM90. head_dim and head_dim_v "
            f"must be between 8 and 256 and divisible by {alignment}, or both equal to 512.")
    elif major in (10, 11):
        assert (standard or deepseek or mla_absorbed or hd256) and aligned, (
            f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM100/SM110. head_dim and "
            f"head_dim_v must be between 8 and 128 and divisible by {alignment}, or (192, 128) for DeepSeek, or "
            "(256, 256) for hd256.")


def _resolve_window(causal: bool, left: Optional[int], right: Optional[int]) -> tuple[bool, bool, int, int]:
    """``_resolve_causal_local_window`` (no mask_mod): ``(causal, local, left, right)``, -1 for unbounded."""
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left = right = None
    local = False
    if left is not None or right is not None:
        if left is None and right == 0:
            causal, right = True, None
        else:
            causal, local = False, True
    return causal, local, -1 if left is None else int(left), -1 if right is None else int(right)


def _int32(t: Optional[torch.Tensor]) -> None:
    if t is not None:
        assert t.dtype == torch.int32, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be int32"
        assert t.stride(0) == 1, "cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k must be contiguous"


def flash_attn_varlen_func(
    q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
    min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None, page_table=None,
    softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
    pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
    block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, q_descale=None, k_descale=None, v_descale=None,
    rel_bias=None, sfq=None, sfk=None, sfv=None, qk_sf_vec_size=None, v_sf_vec_size=None, rel_bias_prep_cache=None,
    return_lse=False, out=None,
):
    """FA4 CuTe ``flash_attn_varlen_func``: ``(out, lse)`` (``lse`` None unless ``return_lse``)."""
    for flag, value in (("learnable_sink", learnable_sink), ("score_mod", score_mod), ("mask_mod", mask_mod),
                        ("block_sparse_tensors", block_sparse_tensors), ("aux_tensors", aux_tensors),
                        ("aux_scalars", aux_scalars), ("gather_kv_indices", gather_kv_indices),
                        ("rel_bias", rel_bias), ("sfq", sfq), ("sfk", sfk), ("sfv", sfv), ("seqused_q", seqused_q)):
        if value is not None:
            raise OutOfContractError(flag, "not modelled")
    if softcap not in (None, 0.0):
        raise OutOfContractError("softcap", f"{softcap}: soft-capping is not modelled")
    if out is not None and out.stride(-1) != 1:
        raise ValueError("out must have stride 1 in the last dimension")
    if k is not None and k is v and v.shape[-1] == 512:  # FlashAttnVarlenFunc.forward: the MLA formula, q and k dropped
        qv = q if qv is None else qv
        q = k = None
    assert q is not None or qv is not None
    assert v is not None
    arch = _device_arch()
    assert arch // 10 in (8, 9, 10, 11), ("Unsupported compute capability. Supported: 8.x, 9.x, 10.x, 11.x, and "
                                          "architectures registered through the forward-host bridge")
    first = q if q is not None else qv
    num_head, head_dim = first.shape[-2:]
    if cu_seqlens_q is None:
        batch, seqlen_q = first.shape[:2]
    else:
        batch, seqlen_q = cu_seqlens_q.shape[0] - 1, None
    if page_table is not None:
        assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
        assert page_table.dtype == torch.int32, "page_table must be int32"
        assert page_table.stride(-1) == 1, "page_table must be contiguous in the last dimension"
        assert page_table.shape == (batch, page_table.shape[1])
        num_pages, page_size = v.shape[:2]
    num_head_kv, head_dim_v = v.shape[-2], v.shape[-1]
    if page_table is not None:
        assert k is None or k.shape == (num_pages, page_size, num_head_kv, head_dim)
        assert v.shape == (num_pages, page_size, num_head_kv, head_dim_v)
    elif cu_seqlens_k is None:
        assert k is None or k.shape == (batch, v.shape[1], num_head_kv, head_dim)
        assert v.shape == (batch, v.shape[1], num_head_kv, head_dim_v)
    else:
        assert k is None or k.shape == (v.shape[0], num_head_kv, head_dim)
        assert cu_seqlens_k.shape == (batch + 1,), "cu_seqlens_k must have shape (batch_size + 1,)"
    if cu_seqlens_q is not None:
        assert cu_seqlens_q.shape == (batch + 1,), "cu_seqlens_q must have shape (batch_size + 1,)"
    assert seqused_k is None or seqused_k.shape == (batch,), "seqused_k must have shape (batch_size,)"
    assert v.dtype in (torch.float16, torch.bfloat16, *_FP8), \
        "inputs must be float16, bfloat16, fp8 e4m3fn, or fp8 e5m2"
    present = [(name, t) for name, t in (("q", q), ("k", k), ("v", v), ("qv", qv)) if t is not None]
    for i, (a, ta) in enumerate(present):
        for b, tb in present[i + 1:]:
            assert ta.dtype == tb.dtype, f"{a}.dtype {ta.dtype} != {b}.dtype {tb.dtype}"
    for t in (cu_seqlens_q, cu_seqlens_k, seqused_k):
        _int32(t)
    assert num_head % num_head_kv == 0, "num_head must be divisible by num_head_kv"
    if arch // 10 != 8:
        _validate_head_dims(head_dim, head_dim_v, arch // 10, 16 // v.element_size())
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim if qv is None or q is None else head_dim + head_dim_v)
    is_fp8 = v.dtype in _FP8
    out_dtype = torch.bfloat16 if is_fp8 else first.dtype
    if is_fp8:
        for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if t is not None:
                assert tuple(t.shape) == (batch, num_head_kv) and t.dtype == torch.float32, \
                    f"{name} must have shape {(batch, num_head_kv)} and dtype float32"
        assert arch // 10 == 10, "FP8 is only supported on SM100 (compute capability 10.x) for FA4 CuTe."
    else:
        assert q_descale is None and k_descale is None and v_descale is None, \
            "q_descale/k_descale/v_descale are only supported for FP8 inputs"
    causal, local, left, right = _resolve_window(bool(causal), *window_size)
    if qv is not None:
        assert arch // 10 in (10, 11), "only support Blackwell arch with qv"
        assert q is None or qv.shape[:-1] == q.shape[:-1]
        assert qv.shape[-1] == head_dim_v
        assert head_dim_v == 512
        assert q is None or head_dim == 64
        assert not local, "local not yet supported with qv"
        assert q_descale is None and k_descale is None and v_descale is None, \
            "q_descale/k_descale/v_descale are not yet supported with qv"

    rows_q = first if cu_seqlens_q is not None else first.reshape(-1, *first.shape[2:])
    rows_qv = None
    if q is not None and qv is not None:
        rows_qv = qv if cu_seqlens_q is not None else qv.reshape(-1, *qv.shape[2:])
    if cu_seqlens_q is not None:
        cu = cu_seqlens_q.to("cpu", torch.int64)
        segments = [(int(cu[i]), int(cu[i + 1] - cu[i])) for i in range(batch)]
    else:
        segments = [(i * seqlen_q, seqlen_q) for i in range(batch)]
    if seqused_k is not None:
        lens = [int(n) for n in seqused_k.to("cpu", torch.int64)]
    elif cu_seqlens_k is not None:
        cuk = cu_seqlens_k.to("cpu", torch.int64)
        lens = [int(cuk[i + 1] - cuk[i]) for i in range(batch)]
    else:
        lens = [page_table.shape[1] * page_size if page_table is not None else v.shape[1]] * batch
    total = rows_q.shape[0]
    res = torch.zeros(total, num_head, head_dim_v, dtype=torch.float64)
    lse = torch.full((num_head, total), -math.inf, dtype=torch.float64)
    keys = v if q is None else k  # with q dropped the scores are qv·v: v plays the key
    for i, (r0, sq) in enumerate(segments):
        n = lens[i]
        if sq == 0 or n == 0:
            continue
        if page_table is not None:
            kk = gather_pages(keys, page_table[i], n, flag="page_table")
            vv = kk if keys is v else gather_pages(v, page_table[i], n, flag="page_table")
        elif cu_seqlens_k is not None:
            k0 = int(cuk[i])
            kk, vv = keys[k0:k0 + n], v[k0:k0 + n]
        else:
            kk, vv = keys[i, :n], v[i, :n]
        o, l = _attend_request(rows_q[r0:r0 + sq], rows_qv[r0:r0 + sq] if rows_qv is not None else None, kk, vv,
                               seqlen_k=n, key_pos=torch.arange(n), causal=causal, window=(left, right),
                               scale=float(softmax_scale), descales=(q_descale, k_descale, v_descale), i=i)
        res[r0:r0 + sq] = o
        lse[:, r0:r0 + sq] = l
    if cu_seqlens_q is None:
        res = res.reshape(batch, seqlen_q, num_head, head_dim_v)
        lse = lse.reshape(num_head, batch, seqlen_q).permute(1, 0, 2)  # (b, H, s_q)
        if qv is not None:
            lse = lse.transpose(1, 2)  # (b, s_q, H)
    elif qv is not None:
        lse = lse.transpose(0, 1)  # (total_q, H)
    o = write_out(res, out, out_dtype, first.device)
    return o, (lse.contiguous().to(torch.float32).to(first.device) if return_lse else None)


EMULATIONS = {"sglang.kernels.ops.attention.flash_attn.cute:flash_attn_varlen_func": flash_attn_varlen_func}
