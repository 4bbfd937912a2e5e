"""FlashInfer's paged GQA/MHA wrappers, emulated in float64: batch decode and batch prefill on a paged cache.

Read from flashinfer-python 0.7.2.post1 (``flashinfer/decode.py``
``BatchDecodeWithPagedKVCacheWrapper``, ``flashinfer/prefill.py``
``BatchPrefillWithPagedKVCacheWrapper``, ``flashinfer/utils.py``
``_unpack_paged_kv_cache`` / ``_check_cached_qkv_data_type``) and FlashInfer's
tests (``tests/attention/test_batch_decode_kernels.py``,
``test_batch_prefill_kernels.py``). The contract, all in one place:

Paging (both wrappers)

* ``plan(..., indptr [b+1], indices [indptr[-1]], last_page_len [b], num_qo_heads,
  num_kv_heads, head_dim, page_size, ...)``: request ``i`` owns pages
  ``indices[indptr[i]:indptr[i+1]]``; its KV length is ``(pages - 1) · page_size
  + last_page_len[i]`` (0 without pages). The CSR arrays are read at plan time,
  as the kernel's schedule is; with ``use_cuda_graph=True`` ``plan`` copies them
  into the constructor's buffers and ``run`` reads ``indices`` from there.
* ``paged_kv_cache``: a tuple ``(k, v)`` of ``[P, ps, Hk, D]`` (``NHD``) or
  ``[P, Hk, ps, D]`` (``HND``), or one ``[P, 2, ...]`` tensor; a 3-D ``k`` / 4-D
  single tensor means ``page_size = 1`` (``_expand_4d`` / ``_expand_5d``). Every
  page id a request uses must lie in ``[0, P)`` (else ``OutOfRangeRead``).
* GQA: ``num_qo_heads`` a multiple of ``num_kv_heads``; query head ``h`` reads
  KV head ``h // (num_qo_heads // num_kv_heads)``.

Scales and outputs (``run``; ``forward`` / ``forward_return_lse`` first store
their ``sm_scale`` / ``window_left`` / ``logits_soft_cap`` (and the prefill's
``causal``) on the wrapper, overriding the plan's, as the library does)

* scores ``sm_scale · q_scale · k_scale · (q · k)`` on the values as stored
  (an fp8 cache stays raw); ``sm_scale`` defaults to ``head_dim ** -0.5``;
  output ``softmax · v · v_scale``, in the plan's ``o_data_type`` (q's dtype).
* ``q.dtype`` / the cache dtype must be the plan's ``q_data_type`` /
  ``kv_data_type`` (``ValueError``, as ``_check_cached_qkv_data_type`` raises).
* LSE ``[rows, num_qo_heads]`` float32, **base 2** (FlashInfer's kernels keep the
  softmax in base 2; the cascade ``merge_state`` takes it so); a row that sees no
  key: ``out = 0``, ``lse = -inf``.

Decode: one query row per request (``q [b, Hq, D]``), no mask; ``q_len_per_req
> 1`` (tensor-core decode, causal bottom-right) is accepted when planned.

Prefill (append): ``qo_indptr [b+1]`` splits ``q [total_q, Hq, D]``;
``causal=True`` aligns query ``j`` of ``qo_len`` to KV position ``kv_len - qo_len
+ j`` (bottom-right); a ``custom_mask`` (bool, each request's ``[qo_len, kv_len]``
row-major, concatenated; True = attend) replaces the causal mask, as
``MaskMode.CUSTOM`` does whenever a mask was planned. ``packed_custom_mask``
(``segment_packbits``, little bit order) is unpacked the same way.

Not modelled (raise ``OutOfContractError``): RoPE in the kernel
(``pos_encoding_mode != "NONE"``), logits soft-cap, sliding windows,
``window_right``, sinks, skip-softmax, NVFP4 caches (``kv_cache_sf``),
multi-item scoring, the trtllm-gen / cute-dsl / cudnn / cutile backends of
these wrappers, ``block_tables`` / ``seq_lens`` plan forms.

``flashinfer.decode._grouped_size_compiled_for_decode_kernels`` (FlashInfer
≤ 0.1.6) is not in 0.7.2: the stand-in module does not have it either
(``NOT_IN_LIBRARY``), so an engine's ``from flashinfer.decode import ...``
probe fails with ``ImportError`` as it does against the real release.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .glue import OutOfContractError, as_float64, attend, bottom_right_visible, check_index_range, to_base2, write_out

__all__ = ["EMULATIONS", "NOT_IN_LIBRARY", "BatchDecodeWithPagedKVCacheWrapper",
           "BatchPrefillWithPagedKVCacheWrapper"]

#: Names an engine may probe for that flashinfer-python 0.7.2 does not define (module -> names).
NOT_IN_LIBRARY = {"flashinfer.decode": ("_grouped_size_compiled_for_decode_kernels",)}

_BACKENDS = ("auto", "fa2", "fa3")
_DTYPES = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "float32": torch.float32}


def _dtype(value: Any) -> torch.dtype:
    """``canonicalize_torch_dtype``: a dtype or its name."""
    if isinstance(value, torch.dtype):
        return value
    name = str(value).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"Unsupported data type {value!r}")
    return _DTYPES[name]


def _kv_lens(indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    ptr = indptr.to("cpu", torch.int64)
    last = last_page_len.to("cpu", torch.int64)
    pages = ptr[1:] - ptr[:-1]
    if pages.numel() != last.numel():
        raise ValueError(f"indptr describes {pages.numel()} requests, last_page_len has {last.numel()}")
    if bool((pages < 0).any()):
        raise ValueError("indptr must be nondecreasing")
    if bool(((pages > 0) & ((last < 1) | (last > page_size))).any()):
        raise OutOfContractError("last_page_len", f"{last.tolist()} outside [1, page_size={page_size}] for a "
                                                  "request with pages")
    return torch.where(pages > 0, (pages - 1) * page_size + last, 0)


def _unpack(paged_kv_cache: Any, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)`` as ``[P, ps, Hk, D]`` views (``_unpack_paged_kv_cache`` then NHD order)."""
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
        if k.dim() == 3:
            k, v = k.unsqueeze(-3 if layout == "NHD" else -2), v.unsqueeze(-3 if layout == "NHD" else -2)
        if k.dim() != 4 or v.dim() != 4:
            raise ValueError("x must be 3D or 4D")
    elif isinstance(paged_kv_cache, torch.Tensor):
        kv = paged_kv_cache
        if kv.dim() == 4:
            kv = kv.unsqueeze(-3 if layout == "NHD" else -2)
        if kv.dim() != 5:
            raise ValueError("x must be 4D or 5D")
        k, v = kv.unbind(dim=1)
    else:
        raise KeyError(f"Unrecognized paged_kv_cache type {type(paged_kv_cache)}, expect a single tensor or a "
                       "tuple of tensor.")
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k, v


def _unpack_mask(packed: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``segment_packbits(..., bitorder="little")`` undone: each segment is padded to whole bytes."""
    bits = ((packed.to("cpu", torch.int64)[:, None] >> torch.arange(8)) & 1).to(torch.bool).reshape(-1)
    out, byte = [], 0
    for n in sizes:
        out.append(bits[byte * 8: byte * 8 + n])
        byte += -(-n // 8)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def _refuse(**flags: Any) -> None:
    for flag, (value, default) in flags.items():
        if value != default:
            raise OutOfContractError(flag, f"{value!r} is not modelled")


class _PagedWrapper:
    """What the decode and prefill wrappers share: construction, paging, the float64 attention."""

    _name = ""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 backend: str = "auto", indices_buf: Optional[torch.Tensor] = None) -> None:
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        if backend not in _BACKENDS:
            raise OutOfContractError("backend", f"{backend!r}: only the FA2/FA3 paged kernels are modelled")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._backend = backend
        self._paged_kv_indices_buf = indices_buf
        self._plan: Optional[dict] = None
        self._sm_scale: Optional[float] = None
        self._window_left = -1
        self._logits_soft_cap: Optional[float] = None
        self._pos_encoding_mode = "NONE"
        self._causal = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _store_plan(self, qo_lens: torch.Tensor, indptr, indices, last_page_len, num_qo_heads: int,
                    num_kv_heads: int, head_dim: int, page_size: int, q_data_type, kv_data_type, o_data_type,
                    sm_scale, window_left: int, logits_soft_cap, pos_encoding_mode: str, mask=None) -> None:
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} must be a multiple of num_kv_heads {num_kv_heads}")
        q_dtype = _dtype(q_data_type)
        kv_dtype = _dtype(kv_data_type) if kv_data_type is not None else q_dtype
        lens = _kv_lens(indptr, last_page_len, int(page_size))
        if self._use_cuda_graph:  # plan copies the CSR arrays into the caller's buffers; run reads them
            buf = self._paged_kv_indices_buf
            if buf is None or len(indices) > len(buf):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            buf[: len(indices)].copy_(indices)
            indices_source = buf
        else:
            indices_source = indices
        self._plan = dict(qo_lens=qo_lens, indptr=indptr.to("cpu", torch.int64), kv_lens=lens,
                          indices=indices_source, hq=int(num_qo_heads), hk=int(num_kv_heads), d=int(head_dim),
                          page_size=int(page_size), q_dtype=q_dtype, kv_dtype=kv_dtype,
                          o_dtype=_dtype(o_data_type) if o_data_type is not None else q_dtype, mask=mask)
        self._sm_scale = sm_scale
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._pos_encoding_mode = pos_encoding_mode

    def _attend(self, q: torch.Tensor, paged_kv_cache: Any, *, causal: bool, q_scale, k_scale, v_scale,
                out, lse, return_lse: bool, window_left) -> Any:
        p = self._plan
        if p is None:
            raise RuntimeError(f"{self._name}.run() called before plan().")
        window = self._window_left if window_left is None else window_left
        if window != self._window_left:
            raise AssertionError("window_left must equal the value passed to plan()")
        _refuse(window_left=(window, -1), logits_soft_cap=(float(self._logits_soft_cap or 0.0), 0.0),
                pos_encoding_mode=(self._pos_encoding_mode, "NONE"))
        k_cache, v_cache = _unpack(paged_kv_cache, self._kv_layout)
        if q.dtype != p["q_dtype"]:
            raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {p['q_dtype']} specified "
                             "in plan function.")
        if k_cache.dtype != p["kv_dtype"]:
            raise ValueError(f"The dtype of k {k_cache.dtype} does not match the kv_data_type {p['kv_dtype']} "
                             "specified in plan function.")
        total_q, hq, d = q.shape
        page_size, hk = k_cache.shape[1], k_cache.shape[2]
        if page_size != p["page_size"]:
            raise OutOfContractError("page_size", f"the cache has pages of {page_size}, plan() was given "
                                                  f"{p['page_size']}")
        if hq != p["hq"] or hk != p["hk"] or d != p["d"] or k_cache.shape[-1] != d:
            raise ValueError(f"q {tuple(q.shape)} / cache {tuple(k_cache.shape)} ({self._kv_layout}) disagree with "
                             f"the plan (num_qo_heads {p['hq']}, num_kv_heads {p['hk']}, head_dim {p['d']})")
        qo_lens = p["qo_lens"]
        if int(qo_lens.sum()) != total_q:
            raise ValueError(f"the plan covers {int(qo_lens.sum())} query rows, q has {total_q}")
        sm_scale = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(d)
        for s in (q_scale, k_scale):
            sm_scale = sm_scale * (float(s) if s is not None else 1.0)
        group = hq // hk
        res = torch.zeros(total_q, hq, v_cache.shape[-1], dtype=torch.float64)
        lse_e = torch.full((total_q, hq), -math.inf, dtype=torch.float64)
        pages_all = p["indices"].to("cpu", torch.int64)
        row, mask_at = 0, 0
        for i in range(qo_lens.numel()):
            q_len, n = int(qo_lens[i]), int(p["kv_lens"][i])
            q0, row = row, row + q_len
            if p["mask"] is not None:
                visible = p["mask"][mask_at: mask_at + q_len * n].reshape(q_len, n)
                mask_at += q_len * n
            else:
                visible = bottom_right_visible(q_len, torch.arange(n), n, causal=causal)
            if q_len == 0 or n == 0:
                continue
            pages = pages_all[int(p["indptr"][i]): int(p["indptr"][i + 1])]
            check_index_range("paged_kv_indices", pages, k_cache.shape[0])
            dev = pages.to(k_cache.device)
            keys = as_float64(k_cache[dev].reshape(-1, hk, d)[:n]).repeat_interleave(group, dim=1)  # [n, Hq, D]
            vals = as_float64(v_cache[dev].reshape(-1, hk, v_cache.shape[-1])[:n]).repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,nhd->hqn", as_float64(q[q0:row]), keys) * sm_scale
            o, l = attend(scores, vals, visible)
            res[q0:row] = o * (float(v_scale) if v_scale is not None else 1.0)
            lse_e[q0:row] = l.T
        o = write_out(res, out, p["o_dtype"], q.device)
        if not return_lse:
            return o
        return o, write_out(to_base2(lse_e), lse, torch.float32, q.device)


class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapper):
    """``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (FA2 / tensor-core decode), in float64."""

    _name = "BatchDecodeWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
                 paged_kv_indices_buffer: Optional[torch.Tensor] = None,
                 paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None, backend: str = "auto",
                 jit_args=None) -> None:
        if jit_args is not None:
            raise OutOfContractError("jit_args", "custom JIT variants are not modelled")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, paged_kv_indices_buffer)
        self._use_tensor_cores = use_tensor_cores
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, *deprecated_positional_args: Any,
             **kwargs: Any) -> None:
        names = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type",
                 "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens",
                 "fixed_split_size", "disable_split_kv", "q_len_per_req")
        if len(deprecated_positional_args) > len(names):
            raise TypeError(f"{self._name}.plan() accepts at most {len(names)} deprecated optional positional "
                            f"arguments after page_size; got {len(deprecated_positional_args)}")
        for name, value in zip(names, deprecated_positional_args):
            if name in kwargs:
                raise TypeError(f"{self._name}.plan() got multiple values for argument {name!r}")
            kwargs[name] = value
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    begin_forward = plan

    def _plan_impl(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                   pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
                   logits_soft_cap=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
                   data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking: bool = True,
                   block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv: bool = False,
                   q_len_per_req: int = 1, is_causal=None) -> None:
        if window_right != 0:
            raise NotImplementedError("BatchDecodeWithPagedKVCacheWrapper only supports window_right != 0 with "
                                      "backend='cute-dsl'")
        for flag, value in (("block_tables", block_tables), ("seq_lens", seq_lens)):
            if value is not None:
                raise OutOfContractError(flag, "only the CSR (indptr / indices / last_page_len) plan is modelled")
        if q_len_per_req < 1:
            raise ValueError(f"q_len_per_req must be >= 1, got {q_len_per_req}")
        if is_causal is not None and is_causal != (q_len_per_req > 1):
            raise NotImplementedError(f"backend={self._backend!r} derives the decode mask from q_len_per_req; an "
                                      "explicit is_causal override is not supported")
        if q_len_per_req > 1 and not self._use_tensor_cores:
            raise ValueError("q_len_per_req > 1 requires tensor-core decode (use_tensor_cores=True or the "
                             "trtllm-gen/cute-dsl/cudnn backend).")
        if data_type is not None:
            q_data_type = q_data_type if q_data_type is not None else data_type
            kv_data_type = kv_data_type if kv_data_type is not None else data_type
        batch = len(last_page_len)
        self._q_len_per_req = q_len_per_req
        self._store_plan(torch.full((batch,), q_len_per_req, dtype=torch.int64), indptr, indices, last_page_len,
                         num_qo_heads, num_kv_heads, head_dim, page_size, q_data_type, kv_data_type, o_data_type,
                         sm_scale, window_left, logits_soft_cap, pos_encoding_mode)

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale=None, k_scale=None, v_scale=None,
            out=None, lse=None, return_lse: bool = False, enable_pdl=None, window_left=None, sinks=None,
            q_len_per_req=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """``out`` or ``(out, lse)``; see the module docstring for the contract."""
        for flag, value in (("args", args or None), ("sinks", sinks), ("kv_cache_sf", kv_cache_sf),
                            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor)):
            if value is not None:
                raise OutOfContractError(flag, "not modelled")
        planned = getattr(self, "_q_len_per_req", 1)
        if self._plan is not None and q.size(0) != self._plan["qo_lens"].numel() * planned:
            raise ValueError(f"q implies {q.size(0)} rows but plan() used {self._plan['qo_lens'].numel()} requests "
                             f"of {planned}; re-plan with the matching q_len_per_req.")
        return self._attend(q, paged_kv_cache, causal=planned > 1, q_scale=q_scale, k_scale=k_scale,
                            v_scale=v_scale, out=out, lse=lse, return_lse=return_lse, window_left=window_left)

    def run_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, **kwargs: Any):
        return self.run(q, paged_kv_cache, *args, **{**kwargs, "return_lse": True})

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, pos_encoding_mode: str = "NONE", q_scale=None,
                k_scale=None, v_scale=None, window_left: int = -1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None) -> torch.Tensor:
        self._pos_encoding_mode, self._window_left = pos_encoding_mode, window_left
        self._logits_soft_cap, self._sm_scale = logits_soft_cap, sm_scale
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, pos_encoding_mode: str = "NONE",
                           q_scale=None, k_scale=None, v_scale=None, window_left: int = -1, logits_soft_cap=None,
                           sm_scale=None, rope_scale=None, rope_theta=None):
        self._pos_encoding_mode, self._window_left = pos_encoding_mode, window_left
        self._logits_soft_cap, self._sm_scale = logits_soft_cap, sm_scale
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True)


class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapper):
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (FA2/FA3 append attention), in float64."""

    _name = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        if jit_args is not None or jit_kwargs is not None or variant_owns_mask:
            raise OutOfContractError("jit_args", "custom JIT variants are not modelled")
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, paged_kv_indices_buf)
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, sm_scale=None,
             window_left: int = -1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking: bool = True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None,
             disable_split_kv: bool = False, uniform_q_len=None) -> None:
        for flag, value in (("prefix_len_ptr", prefix_len_ptr), ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                            ("max_item_len_ptr", max_item_len_ptr), ("seq_lens", seq_lens),
                            ("seq_lens_q", seq_lens_q), ("block_tables", block_tables)):
            if value is not None:
                raise OutOfContractError(flag, "not modelled")
        _refuse(use_fp16_qk_reduction=(use_fp16_qk_reduction, False))
        if head_dim_vo is not None and head_dim_vo != head_dim_qk:
            raise OutOfContractError("head_dim_vo", f"{head_dim_vo} != head_dim_qk {head_dim_qk} is not modelled")
        qo = qo_indptr.to("cpu", torch.int64)
        qo_lens = qo[1:] - qo[:-1]
        if bool((qo_lens < 0).any()):
            raise ValueError("qo_indptr must be nondecreasing")
        kv_lens = _kv_lens(paged_kv_indptr, paged_kv_last_page_len, int(page_size))
        sizes = (qo_lens * kv_lens).tolist()
        if packed_custom_mask is not None:
            mask = _unpack_mask(packed_custom_mask, sizes)
        elif custom_mask is not None:
            mask = custom_mask.detach().to("cpu").reshape(-1).to(torch.bool)
            if mask.numel() < sum(sizes):
                raise OutOfContractError("custom_mask", f"{mask.numel()} entries for requests needing {sum(sizes)}")
        else:
            mask = None
        if mask is not None and self._use_cuda_graph and self._custom_mask_buf is None:
            raise ValueError("custom_mask_buf must be initialized with a torch.Tensor in cuda graph mode if we use "
                             "custom mask in attention computation.")
        self._store_plan(qo_lens, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                         num_kv_heads, head_dim_qk, page_size, q_data_type, kv_data_type, o_data_type, sm_scale,
                         window_left, logits_soft_cap, pos_encoding_mode, mask=mask)
        self._causal = causal

    begin_forward = plan

    def run(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, q_scale=None, k_scale=None, v_scale=None,
            out=None, lse=None, return_lse: bool = False, enable_pdl=None, window_left=None, sinks=None,
            kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, **kwargs: Any):
        """``out`` or ``(out, lse)``; see the module docstring for the contract."""
        for flag, value in (("args", args or None), ("sinks", sinks), ("kv_cache_sf", kv_cache_sf),
                            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
                            *((k, v) for k, v in kwargs.items())):
            if value is not None:
                raise OutOfContractError(flag, "not modelled")
        return self._attend(q, paged_kv_cache, causal=self._causal, q_scale=q_scale, k_scale=k_scale,
                            v_scale=v_scale, out=out, lse=lse, return_lse=return_lse, window_left=window_left)

    def run_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, **kwargs: Any):
        return self.run(q, paged_kv_cache, *args, **{**kwargs, "return_lse": True})

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale=None, v_scale=None, window_left: int = -1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None) -> torch.Tensor:
        _refuse(use_fp16_qk_reduction=(use_fp16_qk_reduction, False))
        self._causal, self._pos_encoding_mode, self._window_left = causal, pos_encoding_mode, window_left
        self._logits_soft_cap, self._sm_scale = logits_soft_cap, sm_scale
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False,
                           pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, k_scale=None,
                           v_scale=None, window_left: int = -1, logits_soft_cap=None, sm_scale=None,
                           rope_scale=None, rope_theta=None):
        _refuse(use_fp16_qk_reduction=(use_fp16_qk_reduction, False))
        self._causal, self._pos_encoding_mode, self._window_left = causal, pos_encoding_mode, window_left
        self._logits_soft_cap, self._sm_scale = logits_soft_cap, sm_scale
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)


#: The real callable each emulation stands in for ("module:qualname") -> the emulation.
EMULATIONS = {
    "flashinfer.decode:BatchDecodeWithPagedKVCacheWrapper": BatchDecodeWithPagedKVCacheWrapper,
    "flashinfer.prefill:BatchPrefillWithPagedKVCacheWrapper": BatchPrefillWithPagedKVCacheWrapper,
}
