"""A vLLM check's requests as the engine holds them: the rank's cache and its slots, the top-k, the new tokens.

The harness hands a paged cache and a block table; vLLM's model runner would
have written each token at the slot its ``_compute_slot_mappings_kernel``
gives it on this rank. These helpers lay the same tokens out that way, in
the cache dtype and layout the backend reads.
"""

from __future__ import annotations

from typing import Any

from .model import loaded_kv_scale
from .support import current_platform_fp8


def rank_slots(inputs: Any, block: int, rank: int, world: int, interleave: int) -> tuple[Any, Any]:
    """``(block_table, slots)``: the rank's block table and the slot of every cached token.

    Slots are what the V2 model runner's ``_compute_slot_mappings_kernel``
    computes for this rank (``PAD_SLOT_ID`` for other ranks' tokens), for all
    tokens of all requests in order. The block table is the harness's
    shuffled one, cut to the blocks of one rank (a block holds ``block`` local
    tokens of ``block * N`` positions).
    """
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm.v1.worker.gpu.block_table import _compute_slot_mappings_kernel

    device = inputs.q.device
    seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
    b = len(seqlens)
    blocks = [-(-n // (block * world)) for n in seqlens]
    table = torch.zeros(b, max(max(blocks, default=0), 1), dtype=torch.int32, device=device)
    for i, n in enumerate(blocks):
        table[i, :n] = inputs.block_table[i, :n]
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in seqlens]).to(device)
    starts = torch.tensor([0] + seqlens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    total = int(starts[-1])
    slots = torch.empty(1, max(total, 1), dtype=torch.int64, device=device)
    ptrs = torch.tensor([table.data_ptr()], dtype=torch.uint64, device=device)
    _compute_slot_mappings_kernel[(1, b + 1)](
        slots.shape[1], torch.arange(b, dtype=torch.int32, device=device), starts, positions,
        ptrs, torch.tensor([table.stride(0)], dtype=torch.int32, device=device),
        torch.tensor([block], dtype=torch.int32, device=device),
        torch.tensor([True], device=device), torch.tensor([True], device=device),
        slots, slots.stride(0), rank, CP_SIZE=world, CP_INTERLEAVE=interleave, PAD_ID=PAD_SLOT_ID,
        TRITON_BLOCK_SIZE=1024)
    return table, slots[0, :total]


def nan_cache(shape: tuple[int, ...], spec_dtype: Any, device: Any) -> Any:
    """A cache of vLLM's storage dtype (bytes of the platform's fp8 format for fp8), every value the
    free-slot value (``kernels.inputs.free_slot_value``: NaN, or zero for a server's fresh cache)."""
    import torch

    from ...kernels.inputs import free_slot_value

    cache = torch.empty(shape, dtype=spec_dtype, device=device)
    (cache.view(current_platform_fp8()) if spec_dtype == torch.uint8 else cache).fill_(free_slot_value())
    return cache


def stored(rows: Any, cache_dtype: Any, kv_scale: float | None = None) -> Any:
    """``rows`` as the cache holds them: fp8 values as the bytes of the platform's own fp8 format.

    The check's fp8 values are e4m3fn of ``x / kv_scale``; ROCm on gfx942
    stores and reads e4m3fnuz (``current_platform.fp8_dtype()``) of ``x /``
    the loaded scale (doubled there: ``loaded_kv_scale``), as its cache-write
    op would have written them. Every value must convert exactly (else the
    adapter's error: the check would compare other numbers than it wrote).
    """
    import torch

    from ...core.errors import AdapterError

    if cache_dtype != torch.uint8:
        return rows.to(cache_dtype)
    fp8 = current_platform_fp8()
    if rows.dtype != fp8:
        ratio = 1.0 if kv_scale is None else float(kv_scale) / float(loaded_kv_scale(kv_scale))
        converted = (rows.to(torch.float32) * ratio).to(fp8)
        if not torch.equal(converted.to(torch.float32), rows.to(torch.float32) * ratio):
            raise AdapterError("kernel check", f"the check's {rows.dtype} cache values do not convert exactly to "
                                               f"the platform's {fp8}")
        rows = converted
    return rows.view(torch.uint8)


def rank_cache(inputs: Any, config: Any, rank: int, world: int, interleave: int,
                spec: Any) -> tuple[Any, Any, Any]:
    """``(kv_cache [blocks, block, d], block_table, dcp_local_seq_lens)`` of this rank (MLA).

    Every token is written at the slot vLLM's model runner gives it on this
    rank (``rank_slots``); the rest of the cache is NaN. Local lengths come
    from the runner's ``prepare_dcp_local_seq_lens``.
    """
    import torch

    device = inputs.q.device
    block = config.cache_config.block_size
    table, slots = rank_slots(inputs, block, rank, world, interleave)
    seqlens = [int(n) for n in inputs.cache_seqlens.tolist()]
    ds_mla = getattr(spec, "cache_dtype_str", None) == "fp8_ds_mla"
    width = DS_MLA_BYTES if ds_mla else inputs.kv_cache.shape[-1]
    cache = nan_cache((inputs.kv_cache.shape[0], block, width), spec.dtype, device)
    if slots.numel():
        rows = torch.cat([dense_rows(inputs.kv_cache, inputs.block_table, i, n) for i, n in enumerate(seqlens)])
        rows = rows.reshape(slots.numel(), -1)
        if ds_mla:
            from vllm.v1.attention.backends.utils import PAD_SLOT_ID

            mine = slots != PAD_SLOT_ID
            cache.view(-1, width)[slots[mine]] = ds_mla_rows(rows[mine], inputs.kv_scale)
        else:
            write_rows(cache.view(-1, cache.shape[-1]), slots, rows, inputs.kv_scale)
    local = None
    if world > 1:
        from vllm.v1.worker.gpu.cp_utils import prepare_dcp_local_seq_lens

        b = len(seqlens)
        buffer = torch.zeros(b, dtype=torch.int32, device=device)
        local = prepare_dcp_local_seq_lens(buffer, inputs.cache_seqlens.to(device), b, world, rank, interleave,
                                           num_reqs_padded=b)
    return cache, table, local


#: Bytes per token of vLLM's ``fp8_ds_mla`` cache (DeepSeek-V3.2 on FLASHMLA_SPARSE, flashmla_sparse.py's
#: layout note): 512 e4m3 NoPE values, 4 float32 scales (one per 128 of them), 64 bf16 RoPE values.
DS_MLA_BYTES = 656


def ds_mla_rows(rows: Any, kv_scale: float | None) -> Any:
    """The check's e4m3 rows (value ``raw · kv_scale``) as ``fp8_ds_mla`` records ``[n, 656]`` uint8, exactly.

    The NoPE bytes are the check's own e4m3 bytes with ``kv_scale`` as each tile's
    scale; the RoPE tail is ``raw · kv_scale`` in bf16 (exact: an e4m3 value times a scale of at most
    three significant bits, ``inputs.calibrated_scale``). vLLM's own writer of this format (``concat_and_cache_mla``
    with ``fp8_ds_mla``, per-tile amax scales) is the model runner's step, not run here.
    """
    import torch

    from ...core.errors import AdapterError

    scale = 1.0 if kv_scale is None else float(kv_scale)
    if rows.dtype != torch.float8_e4m3fn or rows.shape[-1] != 576:
        raise AdapterError("kernel check", f"fp8_ds_mla records need e4m3fn rows of 576, got {rows.dtype} "
                                           f"{tuple(rows.shape)}")
    out = torch.empty(rows.shape[0], DS_MLA_BYTES, dtype=torch.uint8, device=rows.device)
    out[:, :512] = rows[:, :512].contiguous().view(torch.uint8)
    out[:, 512:528] = torch.full((rows.shape[0], 4), scale, dtype=torch.float32, device=rows.device).view(torch.uint8)
    rope = rows[:, 512:].to(torch.float64) * scale
    if not torch.equal(rope.to(torch.bfloat16).to(torch.float64), rope):
        raise AdapterError("kernel check", "the check's RoPE values do not convert exactly to bf16")
    out[:, 528:] = rope.to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def write_rows(flat: Any, slots: Any, rows: Any, kv_scale: float | None = None) -> None:
    """``flat[slot] = row`` for this rank's tokens (``PAD_SLOT_ID`` marks the others'); fp8 rows as bytes."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    flat[slots[mine]] = stored(rows[mine], flat.dtype, kv_scale)


def dense_rows(cache: Any, block_table: Any, i: int, n: int) -> Any:
    """Request ``i``'s ``n`` cached rows in position order ``[n, ...]`` (the harness's paged cache)."""
    page = cache.shape[1]
    pages = block_table[i, : -(-n // page)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def new_tokens(inputs: Any, s_q: int, kv_scale: float | None) -> tuple[Any, Any]:
    """``(k_c_normed [b*s_q, kv_lora_rank], k_pe [b*s_q, 1, rope])``: each request's last ``s_q`` cached rows.

    What the model computed for the tokens being verified (the cache holds them
    too, written before attention runs); an fp8 cache's rows dequantised, the
    values the model had before the write quantised them.
    """
    import torch

    d_v = inputs.head_dim_v
    rows = []
    for i, n in enumerate(int(x) for x in inputs.cache_seqlens.tolist()):
        dense = dense_rows(inputs.kv_cache, inputs.block_table, i, n)[n - s_q:, 0]  # [s_q, d_qk]
        value = dense.to(torch.float64) * (kv_scale if kv_scale is not None else 1.0)
        rows.append(value.to(inputs.q.dtype))
    latent = torch.cat(rows)
    return latent[:, :d_v].contiguous(), latent[:, None, d_v:].contiguous()


def fill_topk(layer: Any, topk_indices: Any, num_tokens: int) -> Any:
    """The harness's selection into the layer's top-k buffer, as the indexer leaves it for a decode batch.

    ``SparseAttnIndexer`` sets the batch's rows to -1 (``topk_indices_buffer[:num_tokens] = -1``,
    sparse_attn_indexer.py) and writes each token's top-k, request-relative positions, into the
    first ``index_topk`` columns; a token with fewer candidates keeps -1 after them. The selection is
    ``[b, s_q, K]`` with ``K`` at most the buffer's width; the rest of each row stays -1.
    """
    from ...core.errors import AdapterError

    buffer = layer.impl.topk_indices_buffer
    if buffer is None:
        raise AdapterError("kernel check", f"vLLM's {type(layer.impl).__name__} has no top-k buffer")
    selection = topk_indices.reshape(num_tokens, -1).to(device=buffer.device, dtype=buffer.dtype)
    if selection.shape[1] > buffer.shape[1]:
        raise AdapterError("kernel check", f"a selection of {selection.shape[1]} tokens does not fit vLLM's top-k "
                                           f"buffer of width {buffer.shape[1]}")
    buffer[:num_tokens] = -1
    buffer[:num_tokens, : selection.shape[1]] = selection
    return buffer


def spec_tokens(cell: Any) -> tuple[int, str | None]:
    """``(speculative tokens per request, method)`` of the cell's spec setting (``(0, None)`` without one)."""
    from ...core.spec import parse_spec

    spec = parse_spec(str(cell.spec))
    return (spec.s_q - 1, spec.algorithm) if spec.enabled else (0, None)


def write_split_tokens(cache: Any, slots: Any, k: Any, v: Any, block: int, kv_scale: float | None) -> None:
    """Token ``t`` at slot ``s`` into a split K/V cache ``[2, blocks, block, kv_heads * head_size]`` (``Backend.split_kv_cache``).

    Where ``PagedAttention.split_kv_cache`` reads it: K ``[s // block, h, :, s % block, :]`` of the
    ``[blocks, kv_heads, head_size // x, block, x]`` view, V ``[s // block, h, :, s % block]`` of
    ``[blocks, kv_heads, head_size, block]``.
    """
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    slots, k, v = slots[mine], k[mine], v[mine]
    n, h_kv, d = k.shape
    x = 16 // cache.element_size()
    blocks = cache.shape[1]
    key_cache = cache[0].view(blocks, h_kv, d // x, block, x)
    value_cache = cache[1].view(blocks, h_kv, d, block)
    key_cache[slots // block, :, :, slots % block, :] = stored(k, cache.dtype, kv_scale).view(n, h_kv, d // x, x)
    value_cache[slots // block, :, :, slots % block] = stored(v, cache.dtype, kv_scale)


def impl_writes_tokens(layer: Any, cache: Any, slots: Any, k: Any, v: Any, inputs: Any, split: bool) -> None:
    """Every cached token through vLLM's ``do_kv_cache_update`` (``CPU_ATTN``: ``cpu_attn_reshape_and_cache``).

    The keys and values are the model's (an fp8 cache's rows dequantised with
    the check's ``kv_scale``, which the layer holds as its ``_k_scale``); the
    impl quantises and packs them as its kernel reads them.
    """
    import torch

    from ...core.errors import AdapterError

    if split:
        raise AdapterError("kernel check", f"vLLM's {type(layer.impl).__name__} splits the cell's blocks into "
                                           "kernel blocks; its packed tiles are not re-laid-out here")
    scale = inputs.kv_scale if inputs.kv_scale is not None else 1.0
    dtype = inputs.q.dtype
    key = (k.to(torch.float64) * scale).to(dtype).to(cache.device)
    value = (v.to(torch.float64) * scale).to(dtype).to(cache.device)
    layer.impl.do_kv_cache_update(layer, key, value, cache, slots)


def write_tokens(cache: Any, slots: Any, rows: Any, block: int, kv_scale: float | None = None) -> None:
    """Token ``t`` at slot ``s``: ``cache[s // block, :, s % block] = rows[t]`` (this layout's heads-first blocks)."""
    import torch
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    mine = slots != PAD_SLOT_ID
    slots, rows = slots[mine], rows[mine]
    cache[slots // block, :, slots % block] = stored(rows, cache.dtype, kv_scale)


def graph_padded_size(options: Any, b: int, s_q: int, builder: Any, config: Any, spec: Any) -> int | None:
    """The request count of the FULL CUDA graph vLLM's runner replays a uniform decode batch of ``b``
    requests of ``s_q`` tokens on, padded (None: the cell's server runs the batch without dummy requests).

    ``options["graph_padding"]``: the request counts of the server's FULL decode graphs, as its start-up
    resolved them (``checks.decode_graph_sizes``). The dispatcher (``CudaGraphManager.dispatch``) takes
    the smallest graph that holds the batch; a batch that is itself a captured size replays without
    dummies, so the check takes the graph a batch of ``b`` replays when it is padded past its own size:
    the smallest captured size above ``b`` (``dispatch``'s "padded to the DP maximum": a data-parallel
    peer with more requests). The builder must take FULL graphs for single-token decode
    (``AttentionCGSupport``).

    Decode batches only (``s_q == 1``): a server runs the builder on the padded batch every step, but
    the layer's forward in Python only once, at capture, on the capture batch (every request full);
    a replay runs the captured kernels on the padded batch's buffers. The check runs the forward on
    the padded batch, which for a padded *verify* batch reaches Python-level validation a replay
    never runs (FlashInfer MLA's ``cum_seq_lens_q[-1]`` against the query rows: a false finding).
    """
    from vllm.v1.attention.backend import AttentionCGSupport

    if s_q != 1:
        return None
    if type(builder).get_cudagraph_support(config, spec).value < AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE.value:
        return None
    larger = [int(n) for n in options.get("graph_padding") or () if int(n) > b]
    return min(larger) if larger else None


def pad_for_graph(b: int, s_q: int, padded: int, seq_lens: Any, table: Any, local: Any) -> tuple[Any, Any, Any, Any]:
    """``(query_start_loc, seq_lens, block_table, dcp_local_seq_lens)`` of ``b`` requests padded to ``padded``
    as the V2 runner pads them for a FULL graph (``prepare_inputs``, ``prepare_pos_seq_lens``,
    ``gather_block_tables``): each dummy request has no query token (its ``query_start_loc`` repeats the
    batch's token count), ``seq_len`` 0, a block-table row of zeros (the null block) and a DCP length 0."""
    import torch

    dummies = padded - b
    qsl = torch.tensor([i * s_q for i in range(b + 1)] + [b * s_q] * dummies, dtype=torch.int32)
    seq_lens = torch.cat([seq_lens, seq_lens.new_zeros(dummies)])
    table = torch.cat([table, table.new_zeros(dummies, table.shape[1])])
    if local is not None:
        local = torch.cat([local, local.new_zeros(dummies)])
    return qsl, seq_lens, table, local


def free_null_block(cache: Any, table: Any, seqlens: list[int], block: int, world: int) -> None:
    """Block 0 made vLLM's null block, in place: free (the free-slot value) and no request's.

    vLLM's block pool reserves block 0 (``BlockPool.null_block``) and a padded request's block-table
    row points there; the check's shuffled pages may have given it to a request, whose page then moves
    to a block no request holds."""
    used = [-(-n // (block * world)) for n in seqlens]
    held = {int(x) for i, n in enumerate(used) for x in table[i, :n].tolist()}
    if 0 not in held:
        return
    free = next((k for k in range(1, cache.shape[0]) if k not in held), None)
    if free is None:
        from ...core.errors import AdapterError

        raise AdapterError("kernel check", "the check's cache has no free block to move block 0's page to")
    cache[free] = cache[0]
    cache[0] = nan_cache(tuple(cache.shape[1:]), cache.dtype, cache.device)
    for i, n in enumerate(used):
        row = table[i, :n]
        row[row == 0] = free
