"""vLLM's AMX MLA ops (``AMX_MLA``, the sgl-kernels of a CPU build of ``vllm._C``), emulated in float64.

vLLM's ``AMX_MLA`` backend (MLA models on an AMX CPU) packs its absorption
weights with ``torch.ops._C.convert_weight_packed``, absorbs the query and
de-absorbs the output with ``torch.ops._C.bmm_cpu`` (``MLAAttention``'s
``is_amx_bmm_enabled`` path) and decodes with
``torch.ops._C.decode_attention_cpu`` (through ``vllm._cpu_ops``). A CUDA
build of ``vllm._C`` registers none of them. Emulated callables (see
``EMULATIONS`` at the bottom): ``torch.ops._C:convert_weight_packed``,
``bmm_cpu``, ``decode_attention_cpu``, and ``extend_attention_cpu``, which
``AMXMLAImpl.forward_mha`` attends speculative verify rows with.

Read from vLLM's ``csrc/cpu/sgl-kernels/gemm.cpp`` (``convert_weight_packed``,
``pack_vnni``), ``gemm.h`` (``TILE_N`` 16, ``TILE_K`` 32, ``block_size_n() =
2 · TILE_N``), ``bmm.cpp`` (``bmm_cpu``) and ``decode.cpp``
(``decode_attention_cpu``, its MLA branch ``decode_attention_mla_kernel_impl``
and ``pack_vnni`` of the cache), as stored for the revisions nearest 0.34.0
(the ops' arguments match the installed ``vllm/_cpu_ops.py``). The contract,
all in one place:

* ``convert_weight_packed(weight)``: ``weight`` contiguous ``[OC, IC]`` or
  ``[E, OC, IC]`` (``OC % 16 == 0``, ``IC % 32 == 0``: the op's
  ``TORCH_CHECK``\\s), bf16 or fp16 (int8 / fp8 weights refused, ``weight``);
  returns a tensor of the same shape and dtype whose data is each ``[OC, IC]``
  in VNNI blocks: rows ``n .. n + s`` (blocks of ``block_size_n() = 32``, the
  last one shorter) stored as ``[IC / 2, s, 2]`` (element ``(n + j, 2k + d)``
  at ``n · IC + (k · s + j) · 2 + d``).
* ``bmm_cpu(out, mat1, mat2, is_vnni, scale)``: ``out[b] = mat1[b] @ W[b]ᵀ``
  with ``W`` ``[B, N, K]`` (``mat2`` packed as above when ``is_vnni``, else
  plain: the op packs it itself), ``mat1`` ``[B, M, K]`` and ``out``
  ``[B, M, N]`` may be strided but need a contiguous last dim, ``mat2`` must
  be contiguous, ``N % 32 == 0`` (the op's checks: ``RuntimeError``); bf16 /
  fp16; the result rounded once to ``out``'s dtype. ``scale`` (the FP8
  W8A16 path) is refused (``scale``).
* ``decode_attention_cpu(query, k_buffer, v_buffer, output, key, value, loc,
  attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale,
  logit_cap, is_cross_attn, sliding_window_size, encoder_lens, sinks)``:
  only the **MLA branch** is modelled (the op takes it when ``k_buffer`` and
  ``v_buffer`` share their data pointer, ``k_buffer`` has one head and
  ``head_size == head_size_v + 64``; its MHA / GQA branches are refused,
  ``k_buffer``). Sequence ``b`` (``num_seqs = seq_lens.size(0)``, one query
  row each) reads its ``seq_lens[b]`` keys at the rows
  ``req_to_token[req_pool_indices[b], t]`` of the flat
  ``[max_total_num_tokens, 1, head_size]`` buffer, values the same rows'
  first ``head_size_v`` entries (``v_buffer``'s strides); scores
  ``sm_scale · q·k``; output ``[num_seqs, num_heads, head_size_v]`` in the
  query's dtype; ``attn_logits`` ``[num_seqs, num_heads, num_kv_splits,
  head_size_v + 1]`` float32 is the split-KV scratch (shape checked, not
  read back). Index dtypes as the op checks them (``req_to_token`` int32 or
  int64, ``req_pool_indices`` and ``seq_lens`` int64: ``RuntimeError``); a
  row index ``>= max_total_num_tokens`` fails the kernel's own
  ``TORCH_CHECK`` ("token index out of scope!", ``RuntimeError``), a negative
  one, a pool index outside ``req_to_token`` or a length past its row raise
  ``OutOfRangeRead``. Refused: new ``key`` / ``value`` / ``loc`` (the op's
  in-place cache write), ``logit_cap``, ``is_cross_attn``,
  ``sliding_window_size > 0``, ``encoder_lens``, ``sinks``, an empty
  sequence (``seq_lens``). No LSE is returned (the per-split LSE stays in the
  scratch).
* ``extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer,
  v_buffer, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
  extend_start_loc, max_len_extend, sm_scale, logit_cap, is_cross_attn,
  sliding_window_size, encoder_lens, sinks, tree_mask)`` (``extend.cpp``):
  sequence ``b`` has ``seq_lens[b]`` tokens, the last ``extend_seq_lens[b]``
  of them new, at rows ``extend_start_loc[b] + i`` of ``q_extend``,
  ``k_extend``, ``v_extend`` and ``o_extend``. Its query ``i`` sees the
  ``prefix = seq_lens[b] - extend_seq_lens[b]`` cached keys (rows
  ``req_to_token[req_pool_indices[b], t]`` of ``k_buffer`` / ``v_buffer``,
  every one visible) and the new keys ``j <= i`` of ``k_extend`` /
  ``v_extend`` (causal within the new tokens, **read from the new tensors, not
  the cache**); GQA heads ``h // (num_heads / num_heads_kv)``; scores
  ``sm_scale · q·k``; ``o_extend`` contiguous ``[tokens, num_heads,
  head_size_v]`` in the query's dtype. The op's checks are kept as
  ``RuntimeError``: index dtypes (``req_to_token`` int32 / int64, the same
  for ``extend_seq_lens`` and ``extend_start_loc``, ``seq_lens`` and
  ``req_pool_indices`` int64), ``head_size`` and ``head_size_v`` multiples of
  32, ``prefix >= 0`` ("prefix len < 0!"), ``seq_len <= max_context_len``
  ("seq_len out of scope!"), a zero prefix when ``k_buffer``'s heads differ
  from ``k_extend``'s (the "MLA skips the prefix" case). The kernel tiles
  query rows up to ``max_len_extend``: a sequence with more new tokens than
  that raises ``OutOfRangeRead`` (``max_len_extend``: rows it never
  computes), as do a pool index outside ``req_to_token`` and a cache row
  outside ``k_buffer``. Refused: ``tree_mask``, ``logit_cap``,
  ``is_cross_attn``, ``sliding_window_size > 0``, ``encoder_lens``, ``sinks``.
* Not modelled: the kernels' bf16 dot products (``_mm512_dpbf16_ps``), their
  split-KV order and ``exp_u20``, the AMX brgemm blocking of ``bmm_cpu``.
"""

from __future__ import annotations

import torch

from .glue import OutOfContractError, OutOfRangeRead, as_float64, attend, check_dtype, check_index_range, write_out
from .sgl_kernel_cpu_attention import _index_dtypes

__all__ = ["EMULATIONS", "bmm_cpu", "convert_weight_packed", "decode_attention_cpu", "extend_attention_cpu"]

#: ``block_size_n() = 2 · TILE_N`` (``gemm.h``): the rows packed together.
BLOCK_N = 32
_DTYPES = (torch.bfloat16, torch.float16)


def _blocks(oc: int) -> list[tuple[int, int]]:
    return [(n, min(BLOCK_N, oc - n)) for n in range(0, oc, BLOCK_N)]


def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    """``torch.ops._C.convert_weight_packed``: each ``[OC, IC]`` in VNNI blocks (see the module docstring)."""
    if not weight.is_contiguous():
        raise RuntimeError("convert_weight_packed: weight must be contiguous")
    if weight.dim() not in (2, 3):
        raise RuntimeError(f"expect weight to be 2d or 3d, got {weight.dim()}d tensor.")
    check_dtype("weight", weight, _DTYPES)
    w = weight if weight.dim() == 3 else weight[None]
    e, oc, ic = w.shape
    if oc % 16:
        raise RuntimeError(f"invalid weight out features {oc}")
    if ic % 32:
        raise RuntimeError(f"invalid weight input features {ic}")
    packed = torch.empty_like(w)
    flat = packed.view(e, oc * ic)
    for n, size in _blocks(oc):
        block = w[:, n:n + size].reshape(e, size, ic // 2, 2).permute(0, 2, 1, 3)  # [e, ic/2, size, 2]
        flat[:, n * ic:(n + size) * ic] = block.reshape(e, -1)
    return packed.view(weight.shape)


def _unpacked(packed: torch.Tensor) -> torch.Tensor:
    """The ``[B, N, K]`` weight a VNNI-packed ``mat2`` holds (the inverse of ``convert_weight_packed``)."""
    b, oc, ic = packed.shape
    flat = packed.reshape(b, oc * ic)
    rows = [flat[:, n * ic:(n + size) * ic].reshape(b, ic // 2, size, 2).permute(0, 2, 1, 3).reshape(b, size, ic)
            for n, size in _blocks(oc)]
    return torch.cat(rows, dim=1)


def bmm_cpu(out: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, is_vnni: bool,
            scale: torch.Tensor | None = None) -> None:
    """``torch.ops._C.bmm_cpu``: ``out[b] = mat1[b] @ W[b]ᵀ`` in place (see the module docstring)."""
    if scale is not None:
        raise OutOfContractError("scale", "the FP8 W8A16 bmm is not modelled")
    if mat1.stride(-1) != 1 or out.stride(-1) != 1:
        raise RuntimeError("bmm_cpu: mat1 and out need a contiguous last dim")
    if not mat2.is_contiguous():
        raise RuntimeError("bmm_cpu: mat2 must be contiguous")
    if out.dim() != 3 or mat1.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError("bmm_cpu: out, mat1 and mat2 must be 3-D")
    check_dtype("mat1", mat1, _DTYPES)
    for flag, tensor in (("mat2", mat2), ("out", out)):
        if tensor.dtype != mat1.dtype:
            raise OutOfContractError(flag, f"dtype {tensor.dtype} differs from mat1's {mat1.dtype}")
    b, m, k = mat1.shape
    n = mat2.shape[1]
    if n % 32:
        raise RuntimeError("tinygemm requires N to be 32x.")
    if mat2.shape[0] != b or mat2.shape[2] != k:
        raise RuntimeError("bmm: mat2 shape mismatch!")
    if out.shape[0] != b or out.shape[1] != m:
        raise RuntimeError("bmm: out shape mismatch!")
    if out.shape[2] != n:
        raise OutOfContractError("out", f"{out.shape[2]} columns for a weight of {n} rows")
    weight = _unpacked(mat2) if is_vnni else mat2
    result = torch.einsum("bmk,bnk->bmn", as_float64(mat1), as_float64(weight))
    write_out(result, out, out.dtype, out.device)


def decode_attention_cpu(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, output: torch.Tensor,
                         key: torch.Tensor | None, value: torch.Tensor | None, loc: torch.Tensor | None,
                         attn_logits: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor, sm_scale: float, logit_cap: float, is_cross_attn: bool,
                         sliding_window_size: int, encoder_lens: torch.Tensor | None,
                         sinks: torch.Tensor | None) -> None:
    """``torch.ops._C.decode_attention_cpu``, its MLA branch: one query row per sequence, into ``output``."""
    for flag, tensor in (("query", query), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if tensor.dim() != 3 or tensor.stride(-1) != 1:
            raise RuntimeError(f"decode_attention_cpu: {flag} must be 3-D with a contiguous last dim")
    for flag, present in (("key", key is not None), ("value", value is not None), ("loc", loc is not None),
                          ("logit_cap", float(logit_cap) != 0.0), ("is_cross_attn", bool(is_cross_attn)),
                          ("sliding_window_size", int(sliding_window_size) > 0),
                          ("encoder_lens", encoder_lens is not None), ("sinks", sinks is not None)):
        if present:
            raise OutOfContractError(flag, "is not modelled")
    num_seqs = seq_lens.shape[0]
    num_heads, head_size = query.shape[1], query.shape[2]
    head_size_v = v_buffer.shape[2]
    if tuple(attn_logits.shape[:2]) != (num_seqs, num_heads) or attn_logits.shape[3] != head_size_v + 1 \
            or attn_logits.dtype != torch.float32:
        raise RuntimeError(f"decode_attention_cpu: attn_logits {tuple(attn_logits.shape)} {attn_logits.dtype} for "
                           f"{num_seqs} sequences of {num_heads} heads, head_size_v {head_size_v}")
    _index_dtypes("decode", req_to_token, req_pool_indices, seq_lens)  # the same C++ checks (decode.cpp)
    is_mla = (k_buffer.data_ptr() == v_buffer.data_ptr() and k_buffer.shape[1] == 1
              and head_size == head_size_v + 64)
    if not is_mla:
        raise OutOfContractError("k_buffer", "only the op's MLA branch is modelled (one KV head, value = the key "
                                             "rows' first head_size - 64 entries of the same buffer)")
    check_dtype("query", query, _DTYPES)
    for flag, tensor in (("k_buffer", k_buffer), ("output", output)):
        if tensor.dtype != query.dtype:
            raise OutOfContractError(flag, f"dtype {tensor.dtype} differs from the query's {query.dtype}")
    if query.shape[0] < num_seqs or output.dim() != 3 or output.shape[0] < num_seqs \
            or tuple(output.shape[1:]) != (num_heads, head_size_v):
        raise OutOfContractError("output", f"{tuple(output.shape)} for {num_seqs} sequences of {num_heads} heads")
    max_tokens = k_buffer.shape[0]
    max_reqs, max_context = req_to_token.shape
    pools = req_pool_indices.to("cpu", torch.int64)
    lens = seq_lens.to("cpu", torch.int64)
    for s in range(num_seqs):
        n, pool = int(lens[s]), int(pools[s])
        if n <= 0:
            raise OutOfContractError("seq_lens", f"sequence {s} has {n} keys: an empty sequence is not modelled")
        check_index_range("req_pool_indices", pools[s:s + 1], max_reqs)
        if n > max_context:
            raise OutOfRangeRead("seq_lens", f"sequence {s}: {n} keys past req_to_token's {max_context} columns")
        rows = req_to_token[pool, :n].to("cpu", torch.int64)
        if bool((rows >= max_tokens).any()):
            raise RuntimeError("token index out of scope!")
        check_index_range("req_to_token", rows, max_tokens)
        k = as_float64(k_buffer[rows.to(k_buffer.device), 0])  # [n, head_size]
        v = as_float64(v_buffer[rows.to(v_buffer.device), 0])  # [n, head_size_v]
        q = as_float64(query[s])  # [heads, head_size]
        scores = float(sm_scale) * torch.einsum("hd,nd->hn", q, k)[:, None, :]  # [heads, 1, n]
        o, _ = attend(scores, v[:, None, :].expand(n, num_heads, head_size_v), torch.ones(1, n, dtype=torch.bool))
        write_out(o[0], output[s], query.dtype, output.device)


def extend_attention_cpu(q_extend: torch.Tensor, k_extend: torch.Tensor | None, v_extend: torch.Tensor | None,
                         o_extend: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor, max_len_extend: int,
                         sm_scale: float, logit_cap: float, is_cross_attn: bool, sliding_window_size: int,
                         encoder_lens: torch.Tensor | None, sinks: torch.Tensor | None,
                         tree_mask: torch.Tensor | None = None) -> None:
    """``torch.ops._C.extend_attention_cpu``: prefix from the cache, new tokens causal, into ``o_extend``."""
    for flag, present in (("tree_mask", tree_mask is not None), ("logit_cap", float(logit_cap) != 0.0),
                          ("is_cross_attn", bool(is_cross_attn)),
                          ("sliding_window_size", int(sliding_window_size) > 0),
                          ("encoder_lens", encoder_lens is not None), ("sinks", sinks is not None)):
        if present:
            raise OutOfContractError(flag, "is not modelled")
    if k_extend is None or v_extend is None:
        raise RuntimeError("k_extend and v_extend are required for non-cross attention")
    for flag, tensor in (("q_extend", q_extend), ("k_extend", k_extend), ("v_extend", v_extend),
                         ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if tensor.dim() != 3 or tensor.stride(-1) != 1:
            raise RuntimeError(f"extend_attention_cpu: {flag} must be 3-D with a contiguous last dim")
    if not o_extend.is_contiguous():
        raise RuntimeError("extend_attention_cpu: o_extend must be contiguous")
    num_seqs = seq_lens.shape[0]
    max_reqs, max_context = req_to_token.shape
    num_heads, head_size = q_extend.shape[1], q_extend.shape[2]
    num_heads_kv, head_size_v = k_extend.shape[1], v_extend.shape[2]
    index_dtype = req_to_token.dtype
    if index_dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"extend: expect req_to_token to be int32 or int64, got {index_dtype}")
    if seq_lens.dtype != torch.int64:
        raise RuntimeError(f"extend: expect req_lens to be int64, got {seq_lens.dtype}")
    if req_pool_indices.dtype != torch.int64:
        raise RuntimeError(f"extend: expect req_pool_indices to be int64, got {req_pool_indices.dtype}")
    if extend_seq_lens.dtype != index_dtype or extend_start_loc.dtype != index_dtype:
        raise RuntimeError("extend: expect extend_seq_lens and extend_start_loc to have same dtype as req_to_token.")
    if head_size % 32 or head_size_v % 32:
        raise RuntimeError(f"invalid head_size {head_size} / head_size_v {head_size_v}")
    if req_pool_indices.shape[0] != num_seqs or extend_seq_lens.shape[0] != num_seqs \
            or extend_start_loc.shape[0] != num_seqs or v_extend.shape[1] != num_heads_kv \
            or k_buffer.shape[1] != v_buffer.shape[1] or num_heads % num_heads_kv:
        raise RuntimeError("extend_attention_cpu: size mismatch between the sequence tensors or the heads")
    check_dtype("q_extend", q_extend, _DTYPES)
    for flag, tensor in (("k_extend", k_extend), ("k_buffer", k_buffer), ("o_extend", o_extend)):
        if tensor.dtype != q_extend.dtype:
            raise OutOfContractError(flag, f"dtype {tensor.dtype} differs from the query's {q_extend.dtype}")
    if o_extend.dim() != 3 or tuple(o_extend.shape[1:]) != (num_heads, head_size_v):
        raise OutOfContractError("o_extend", f"{tuple(o_extend.shape)} for {num_heads} heads of {head_size_v}")
    prefix_skipped = k_buffer.shape[1] != num_heads_kv
    group = num_heads // num_heads_kv
    lens, news = seq_lens.to("cpu", torch.int64), extend_seq_lens.to("cpu", torch.int64)
    starts, pools = extend_start_loc.to("cpu", torch.int64), req_pool_indices.to("cpu", torch.int64)
    for s in range(num_seqs):
        seq_len, new, start, pool = int(lens[s]), int(news[s]), int(starts[s]), int(pools[s])
        prefix = seq_len - new
        if prefix < 0:
            raise RuntimeError("prefix len < 0!")
        if seq_len > max_context:
            raise RuntimeError("seq_len out of scope!")
        if prefix_skipped and prefix:
            raise RuntimeError(f"extend attention: expect seq_len_prefix to be 0, got {prefix}")
        if new <= 0:
            continue
        if new > int(max_len_extend):
            raise OutOfRangeRead("max_len_extend", f"sequence {s} has {new} new tokens, the kernel tiles "
                                                   f"{max_len_extend}: rows past it are never computed")
        if start < 0 or start + new > min(q_extend.shape[0], k_extend.shape[0], o_extend.shape[0]):
            raise OutOfRangeRead("extend_start_loc", f"sequence {s}: rows {start}..{start + new} outside the "
                                                     "new-token tensors")
        check_index_range("req_pool_indices", pools[s:s + 1], max_reqs)
        rows = req_to_token[pool, :prefix].to("cpu", torch.int64)
        check_index_range("req_to_token", rows, k_buffer.shape[0])
        k = torch.cat([as_float64(k_buffer[rows.to(k_buffer.device)][:, :num_heads_kv]),
                       as_float64(k_extend[start:start + new])])  # [prefix + new, kv_heads, d]
        v = torch.cat([as_float64(v_buffer[rows.to(v_buffer.device)][:, :num_heads_kv]),
                       as_float64(v_extend[start:start + new])])
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        q = as_float64(q_extend[start:start + new])  # [new, heads, d]
        scores = float(sm_scale) * torch.einsum("qhd,nhd->hqn", q, k)
        visible = torch.arange(prefix + new)[None, :] <= prefix + torch.arange(new)[:, None]  # [new, prefix + new]
        o, _ = attend(scores, v, visible)
        write_out(o, o_extend[start:start + new], q_extend.dtype, o_extend.device)


EMULATIONS = {
    "torch.ops._C:convert_weight_packed": convert_weight_packed,
    "torch.ops._C:bmm_cpu": bmm_cpu,
    "torch.ops._C:decode_attention_cpu": decode_attention_cpu,
    "torch.ops._C:extend_attention_cpu": extend_attention_cpu,
}
