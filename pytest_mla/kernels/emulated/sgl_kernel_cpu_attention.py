"""sgl-kernel's CPU attention ops (``decode_attention_cpu``, ``extend_attention_cpu``), emulated in float64.

SGLang's ``intel_amx`` backend (``IntelAMXAttnBackend``) decodes with
``torch.ops.sgl_kernel.decode_attention_cpu`` and extends (prefill, target
verify) with ``torch.ops.sgl_kernel.extend_attention_cpu``: ops of sgl-kernel's
CPU build, which this host does not have. Emulated callables:
``torch.ops.sgl_kernel:decode_attention_cpu``,
``torch.ops.sgl_kernel:extend_attention_cpu``.

Read from sgl-kernel's ``csrc/cpu/decode.cpp`` (``decode_attention_cpu``,
``decode_set_kv_buffer``, ``decode_attention_kernel_impl`` / ``_mla_`` /
``_grouped_``, ``decode_accumulate_kv_splits``) and ``csrc/cpu/extend.cpp``
(``extend_attention_cpu``, ``extend_attention_kernel_impl``), and
``common.h``'s check macros; and SGLang's tests of the ops
(``test/srt/cpu/test_decode.py``: SDPA over ``req_to_token[req, :seq_len]``
after ``k_buffer[loc] = key``, head sizes such as 33 / 55, head-strided
buffers; ``test_extend.py``: SDPA, causal over the prefix-padded query, an
MLA cache of one head with an empty prefix). **The source read is older than the build SGLang
0.5.23 calls**: its ops take per-token fp8 scale tensors
``k_buf_scale`` / ``v_buf_scale`` and end at ``encoder_lens``; SGLang passes
float ``key_scale`` / ``value_scale`` and further ``sliding_window_size``,
``sinks`` (both ops) and ``tree_mask``, ``is_causal`` (extend). The signatures
below are SGLang's calls; every argument the source read has no counterpart for
is modelled only at the value that leaves the source's computation unchanged,
and refused (``OutOfContractError``) otherwise. The contract:

* **decode arguments** (SGLang's positional order): ``query [num_seqs, H, D]``,
  ``k_buffer [slots, H_kv, D]``, ``v_buffer [slots, H_kv, Dv]``, ``key_scale``,
  ``value_scale`` (floats), ``output [num_seqs, H, Dv]``, ``key [num_seqs,
  H_kv, D]`` / ``value [num_seqs, H_kv, Dv]`` (or both None), ``loc
  [num_seqs]`` int64, ``attn_logits [num_seqs, H, splits, Dv + 1]`` float32,
  ``req_to_token [max_reqs, max_context_len]`` int32 / int64,
  ``req_pool_indices`` and ``seq_lens`` ``[num_seqs]`` int64, ``sm_scale``,
  ``logit_cap``, ``is_cross_attn``, ``sliding_window_size``, ``encoder_lens``,
  ``sinks``. ``query``, ``k_buffer``, ``v_buffer`` 3-D with a contiguous last
  dim, ``loc`` 1-D; ``attn_logits`` sized as above and float32; the index
  dtypes as stated; ``loc.numel() == num_seqs`` and ``value`` given with
  ``key``: each a ``RuntimeError`` as the op's ``TORCH_CHECK`` / ``CHECK_*``.
  ``query`` bf16 or fp16 (``AT_DISPATCH_REDUCED_FLOATING_TYPES``: another dtype
  is a ``RuntimeError``); the cache of ``query``'s dtype (an fp8 cache:
  ``OutOfContractError``).
* **decode modes** (the op's own test): MHA when ``H == H_kv``; **MLA** when
  ``k_buffer`` and ``v_buffer`` share their data pointer, ``H_kv == 1`` and
  ``D == Dv + 64`` (``v_buffer`` is the first ``Dv`` columns of ``k_buffer``;
  MLA requires ``key`` and ``value``); otherwise grouped (GQA), query head
  ``h`` reading KV head ``h // (H / H_kv)``.
* **decode's KV write** (``decode_set_kv_buffer``), before any read, when
  ``key`` is given: ``k_buffer[loc[b], :, :D] = key[b]``, and (not MLA)
  ``v_buffer[loc[b], :, :Dv] = value[b]``; under MLA ``value`` is ignored (it
  shares ``key``'s storage). Rows are copied as they are: no scale. ``loc`` is
  not bounds-checked by the op: a slot outside ``[0, slots)`` raises
  ``OutOfRangeRead`` here before anything is written.
* **decode's attention.** Sequence ``b`` reads its ``L = seq_lens[b]`` tokens
  at slots ``req_to_token[req_pool_indices[b], :L]`` (all visible: the new
  token is the last). Scores ``s = sm_scale · q·k``; ``logit_cap > 0`` caps
  them, ``cap · tanh(s / cap)``, after the scale. The op checks ``L <=
  max_context_len`` ("seq_len_kv out of scope!"), ``req_pool_indices[b] <
  max_reqs`` ("req_pool_id out of scope!") and each slot ``< slots`` ("token
  index out of scope!"), each a ``RuntimeError``; a negative pool index or slot
  is not checked (it reads foreign memory): ``OutOfRangeRead``. ``L == 0`` is
  refused (the op's split merge computes ``exp(-inf - -inf)``).
* **attn_logits** (scratch SGLang never reads, written as the op writes it):
  the ``L`` tokens fall into ``splits = attn_logits.size(2)`` splits of
  ``ceil(L / splits)`` tokens each; ``attn_logits[b, h, k, :Dv]`` is split
  ``k``'s softmax-normalised output and ``[..., Dv]`` its natural-log LSE
  (``0`` and ``-inf`` for an empty split); then the merge overwrites split 0's
  ``[:Dv]`` with ``Σ_k out_k · exp(lse_k - max lse)``, and
  ``output[b, h] = that / Σ_k exp(lse_k - max lse)``, in ``query``'s dtype.
  No LSE is returned.
* **extend arguments** (SGLang's order): ``q_extend [N, H, D]``, ``k_extend
  [N, H_kv, D]``, ``v_extend [N, H_kv, Dv]`` (required unless cross
  attention), ``o_extend [N, H, Dv]`` (contiguous), ``k_buffer``,
  ``v_buffer``, ``key_scale``, ``value_scale``, ``req_to_token``,
  ``req_pool_indices``, ``seq_lens`` (int64), ``extend_seq_lens``,
  ``extend_start_loc`` (``[num_seqs]``, ``req_to_token``'s dtype),
  ``max_len_extend``, ``sm_scale``, ``logit_cap``, ``is_cross_attn``,
  ``sliding_window_size``, ``encoder_lens``, ``sinks``, ``tree_mask``,
  ``is_causal``. ``D`` and ``Dv`` multiples of 32, ``H`` a multiple of
  ``H_kv``, the sizes and dtypes above: ``RuntimeError`` as the op's checks.
* **extend's attention.** Sequence ``b`` has ``E = extend_seq_lens[b]``
  queries at rows ``extend_start_loc[b] + i`` of ``q_extend`` and a prefix of
  ``P = seq_lens[b] - E`` tokens (``P < 0``: "prefix len < 0!"). Query ``i``
  sees every prefix token (read from the cache at ``req_to_token[req, :P]``)
  and the extend tokens ``j <= i`` (read from ``k_extend`` / ``v_extend`` rows
  ``extend_start_loc[b] + j``, **not** from the cache): causal, aligned
  bottom-right. Scores ``sm_scale · q·k``; the source read takes no
  ``logit_cap`` in its kernel (a nonzero one is refused here: what SGLang's
  build does with it is not known). The op never writes the cache.
  **MLA prefill**: when ``k_buffer.size(1) != H_kv`` (DeepSeek's
  non-absorbed prefill: ``k_extend`` has ``H`` heads, the cache one latent
  head) the prefix is skipped and must be empty (``RuntimeError`` "extend
  attention: expect seq_len_prefix to be 0, got P").
* **extend's row blocks.** The op computes query rows in blocks of
  ``BLOCK_M`` (32 for ``max_len_extend <= 256``, 128 up to 1024, 256 up to
  4096, else 512) over ``ceil(max_len_extend / BLOCK_M)`` blocks: a sequence
  with more than that many rows leaves the rest of ``o_extend`` unwritten, as
  here.
* **Not modelled** (``OutOfContractError``): fp8 caches (the read source's
  per-token scale tensors differ from SGLang's float scales), a
  ``key_scale`` / ``value_scale`` other than 1.0, ``sliding_window_size > 0``
  (SGLang passes ``window + 1``, 0 for no window), ``sinks``, ``tree_mask``,
  ``is_causal=False``, cross attention and ``encoder_lens``, a
  ``k_buffer`` head size other than ``D`` (``Dv`` for ``v_buffer``), a
  shape of ``output`` / ``o_extend`` other than the op's.
* Index rows the op would follow outside their tensor (a pool row past
  ``max_context_len``, an extend row past ``q_extend`` / ``k_extend``, a prefix
  slot outside the cache): ``OutOfRangeRead``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .glue import OutOfContractError, OutOfRangeRead, check_index_range

__all__ = ["EMULATIONS", "decode_attention_cpu", "extend_attention_cpu"]

_REDUCED = (torch.bfloat16, torch.float16)
_ATEN_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.int8: "Char", torch.uint8: "Byte"}


def _last_dim_contiguous(name: str, x: torch.Tensor) -> None:
    if x.stride(-1) != 1:
        raise RuntimeError(f"{name}must be contiguous at last dimension")


def _dim(d: int, name: str, x: torch.Tensor) -> None:
    if x.dim() != d:
        raise RuntimeError(f"{name} must be a {d}D tensor")


def _check_eq(what: str, a: int, b: int) -> None:
    if a != b:
        raise RuntimeError(f"Expected {what} ({a} vs. {b})")


def _dispatch_dtype(op: str, x: torch.Tensor) -> None:
    if x.dtype not in _REDUCED:
        raise RuntimeError(f"\"{op}\" not implemented for '{_ATEN_NAMES.get(x.dtype, str(x.dtype))}'")


def _index_dtypes(op: str, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
    if req_to_token.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{op}: expect req_to_token to be int32 or int64, got {req_to_token.dtype}")
    if seq_lens.dtype != torch.int64:
        raise RuntimeError(f"{op}: expect req_lens to be int64, got {seq_lens.dtype}")
    if req_pool_indices.dtype != torch.int64:
        raise RuntimeError(f"{op}: expect req_pool_indices to be int64, got {req_pool_indices.dtype}")


def _not_modelled(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: Any,
                  value_scale: Any, is_cross_attn: bool, sliding_window_size: Any, encoder_lens: Any,
                  sinks: Any) -> None:
    """The arguments of SGLang's calls that the source read has no counterpart for, or a case it does not cover."""
    for name, buf in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if buf.dtype != query.dtype:
            raise OutOfContractError("kv_cache_dtype", f"{name} {str(buf.dtype).removeprefix('torch.')} with a "
                                     f"{str(query.dtype).removeprefix('torch.')} query: fp8 caches are not modelled "
                                     "(the source read scales per token by tensors, SGLang passes float scales)")
    for name, scale in (("key_scale", key_scale), ("value_scale", value_scale)):
        if scale is not None and float(scale) != 1.0:
            raise OutOfContractError(name, f"{float(scale)!r}: a KV scale other than 1.0 is not modelled (the "
                                           "source read has per-token fp8 scale tensors only)")
    if sliding_window_size is not None and int(sliding_window_size) > 0:
        raise OutOfContractError("sliding_window_size", f"{int(sliding_window_size)}: a sliding window is not in "
                                                        "the source read")
    if sinks is not None:
        raise OutOfContractError("sinks", "attention sinks are not in the source read")
    if is_cross_attn or encoder_lens is not None:
        raise OutOfContractError("is_cross_attn", "cross attention and encoder_lens are not modelled")


def _pool_slots(req_to_token: torch.Tensor, req: int, start: int, count: int, slots: int, *,
                checked_upper: bool) -> torch.Tensor:
    """``req_to_token[req, start:start + count]`` as int64, each slot in ``[0, slots)``.

    ``checked_upper``: the op itself checks ``slot < slots`` (decode's gemms:
    "token index out of scope!", a ``RuntimeError``); a negative slot, or any
    slot where the op checks nothing, is ``OutOfRangeRead``.
    """
    max_reqs, max_context_len = req_to_token.shape
    if req < 0:
        raise OutOfRangeRead("req_pool_indices", f"index {req} is negative: the kernel would read foreign rows")
    if start + count > max_context_len:
        raise OutOfRangeRead("req_to_token", f"{start + count} tokens of request row {req} exceed its "
                                             f"{max_context_len} columns: the kernel would read the next row")
    row = req_to_token[req, start:start + count].to("cpu", torch.int64)
    if checked_upper and bool((row >= slots).any()):
        raise RuntimeError("token index out of scope!")
    check_index_range("req_to_token", row, slots)
    return row


def _cap(scores: torch.Tensor, logit_cap: float) -> torch.Tensor:
    return logit_cap * torch.tanh(scores / logit_cap) if logit_cap > 0 else scores


def decode_attention_cpu(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: Any,
                         value_scale: Any, output: torch.Tensor, key: torch.Tensor | None,
                         value: torch.Tensor | None, loc: torch.Tensor, attn_logits: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         sm_scale: float, logit_cap: float, is_cross_attn: bool = False,
                         sliding_window_size: Any = None, encoder_lens: Any = None, sinks: Any = None) -> None:
    """``torch.ops.sgl_kernel.decode_attention_cpu``: write ``key`` / ``value`` at ``loc``, then decode (see the
    module)."""
    for name, x in (("query", query), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        _last_dim_contiguous(name, x)
    for name, x in (("query", query), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        _dim(3, name, x)
    _dim(1, "loc", loc)
    num_seqs = seq_lens.size(0)
    max_reqs, max_context_len = req_to_token.shape
    slots, heads_kv = k_buffer.size(0), k_buffer.size(1)
    heads, head_size, head_size_v = query.size(1), query.size(2), v_buffer.size(2)
    _check_eq("attn_logits.size(0) == num_seqs", attn_logits.size(0), num_seqs)
    _check_eq("attn_logits.size(1) == num_heads", attn_logits.size(1), heads)
    _check_eq("attn_logits.size(3) == head_size_v + 1", attn_logits.size(3), head_size_v + 1)
    if attn_logits.dtype != torch.float32:
        raise RuntimeError(f"Expected attn_logits.scalar_type() == at::kFloat, got {attn_logits.dtype}")
    _index_dtypes("decode", req_to_token, req_pool_indices, seq_lens)
    is_mla = k_buffer.data_ptr() == v_buffer.data_ptr() and heads_kv == 1 and head_size == head_size_v + 64
    _dispatch_dtype("decode_attention_kernel", query)
    _not_modelled(query, k_buffer, v_buffer, key_scale, value_scale, is_cross_attn, sliding_window_size,
                  encoder_lens, sinks)
    if k_buffer.size(2) != head_size:
        raise OutOfContractError("k_buffer", f"head size {k_buffer.size(2)} differs from the query's {head_size}")
    if tuple(output.shape) != (query.size(0), heads, head_size_v) or output.dtype != query.dtype:
        raise OutOfContractError("output", f"{tuple(output.shape)} {output.dtype}: expected "
                                           f"{(query.size(0), heads, head_size_v)} {query.dtype}")
    if heads != heads_kv and not is_mla and heads % heads_kv:
        raise OutOfContractError("num_heads", f"{heads} query heads over {heads_kv} KV heads")
    if num_seqs > query.size(0) or req_pool_indices.size(0) < num_seqs:
        raise OutOfRangeRead("seq_lens", f"{num_seqs} sequences, {query.size(0)} query rows, "
                                         f"{req_pool_indices.size(0)} pool indices")

    if key is not None:
        if value is None:
            raise RuntimeError("key and value should have values at the same time")
        _check_eq("loc.numel() == num_seqs", loc.numel(), num_seqs)
        for name, x in (("key_tensor", key), ("value_tensor", value)):
            _last_dim_contiguous(name, x)
        _dim(3, "key_tensor", key)
        _dim(3, "value_tensor", value)
        if loc.dtype != torch.int64:
            raise RuntimeError(f"expected scalar type Long but found {_ATEN_NAMES.get(loc.dtype, loc.dtype)}")
        if key.dtype != query.dtype or value.dtype != query.dtype:
            raise OutOfContractError("key", f"key {key.dtype} / value {value.dtype} differ from the query's dtype")
        check_index_range("loc", loc, slots, access="write")
        rows = loc.to("cpu", torch.int64).to(k_buffer.device)
        k_buffer[rows, :, :head_size] = key[:num_seqs, :heads_kv, :head_size]
        if not is_mla:
            v_buffer[rows, :, :head_size_v] = value[:num_seqs, :heads_kv, :head_size_v]
    elif is_mla and heads != heads_kv:
        raise RuntimeError("MLA requires key and value tensors")

    splits = attn_logits.size(2)
    group = heads // heads_kv if heads != heads_kv else 1
    kv_head = torch.arange(heads) // group if not is_mla else torch.zeros(heads, dtype=torch.int64)
    lens = seq_lens.to("cpu", torch.int64).tolist()
    pools = req_pool_indices.to("cpu", torch.int64).tolist()
    for b in range(num_seqs):
        length, req = lens[b], pools[b]
        if length > max_context_len:
            raise RuntimeError("seq_len_kv out of scope!")
        if req >= max_reqs:
            raise RuntimeError("req_pool_id out of scope!")
        if length <= 0:
            raise OutOfContractError("seq_lens", f"sequence {b} has {length} tokens: the op's split merge "
                                                 "computes exp(-inf - -inf) for an empty sequence")
        tokens = _pool_slots(req_to_token, req, 0, length, slots, checked_upper=True).to(k_buffer.device)
        q = query[b].detach().to("cpu", torch.float64)  # [H, D]
        k = k_buffer[tokens][:, kv_head, :head_size].detach().to("cpu", torch.float64)  # [L, H, D]
        v = v_buffer[tokens][:, kv_head, :head_size_v].detach().to("cpu", torch.float64)  # [L, H, Dv]
        scores = _cap(sm_scale * torch.einsum("hd,lhd->hl", q, k), float(logit_cap))  # [H, L]
        split_size = -(-length // splits)
        part_out = torch.zeros(heads, splits, head_size_v, dtype=torch.float64)
        part_lse = torch.full((heads, splits), -math.inf, dtype=torch.float64)
        for s in range(splits):
            lo, hi = s * split_size, min(s * split_size + split_size, length)
            if hi <= lo:
                continue
            lse = torch.logsumexp(scores[:, lo:hi], dim=-1)  # [H]
            probs = torch.exp(scores[:, lo:hi] - lse[:, None])
            part_out[:, s] = torch.einsum("hl,lhd->hd", probs, v[lo:hi])
            part_lse[:, s] = lse
        top = part_lse.max(dim=1).values  # [H]; split 0 is never empty
        weights = torch.exp(part_lse - top[:, None])  # [H, splits], 0 for an empty split
        acc = torch.einsum("hs,hsd->hd", weights, part_out)
        logits = torch.cat([part_out, part_lse[..., None]], dim=-1)  # [H, splits, Dv + 1]
        logits[:, 0, :head_size_v] = acc
        attn_logits[b].copy_(logits.to(torch.float32))
        output[b].copy_((acc / weights.sum(dim=1)[:, None]).to(output.dtype))


def _block_m(max_len_extend: int) -> int:
    return 32 if max_len_extend <= 256 else 128 if max_len_extend <= 1024 else 256 if max_len_extend <= 4096 else 512


def extend_attention_cpu(q_extend: torch.Tensor, k_extend: torch.Tensor | None, v_extend: torch.Tensor | None,
                         o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, key_scale: Any,
                         value_scale: Any, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
                         max_len_extend: int, sm_scale: float, logit_cap: float, is_cross_attn: bool = False,
                         sliding_window_size: Any = None, encoder_lens: Any = None, sinks: Any = None,
                         tree_mask: Any = None, is_causal: bool = True) -> None:
    """``torch.ops.sgl_kernel.extend_attention_cpu``: cached prefix + causal extend rows (see the module)."""
    if not is_cross_attn and (k_extend is None or v_extend is None):
        raise RuntimeError("k_extend and v_extend are required for non-cross attention")
    k_ext = k_extend if k_extend is not None else k_buffer
    v_ext = v_extend if v_extend is not None else v_buffer
    _last_dim_contiguous("q_extend", q_extend)
    if not o_extend.is_contiguous():
        raise RuntimeError("o_extend must be contiguous")
    for name, x in (("k_extend", k_ext), ("v_extend", v_ext), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        _last_dim_contiguous(name, x)
    num_seqs = seq_lens.size(0)
    max_reqs, max_context_len = req_to_token.shape
    slots = k_buffer.size(0)
    heads, heads_kv = q_extend.size(1), k_ext.size(1)
    head_size, head_size_v = q_extend.size(2), v_ext.size(2)
    _check_eq("req_pool_indices.size(0) == num_seqs", req_pool_indices.size(0), num_seqs)
    _check_eq("extend_seq_lens.size(0) == num_seqs", extend_seq_lens.size(0), num_seqs)
    _check_eq("extend_start_loc.size(0) == num_seqs", extend_start_loc.size(0), num_seqs)
    _check_eq("v_extend.size(1) == num_heads_kv", v_ext.size(1), heads_kv)
    _check_eq("k_buffer.size(1) == v_buffer.size(1)", k_buffer.size(1), v_buffer.size(1))
    prefix_skipped = k_buffer.size(1) != heads_kv
    _index_dtypes("extend", req_to_token, req_pool_indices, seq_lens)
    if extend_seq_lens.dtype != req_to_token.dtype or extend_start_loc.dtype != req_to_token.dtype:
        raise RuntimeError("extend: expect extend_seq_lens and extend_start_loc to have same dtype as req_to_token.")
    if head_size % 32:
        raise RuntimeError(f"invalid head_size {head_size}")
    if head_size_v % 32:
        raise RuntimeError(f"invalid head_size_v {head_size_v}")
    _dispatch_dtype("extend_attention_kernel", q_extend)
    _not_modelled(q_extend, k_buffer, v_buffer, key_scale, value_scale, is_cross_attn, sliding_window_size,
                  encoder_lens, sinks)
    if tree_mask is not None:
        raise OutOfContractError("tree_mask", "a custom (tree) mask is not in the source read; its layout in "
                                              "SGLang's build is not known here")
    if not is_causal:
        raise OutOfContractError("is_causal", "non-causal self attention is not in the source read")
    if float(logit_cap) > 0:
        raise OutOfContractError("logit_cap", f"{float(logit_cap)}: the source read's extend kernel takes no "
                                              "logit cap; what SGLang's build does with it is not known")
    if heads % heads_kv:
        raise RuntimeError(f"Expected num_groups * num_heads_kv == num_heads ({heads} heads, {heads_kv} KV heads)")
    for name, x in (("k_extend", k_ext), ("v_extend", v_ext)):
        if x.dtype != q_extend.dtype:
            raise OutOfContractError(name, f"dtype {x.dtype} differs from q_extend's {q_extend.dtype}")
    if not prefix_skipped and (k_buffer.size(2) != head_size or v_buffer.size(2) != head_size_v):
        raise OutOfContractError("k_buffer", f"cache head sizes {k_buffer.size(2)} / {v_buffer.size(2)} differ "
                                             f"from the extend rows' {head_size} / {head_size_v}")
    if tuple(o_extend.shape[1:]) != (heads, head_size_v) or o_extend.dtype != q_extend.dtype:
        raise OutOfContractError("o_extend", f"{tuple(o_extend.shape)} {o_extend.dtype}: expected "
                                             f"[N, {heads}, {head_size_v}] {q_extend.dtype}")

    block = _block_m(int(max_len_extend))
    computed_rows = -(-int(max_len_extend) // block) * block
    group = heads // heads_kv
    kv_head = torch.arange(heads) // group
    lens = seq_lens.to("cpu", torch.int64).tolist()
    ext_lens = extend_seq_lens.to("cpu", torch.int64).tolist()
    starts = extend_start_loc.to("cpu", torch.int64).tolist()
    pools = req_pool_indices.to("cpu", torch.int64).tolist()
    for b in range(num_seqs):
        length, ext, start, req = lens[b], ext_lens[b], starts[b], pools[b]
        prefix = length - ext
        if prefix < 0:
            raise RuntimeError("prefix len < 0!")
        if length > max_context_len:
            raise RuntimeError("seq_len out of scope!")
        if req >= max_reqs:
            raise RuntimeError("req_pool_id out of scope!")
        if prefix_skipped and prefix != 0:
            raise RuntimeError(f"extend attention: expect seq_len_prefix to be 0, got {prefix}")
        rows = min(ext, computed_rows)
        if rows <= 0:
            continue
        for name, x in (("q_extend", q_extend), ("k_extend", k_ext), ("v_extend", v_ext), ("o_extend", o_extend)):
            if start < 0 or start + rows > x.size(0):
                raise OutOfRangeRead("extend_start_loc", f"rows [{start}, {start + rows}) of sequence {b} lie "
                                                         f"outside {name}'s {x.size(0)} rows")
        q = q_extend[start:start + rows].detach().to("cpu", torch.float64)  # [R, H, D]
        k_new = k_ext[start:start + rows][:, kv_head].detach().to("cpu", torch.float64)  # [R, H, D]
        v_new = v_ext[start:start + rows][:, kv_head].detach().to("cpu", torch.float64)  # [R, H, Dv]
        if prefix and not prefix_skipped:
            tokens = _pool_slots(req_to_token, req, 0, prefix, slots, checked_upper=False).to(k_buffer.device)
            k_old = k_buffer[tokens][:, kv_head].detach().to("cpu", torch.float64)
            v_old = v_buffer[tokens][:, kv_head].detach().to("cpu", torch.float64)
            keys, values = torch.cat([k_old, k_new]), torch.cat([v_old, v_new])
        else:
            keys, values = k_new, v_new
        n_old = keys.size(0) - rows
        scores = sm_scale * torch.einsum("ihd,jhd->hij", q, keys)  # [H, R, n_old + R]
        col = torch.arange(keys.size(0))[None, :]
        visible = (col < n_old) | (col - n_old <= torch.arange(rows)[:, None])  # [R, n]
        scores = scores.masked_fill(~visible[None], -math.inf)
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("hij,jhd->ihd", probs, values)
        o_extend[start:start + rows].copy_(out.to(o_extend.dtype))


EMULATIONS = {"torch.ops.sgl_kernel:decode_attention_cpu": decode_attention_cpu,
              "torch.ops.sgl_kernel:extend_attention_cpu": extend_attention_cpu}
