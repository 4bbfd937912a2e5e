"""vLLM's CPU paged attention (``CPU_ATTN``, a CPU build of ``vllm._C``), emulated in float64.

vLLM's ``CPU_ATTN`` backend (GQA models on the CPU platform) schedules with
``torch.ops._C.get_scheduler_metadata``, writes the KV cache with
``torch.ops._C.cpu_attn_reshape_and_cache`` and attends with
``torch.ops._C.cpu_attention_with_kv_cache`` (through ``vllm._cpu_ops``). A
CUDA build of ``vllm._C`` registers none of them. Emulated callables (see
``EMULATIONS`` at the bottom): ``torch.ops._C:get_scheduler_metadata``,
``cpu_attn_reshape_and_cache``, ``cpu_attention_with_kv_cache``.

Read from vLLM's ``csrc/cpu/cpu_attn.cpp`` (the three ops: argument checks,
fp8 dtype parsing, ISA hints), ``cpu_attn_impl.hpp`` (``AttentionScheduler``,
``AttentionMainLoop``: work items, masks, softmax), ``cpu_attn_vec.hpp`` and
``cpu_attn_amx.hpp`` (each ISA's ``reshape_and_cache`` layout),
``cpu_attn_fp8.hpp`` (the fp8 writers and their quantiser) and
``generate_cpu_attn_dispatch.py`` (the compiled head dims), as stored for
the vLLM revisions nearest 0.34.0 (the ops' signatures match the installed
``vllm/_cpu_ops.py``), and ``tests/kernels/attention/test_cpu_attn.py``
(``ref_paged_attn``). The contract, all in one place:

* **ISA.** Modelled: ``"amx"`` (bf16 query, AMX tiles; ``cpu_amx``) and
  ``"vec"`` (AVX-512 vectors; ``cpu``). Others (``vec16``, ``neon``,
  ``amx_fp8``, ...) are refused (``isa``); an unknown hint fails the op's
  ``TORCH_CHECK`` (``RuntimeError``). The attention takes its ISA from the
  **scheduler metadata** (``input.metadata->isa``), the cache writer from its
  own ``isa`` argument: a cache written for one ISA and read with another is
  read scrambled, as on the CPU.
* **Cache layout.** ``key_cache`` / ``value_cache`` are
  ``[num_blocks, num_kv_heads, block_size, head_size]`` views (vLLM's two
  halves of a ``[blocks, kv_heads, block_size, 2 * head_size]`` cache); the
  kernels use only their ``stride(0)``, ``stride(1)`` and treat the
  ``block_size * head_size`` elements of one (block, head) as a packed tile:

  - ``vec``: K column-major ``[head_size, block_size]`` (token ``t``, dim ``d``
    at ``d * block_size + t``), V row-major ``[block_size, head_size]``
    (``t * head_size + d``);
  - ``amx``: K in 16-token groups of element pairs (``((t // 16) *
    (head_size / 2) + d // 2) * 32 + (t % 16) * 2 + d % 2``), V in 16-dim
    groups of token pairs (``(d // 16) * block_size * 16 + (t // 2) * 32 +
    (d % 16) * 2 + t % 2``). The fp8 AMX writer packs two fp8 bytes where the
    bf16 one packs two bf16 values: the same formulas in elements, read back
    by the AMX kernel's bf16-query / fp8-KV path (``amx_fp8``, Diamond
    Rapids' native fp8 K layout, is another ISA, not modelled).

  ``block_size`` must be a multiple of 32 (``BlockSizeAlignment`` of both
  ISAs); token ``t`` of a request lives at
  ``block_table[req, t // block_size]``, offset ``t % block_size``.
* **Writes** (``cpu_attn_reshape_and_cache``): token ``i`` goes to slot
  ``slot_mapping[i]`` (int64), skipped when negative; a slot's block outside
  the cache raises ``OutOfRangeRead`` (a write the CPU would make into foreign
  memory). ``kv_cache_dtype="auto"``: the values as given, the cache of the
  key's dtype. fp8 (``"fp8"`` / ``"fp8_e4m3"``; ``"fp8_e5m2"`` refused): the
  cache is uint8, each value ``float_to_fp8e4m3_scalar(x, 1 / k_scale)``:
  ``x * inv`` in float32, clamped to ±448, the e4m3 byte by **truncation**
  (the float32 bits of ``x * inv * 2^-120`` shifted right by 20; ``0x7F``,
  NaN, never written); ``k_scale`` / ``v_scale`` must be positive (the op's
  ``TORCH_CHECK``).
* **Scheduler metadata** (``get_scheduler_metadata``): an opaque int8 tensor
  on the CPU; here it records what the scheduler's work items are built from:
  ISA, query / KV head counts, head dim, dtype, causal, window, the
  ``query_start_loc`` and ``seq_lens`` (int32) it was built for. A call with
  other lengths, head counts or causality than its metadata's would run the
  metadata's work items over the call's tensors: ``OutOfRangeRead``
  (``scheduler_metadata``), the caller's bug. ``enable_kv_split`` only changes
  how the work is split (not modelled: one exact softmax).
* **Attention** (``cpu_attention_with_kv_cache``): request ``r`` owns query
  rows ``query_start_loc[r] .. query_start_loc[r + 1]`` and ``seq_lens[r]``
  keys (the new tokens included); query head ``h`` reads KV head
  ``h // (num_heads / num_kv_heads)``; scores ``scale · q·k`` on the values as
  read (fp8: ``raw · k_scale``; V ``raw · v_scale``); ``causal``: query ``i``
  of a request of ``q_len`` rows sits at ``seq_len - q_len + i`` and sees keys
  at positions ``<=`` it (bottom-right, ``ref_paged_attn``'s ``triu``);
  otherwise every key. Output ``[num_tokens, num_heads, head_size]`` in the
  query's dtype; no LSE. Only the first ``seq_len`` keys' blocks are read,
  each block id must lie in ``[0, num_blocks)`` (``OutOfRangeRead``).
* **Refused** (``OutOfContractError`` naming the argument): ALiBi
  (``alibi_slopes``), sliding windows (``sliding_window`` other than -1),
  soft-capping (``softcap`` other than 0), attention sinks (``s_aux``),
  ``dynamic_causal``, ``fp8_e5m2``, head dims the dispatch does not compile
  for ``amx`` / ``vec`` (multiples of 32 up to 256, and 512), an ``amx``
  query other than bf16.
* Not modelled: the kernels' bf16 / fp32 arithmetic, split-KV reduction
  order and fast ``exp``; the P·V tile spanning the last 32-token group with
  zero weights (a real cache holds finite stale values there; rows past a
  length are NaN in the checks, never read here).
"""

from __future__ import annotations

import functools
import struct

import torch

from .glue import (OutOfContractError, OutOfRangeRead, as_float64, attend, bottom_right_visible, check_dtype,
                   check_index_range, write_out)

__all__ = ["EMULATIONS", "cpu_attention_with_kv_cache", "cpu_attn_reshape_and_cache", "get_scheduler_metadata"]

#: ISA hints the op knows (``cpu_attn.cpp``) and the ones modelled here.
KNOWN_ISAS = ("amx", "amx_fp8", "vec", "vec16", "neon", "vxe", "rvv", "vsx")
ISAS = ("amx", "vec")
#: Head dims the dispatch compiles for ``amx`` / ``vec``.
HEAD_DIMS = (32, 64, 96, 128, 160, 192, 224, 256, 512)
BLOCK_ALIGNMENT = 32
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_MAGIC = 0x43505541  # "CPUA": metadata built by this emulation
_HEADER = struct.Struct("<12i")


def _fp8_kind(kv_cache_dtype: str) -> bool:
    """Whether ``kv_cache_dtype`` names an fp8 cache (``parse_fp8_kv_dtype``); e5m2 is refused."""
    if kv_cache_dtype == "fp8_e5m2":
        raise OutOfContractError("kv_cache_dtype", "fp8_e5m2 caches are not modelled (e4m3 only)")
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def _check_isa(isa: str, flag: str = "isa") -> None:
    if isa not in KNOWN_ISAS:
        raise RuntimeError(f"Unsupported CPU attention ISA hint: {isa}")
    if isa not in ISAS:
        raise OutOfContractError(flag, f"ISA {isa!r} is not modelled (amx, vec)")


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise OutOfContractError("head_dim", f"{head_dim} is not compiled for amx / vec (expects one of {HEAD_DIMS})")


# ---- the packed tile of one (block, kv head) ---------------------------------------------------


@functools.lru_cache(maxsize=64)
def _layout(isa: str, block_size: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_index, v_index)``, each ``[block_size, head_dim]`` int64: where token ``t``'s dim ``d`` sits in the tile."""
    t = torch.arange(block_size, dtype=torch.int64)[:, None]
    d = torch.arange(head_dim, dtype=torch.int64)[None, :]
    if isa == "vec":
        k = d * block_size + t
        v = t * head_dim + d
    else:  # amx
        k = (((t // 16) * (head_dim // 2) + d // 2) * 16 + t % 16) * 2 + d % 2
        v = (d // 16) * block_size * 16 + (t // 2) * 32 + (d % 16) * 2 + t % 2
    return k, v


def _tiles(cache: torch.Tensor, flag: str) -> torch.Tensor:
    """``cache [blocks, heads, block_size, head_dim]`` as the kernels address it: ``[blocks, heads, block_size * head_dim]``."""
    if cache.dim() != 4:
        raise RuntimeError(f"{flag}: expected a 4-D cache, got {cache.dim()}-D")
    blocks, heads, block_size, head_dim = cache.shape
    if block_size > 1 and cache.stride(2) != head_dim or cache.stride(3) != 1:
        raise OutOfContractError(flag, f"strides {cache.stride()}: a block's tokens must be contiguous rows")
    return torch.as_strided(cache, (blocks, heads, block_size * head_dim), (cache.stride(0), cache.stride(1), 1))


def _quantise_e4m3(x: torch.Tensor, inv_scale: float) -> torch.Tensor:
    """``float_to_fp8e4m3_scalar`` (``cpu_attn_fp8.hpp``): float32 ``x * inv``, clamped, the e4m3 byte by truncation."""
    v = x.to(torch.float32) * torch.tensor(inv_scale, dtype=torch.float32)
    v = v.clamp(-448.0, 448.0)
    bits = (v * torch.tensor(2.0 ** -120, dtype=torch.float32)).view(torch.int32)
    sign = (bits >> 24) & 0x80
    payload = ((bits >> 20) & 0x7F).clamp(max=0x7E)
    byte = torch.where(payload == 0, sign, sign | payload)
    return torch.where(v == 0, torch.zeros_like(byte), byte).to(torch.uint8)


def _read_values(raw: torch.Tensor, fp8: bool, scale: float) -> torch.Tensor:
    """Cache values as the kernel reads them, float64 (fp8: ``raw e4m3 · scale``)."""
    if fp8:
        return as_float64(raw.view(torch.float8_e4m3fn), scale)
    return as_float64(raw)


# ---- the ops -----------------------------------------------------------------------------------


def get_scheduler_metadata(num_req: int, num_heads_q: int, num_heads_kv: int, head_dim: int, seq_lens: torch.Tensor,
                           dtype: torch.dtype, query_start_loc: torch.Tensor, causal: bool, window_size: int,
                           isa_hint: str, enable_kv_split: bool, dynamic_causal: torch.Tensor | None = None,
                           kv_cache_dtype: str = "auto") -> torch.Tensor:
    """``torch.ops._C.get_scheduler_metadata``: the schedule's inputs, as an int8 tensor (see the module docstring)."""
    _check_isa(isa_hint, "isa_hint")
    if dtype not in _DTYPES:
        raise OutOfContractError("dtype", f"{dtype} is not dispatched (float32, float16, bfloat16)")
    _check_head_dim(int(head_dim))
    if dynamic_causal is not None:
        raise OutOfContractError("dynamic_causal", "per-request causality is not modelled")
    if int(window_size) != -1:
        raise OutOfContractError("window_size", f"sliding window {window_size} is not modelled")
    fp8 = _fp8_kind(kv_cache_dtype)
    check_dtype("seq_lens", seq_lens, (torch.int32,))
    check_dtype("query_start_loc", query_start_loc, (torch.int32,))
    n = int(num_req)
    if seq_lens.numel() < n or query_start_loc.numel() < n + 1:
        raise OutOfRangeRead("seq_lens", f"{seq_lens.numel()} lengths / {query_start_loc.numel()} query starts "
                                         f"for {n} requests")
    if num_heads_kv <= 0 or num_heads_q % num_heads_kv:
        raise OutOfContractError("num_heads_kv", f"{num_heads_q} query heads over {num_heads_kv} KV heads")
    header = _HEADER.pack(_MAGIC, ISAS.index(isa_hint), n, int(num_heads_q), int(num_heads_kv), int(head_dim),
                          _DTYPE_CODES[dtype], int(bool(causal)), int(window_size), int(fp8),
                          int(bool(enable_kv_split)), 0)
    body = torch.cat([query_start_loc[: n + 1].to("cpu", torch.int32), seq_lens[:n].to("cpu", torch.int32)])
    return torch.cat([torch.frombuffer(bytearray(header), dtype=torch.int8), body.view(torch.int8)])


def _metadata(tensor: torch.Tensor) -> dict:
    if tensor.dtype != torch.int8 or tensor.dim() != 1 or tensor.numel() < _HEADER.size:
        raise OutOfContractError("scheduler_metadata", "not a tensor built by get_scheduler_metadata")
    fields = _HEADER.unpack(tensor[: _HEADER.size].numpy().tobytes())
    if fields[0] != _MAGIC:
        raise OutOfContractError("scheduler_metadata", "not a tensor built by get_scheduler_metadata")
    n = fields[2]
    body = tensor[_HEADER.size:].clone().view(torch.int32)
    return {"isa": ISAS[fields[1]], "num_reqs": n, "num_heads_q": fields[3], "num_heads_kv": fields[4],
            "head_dim": fields[5], "dtype": [d for d, c in _DTYPE_CODES.items() if c == fields[6]][0],
            "causal": bool(fields[7]), "fp8": bool(fields[9]), "query_start_loc": body[: n + 1],
            "seq_lens": body[n + 1: 2 * n + 1]}


def _fp8_cache(kv_cache_dtype, key_cache, value_cache, k_scale, v_scale):
    """The cache's fp8 kind (None: not fp8), with the ops' own FP8 checks (``RuntimeError``, as they raise)."""
    fp8 = _fp8_kind(kv_cache_dtype)
    if fp8:
        if key_cache.dtype != torch.uint8 or value_cache.dtype != torch.uint8:
            raise RuntimeError("key_cache must be uint8 for FP8 path")
        if not (k_scale > 0 and v_scale > 0):
            raise RuntimeError("k_scale must be positive for FP8 path")
    return fp8


def cpu_attn_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                               value_cache: torch.Tensor, slot_mapping: torch.Tensor, isa: str, k_scale: float = 1.0,
                               v_scale: float = 1.0, kv_cache_dtype: str = "auto") -> None:
    """``torch.ops._C.cpu_attn_reshape_and_cache``: each token's K / V into its slot's packed tile, in place."""
    if key.dim() != 3 or value.dim() != 3 or key.stride(2) != 1 or value.stride(2) != 1:
        raise RuntimeError("cpu_attn_reshape_and_cache: key / value must be [tokens, heads, head_size], last dim "
                           "contiguous")
    fp8 = _fp8_cache(kv_cache_dtype, key_cache, value_cache, k_scale, v_scale)
    _check_isa(isa)
    check_dtype("key", key, _DTYPES)
    if not fp8 and (key_cache.dtype != key.dtype or value_cache.dtype != key.dtype or value.dtype != key.dtype):
        raise OutOfContractError("key_cache", f"an auto cache of {key_cache.dtype} / {value_cache.dtype} for "
                                              f"{key.dtype} keys")
    check_dtype("slot_mapping", slot_mapping, (torch.int64,))
    tokens, heads, head_dim = key.shape
    _check_head_dim(head_dim)
    k_tiles, v_tiles = _tiles(key_cache, "key_cache"), _tiles(value_cache, "value_cache")
    blocks, cache_heads, block_size, _ = key_cache.shape
    if block_size % BLOCK_ALIGNMENT or key_cache.shape[3] != head_dim or heads > cache_heads:
        raise OutOfContractError("key_cache", f"cache {tuple(key_cache.shape)} for {heads} heads of {head_dim} "
                                              f"(block size a multiple of {BLOCK_ALIGNMENT})")
    slots = slot_mapping[:tokens].to("cpu", torch.int64)
    mine = (slots >= 0).nonzero().flatten()
    if mine.numel() == 0:
        return
    slots = slots[mine]
    check_index_range("slot_mapping", slots // block_size, blocks, access="write")
    k_index, v_index = _layout(isa, block_size, head_dim)
    block = (slots // block_size)[:, None, None]
    offset = slots % block_size
    head = torch.arange(heads)[None, :, None]
    k_rows, v_rows = key.detach().to("cpu")[mine], value.detach().to("cpu")[mine]
    if fp8:
        k_rows, v_rows = _quantise_e4m3(k_rows, 1.0 / float(k_scale)), _quantise_e4m3(v_rows, 1.0 / float(v_scale))
    k_tiles[block, head, k_index[offset][:, None, :]] = k_rows.to(key_cache.dtype)
    v_tiles[block, head, v_index[offset][:, None, :]] = v_rows.to(value_cache.dtype)


def cpu_attention_with_kv_cache(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                                output: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                                scale: float, causal: bool, alibi_slopes: torch.Tensor | None, sliding_window: int,
                                block_table: torch.Tensor, softcap: float, scheduler_metadata: torch.Tensor,
                                s_aux: torch.Tensor | None, dynamic_causal: torch.Tensor | None = None,
                                k_scale: float = 1.0, v_scale: float = 1.0, kv_cache_dtype: str = "auto") -> None:
    """``torch.ops._C.cpu_attention_with_kv_cache``: paged GQA attention into ``output`` (see the module docstring)."""
    if query.dim() != 3 or query.stride(2) != 1 or key_cache.dim() != 4 or value_cache.dim() != 4:
        raise RuntimeError("cpu_attention_with_kv_cache: query [tokens, heads, head_size] (last dim contiguous), "
                           "4-D caches")
    for flag, present in (("alibi_slopes", alibi_slopes is not None), ("s_aux", s_aux is not None),
                          ("dynamic_causal", dynamic_causal is not None),
                          ("sliding_window", int(sliding_window) != -1), ("softcap", float(softcap) != 0.0)):
        if present:
            raise OutOfContractError(flag, "is not modelled")
    fp8 = _fp8_cache(kv_cache_dtype, key_cache, value_cache, k_scale, v_scale)
    for flag, tensor in (("query", query), ("key_cache", key_cache), ("output", output)):
        if tensor.device.type != "cpu":
            raise OutOfContractError(flag, f"on {tensor.device}: a CPU kernel")
    meta = _metadata(scheduler_metadata)
    isa = meta["isa"]
    check_dtype("query", query, _DTYPES)
    if isa == "amx" and query.dtype != torch.bfloat16:
        raise OutOfContractError("query", f"the amx kernel is compiled for bf16 only, not {query.dtype}")
    if not fp8 and (key_cache.dtype != query.dtype or value_cache.dtype != query.dtype):
        raise OutOfContractError("key_cache", f"an auto cache of {key_cache.dtype} for a {query.dtype} query")
    if output.dtype != query.dtype or tuple(output.shape[1:]) != tuple(query.shape[1:]):
        raise OutOfContractError("output", f"{tuple(output.shape)} {output.dtype} for a query "
                                           f"{tuple(query.shape)} {query.dtype}")
    check_dtype("block_table", block_table, (torch.int32,))
    tokens, heads, head_dim = query.shape
    _check_head_dim(head_dim)
    blocks, kv_heads, block_size, _ = key_cache.shape
    if block_size % BLOCK_ALIGNMENT:
        raise OutOfContractError("key_cache", f"block size {block_size} is not a multiple of {BLOCK_ALIGNMENT}")
    qsl = query_start_loc.to("cpu", torch.int32)
    lens = seq_lens.to("cpu", torch.int32)
    n = meta["num_reqs"]
    call = (heads, kv_heads, head_dim, query.dtype, bool(causal), fp8)
    scheduled = (meta["num_heads_q"], meta["num_heads_kv"], meta["head_dim"], meta["dtype"], meta["causal"],
                 meta["fp8"])
    if call != scheduled or qsl.numel() < n + 1 or lens.numel() < n \
            or not torch.equal(qsl[: n + 1], meta["query_start_loc"]) or not torch.equal(lens[:n], meta["seq_lens"]):
        raise OutOfRangeRead("scheduler_metadata", f"built for (heads, kv heads, head dim, dtype, causal, fp8) "
                                                   f"{scheduled}, query_start_loc {meta['query_start_loc'].tolist()}, "
                                                   f"seq_lens {meta['seq_lens'].tolist()}; this call has {call}, "
                                                   f"{qsl.tolist()}, {lens.tolist()}: the kernel would run the "
                                                   "schedule's work items over these tensors")
    if heads % kv_heads:
        raise OutOfContractError("key_cache", f"{heads} query heads over {kv_heads} KV heads")
    k_tiles, v_tiles = _tiles(key_cache, "key_cache"), _tiles(value_cache, "value_cache")
    k_index, v_index = _layout(isa, block_size, head_dim)
    group = heads // kv_heads
    for r in range(n):
        start, end, seq_len = int(qsl[r]), int(qsl[r + 1]), int(lens[r])
        q_len = end - start
        if q_len <= 0:
            continue
        if end > tokens:
            raise OutOfRangeRead("query_start_loc", f"request {r} ends at row {end} of {tokens}")
        result = torch.zeros(q_len, heads, head_dim, dtype=torch.float64)
        if seq_len > 0:
            needed = -(-seq_len // block_size)
            if block_table.shape[1] < needed:
                raise OutOfRangeRead("block_table", f"request {r}: {seq_len} keys need {needed} blocks, the row has "
                                                    f"{block_table.shape[1]}")
            ids = block_table[r, :needed].to("cpu", torch.int64)
            check_index_range("block_table", ids, blocks)
            k = k_tiles[ids][:, :, k_index]  # [needed, kv_heads, block_size, d]
            v = v_tiles[ids][:, :, v_index]
            k = _read_values(k.permute(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)[:seq_len], fp8, k_scale)
            v = _read_values(v.permute(0, 2, 1, 3).reshape(-1, kv_heads, head_dim)[:seq_len], fp8, v_scale)
            k = k.repeat_interleave(group, dim=1)  # [n, heads, d]: head h reads KV head h // group
            v = v.repeat_interleave(group, dim=1)
            q = as_float64(query[start:end])  # [q_len, heads, d]
            scores = float(scale) * torch.einsum("qhd,nhd->hqn", q, k)
            visible = bottom_right_visible(q_len, torch.arange(seq_len), seq_len, causal=bool(causal))
            result, _ = attend(scores, v, visible)
        write_out(result, output[start:end], query.dtype, output.device)


EMULATIONS = {
    "torch.ops._C:get_scheduler_metadata": get_scheduler_metadata,
    "torch.ops._C:cpu_attn_reshape_and_cache": cpu_attn_reshape_and_cache,
    "torch.ops._C:cpu_attention_with_kv_cache": cpu_attention_with_kv_cache,
}
