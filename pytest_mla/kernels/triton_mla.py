"""The project's own Triton MLA / GQA decode kernel: paged KV cache, split-KV, DCP- and tree-aware.

Two stages, like SGLang's Triton decode and FlashMLA's flash-decoding:

1. ``_mla_decode_stage1_kernel``, grid ``(b, h_kv * row_blocks, num_splits)``:
   each program takes ``BLOCK_M`` query rows of one KV head (rows are the
   ``s_q × heads_per_kv`` (query token, head) pairs that share that head's KV,
   so every head of an MLA model shares one tile load), runs an online softmax
   over its slice of the request's tokens and writes ``out_s = acc / sum`` and
   ``lse_s`` in fp32.
2. ``_merge_states_kernel`` merges the splits by their LSE. The same kernel
   is the public :func:`merge_attention_states` that DCP uses across ranks.
   With one split, stage 1 writes the final output and stage 2 is skipped.

The head dim is handled as two pieces: ``[0, d_v)`` (for MLA also V, read
from the same tile: ``kv_lora_rank``) and the tail ``[d_v, d_qk)`` (MLA's
rope part; empty for GQA with ``d_qk == d_v``).

Conventions (shared with ``reference.py``): natural-log LSE ``[b, h_q, s_q]``;
a query with no visible key gets ``out = 0`` and ``lse = -inf`` (FlashMLA uses
``+inf``; ``-inf`` is the identity of the LSE merge), never NaN.
"""

from __future__ import annotations

from . import _mode

TRITON_MODE = _mode.ensure_triton_mode()  # before `import triton`: decides interpreter vs GPU

import dataclasses  # noqa: E402
import math  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = [
    "TRITON_MODE",
    "default_num_splits",
    "merge_attention_states",
    "merge_attention_states_torch",
    "mla_decode",
]

_LN2 = math.log(2.0)
_LOG2E = 1.0 / _LN2
_MAX_TREE_QUERIES = 64  # the tree mask travels as one int64 bitmask per (request, query)
_MAX_SPLITS = 256
_HOST_UPCAST_MAX_ELEMENTS = 1 << 26  # interpreter: widen bf16 caches up to this size on the host
_FP8_DTYPES = (torch.float8_e4m3fn,)
_Q_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _key_positions(offs_n, dcp_rank, dcp_world_size, dcp_interleave, HAS_DCP: tl.constexpr):
    """Global position of each local token: ``(j // I) * N * I + r * I + j % I`` under DCP, else ``j``."""
    if HAS_DCP:
        return (offs_n // dcp_interleave) * (dcp_world_size * dcp_interleave) \
            + dcp_rank * dcp_interleave + offs_n % dcp_interleave
    return offs_n


@triton.jit
def _visible_mask(key_pos, kv_mask, q_pos, tree_bits, total, s_q,
                  HAS_GLOBAL_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr, HAS_TREE: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]``: which keys (global ``key_pos``) each query row (at ``q_pos``) may attend."""
    visible = kv_mask[None, :]  # [1, BLOCK_N], broadcast to [BLOCK_M, BLOCK_N] by the masks below
    if HAS_GLOBAL_SEQLENS:
        visible = visible & (key_pos < total)[None, :]
    if CAUSAL:
        if HAS_TREE:
            # prefix keys always visible; draft key t visible to row i iff bit t of row i
            draft = key_pos - (total - s_q)  # [BLOCK_N]
            is_draft = (draft >= 0) & (draft < s_q)
            shift = tl.where(is_draft, draft, 0).to(tl.int64)
            tree_mask = ((tree_bits[:, None] >> shift[None, :]) & 1) != 0  # [BLOCK_M, BLOCK_N]
            causal_mask = (draft < 0)[None, :] | (is_draft[None, :] & tree_mask)
        else:
            causal_mask = key_pos[None, :] <= q_pos[:, None]  # [BLOCK_M, BLOCK_N]
        visible = visible & causal_mask
    return visible


@triton.jit
def _mla_decode_stage1_kernel(
    # pointers
    q_ptr,  # [b, s_q, h_q, d_qk]
    k_ptr,  # [num_pages, page_size, h_kv, d_qk]
    v_ptr,  # [num_pages, page_size, h_kv, d_v] (GQA; unused when SHARED_KV)
    block_table_ptr,  # [b, max_pages] int32
    cache_seqlens_ptr,  # [b] int32: tokens in this rank's cache
    global_seqlens_ptr,  # [b] int32: S, the request's global length (HAS_GLOBAL_SEQLENS)
    tree_bits_ptr,  # [b, s_q] int64: bit t of row i = tree_mask[b, i, t] (HAS_TREE)
    o_ptr,  # [num_splits, b, s_q, h_q, d_v] fp32 partials, or the final out when num_splits == 1
    lse_ptr,  # [num_splits, b, h_q, s_q] fp32
    # strides
    stride_q_b, stride_q_s, stride_q_h, stride_q_d,
    stride_k_page, stride_k_slot, stride_k_h, stride_k_d,
    stride_v_page, stride_v_slot, stride_v_h, stride_v_d,
    stride_bt_b, stride_bt_p,
    stride_tree_b, stride_tree_s,
    stride_o_split, stride_o_b, stride_o_s, stride_o_h, stride_o_d,
    stride_lse_split, stride_lse_b, stride_lse_h, stride_lse_s,
    # sizes
    s_q,
    heads_per_kv,  # h_q // h_kv: query heads sharing one KV head
    d_v,
    d_tail,  # d_qk - d_v
    num_splits,
    # scalars
    qk_scale_log2,  # softmax_scale * kv_scale * log2(e): scores in base 2
    v_scale,  # kv_scale (1.0 without one), applied to the output
    dcp_rank,
    dcp_world_size,
    dcp_interleave,
    # meta-parameters
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # query rows (token, head) per program
    BLOCK_N: tl.constexpr,  # cached tokens per tile
    BLOCK_DV: tl.constexpr,  # >= d_v, power of two
    BLOCK_DT: tl.constexpr,  # >= d_tail, power of two
    HAS_TAIL: tl.constexpr,
    SHARED_KV: tl.constexpr,  # MLA: V = K[..., :d_v]
    CAUSAL: tl.constexpr,
    HAS_TREE: tl.constexpr,
    HAS_DCP: tl.constexpr,  # dcp_world_size > 1: local token j sits at a strided global position
    HAS_GLOBAL_SEQLENS: tl.constexpr,
    UPCAST: tl.constexpr,  # interpreter: fp32 right after each load (no bf16 arithmetic there)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 operands (no tf32)
):
    tl.static_assert(BLOCK_M >= 16, "tl.dot needs at least 16 rows")
    tl.static_assert(BLOCK_N >= 16, "tl.dot needs at least 16 keys")
    tl.static_assert(BLOCK_DV >= 16)
    tl.static_assert(BLOCK_DT >= 16)
    tl.static_assert(not HAS_TREE or CAUSAL, "a tree mask refines the causal mask")

    pid_b = tl.program_id(0)
    pid_hm = tl.program_id(1)
    pid_s = tl.program_id(2)
    num_row_blocks = tl.cdiv(s_q * heads_per_kv, BLOCK_M)
    kv_head = pid_hm // num_row_blocks
    row_block = pid_hm % num_row_blocks

    # rows of this program: (query token i, query head h) pairs of one KV head
    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    row_mask = offs_m < s_q * heads_per_kv
    offs_i = offs_m // heads_per_kv  # query token
    offs_h = kv_head * heads_per_kv + offs_m % heads_per_kv  # query head
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < d_v

    seqlen = tl.load(cache_seqlens_ptr + pid_b)  # local tokens
    if HAS_GLOBAL_SEQLENS:
        total = tl.load(global_seqlens_ptr + pid_b)  # S
    else:
        total = seqlen
    q_pos = total - s_q + offs_i  # [BLOCK_M] global position of each query row
    if HAS_TREE:
        tree_bits = tl.load(tree_bits_ptr + pid_b * stride_tree_b + offs_i * stride_tree_s, mask=row_mask, other=0)
    else:
        tree_bits = tl.zeros([BLOCK_M], dtype=tl.int64)  # unused

    # this split's slice of the local tokens, a whole number of tiles
    tokens_per_split = tl.cdiv(tl.cdiv(seqlen, num_splits), BLOCK_N) * BLOCK_N
    split_start = pid_s * tokens_per_split
    split_end = tl.minimum(split_start + tokens_per_split, seqlen)

    q_row_ptrs = q_ptr + pid_b * stride_q_b + offs_i * stride_q_s + offs_h * stride_q_h  # [BLOCK_M]
    q_ptrs = q_row_ptrs[:, None] + offs_dv[None, :] * stride_q_d  # [BLOCK_M, BLOCK_DV]
    q = tl.load(q_ptrs, mask=row_mask[:, None] & dv_mask[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if HAS_TAIL:
        offs_dt = tl.arange(0, BLOCK_DT)
        dt_mask = offs_dt < d_tail
        q_tail_ptrs = q_row_ptrs[:, None] + (d_v + offs_dt[None, :]) * stride_q_d  # [BLOCK_M, BLOCK_DT]
        q_tail = tl.load(q_tail_ptrs, mask=row_mask[:, None] & dt_mask[None, :], other=0.0)
        if UPCAST:
            q_tail = q_tail.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base-2 scores)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    bt_row_ptr = block_table_ptr + pid_b * stride_bt_b
    for start_n in range(split_start, split_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # local token index
        kv_mask = offs_n < split_end
        # paged gather: page and slot per token, so any page size (1 .. > BLOCK_N) works
        page = tl.load(bt_row_ptr + (offs_n // PAGE_SIZE) * stride_bt_p, mask=kv_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
        k_row_ptrs = k_ptr + page * stride_k_page + slot * stride_k_slot + kv_head * stride_k_h  # [BLOCK_N]
        k_ptrs = k_row_ptrs[:, None] + offs_dv[None, :] * stride_k_d  # [BLOCK_N, BLOCK_DV]
        k = tl.load(k_ptrs, mask=kv_mask[:, None] & dv_mask[None, :], other=0.0)
        k = k.to(q.dtype)  # fp8 cache -> q dtype; fp32 under UPCAST
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N]
        if HAS_TAIL:
            k_tail_ptrs = k_row_ptrs[:, None] + (d_v + offs_dt[None, :]) * stride_k_d  # [BLOCK_N, BLOCK_DT]
            k_tail = tl.load(k_tail_ptrs, mask=kv_mask[:, None] & dt_mask[None, :], other=0.0)
            k_tail = k_tail.to(q.dtype)
            qk = tl.dot(q_tail, tl.trans(k_tail), qk, input_precision=DOT_PRECISION)
        qk = qk * qk_scale_log2

        key_pos = _key_positions(offs_n, dcp_rank, dcp_world_size, dcp_interleave, HAS_DCP)  # [BLOCK_N]
        visible = _visible_mask(key_pos, kv_mask, q_pos, tree_bits, total, s_q,
                                HAS_GLOBAL_SEQLENS, CAUSAL, HAS_TREE)  # [BLOCK_M, BLOCK_N]
        qk = tl.where(visible, qk, float("-inf"))

        # online softmax in base 2; rows that have seen no visible key keep m = -inf
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(qk - m_safe[:, None])  # [BLOCK_M, BLOCK_N]; 0 where masked
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if SHARED_KV:
            v = k  # MLA: V is the first d_v columns of the latent row
        else:
            v_ptrs = (v_ptr + page * stride_v_page + slot * stride_v_slot + kv_head * stride_v_h)[:, None] \
                + offs_dv[None, :] * stride_v_d  # [BLOCK_N, BLOCK_DV]
            v = tl.load(v_ptrs, mask=kv_mask[:, None] & dv_mask[None, :], other=0.0)
            v = v.to(q.dtype)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    out = acc * (v_scale / l_safe)[:, None]  # [BLOCK_M, BLOCK_DV]; 0 for rows with no visible key
    lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))  # natural log

    o_ptrs = (o_ptr + pid_s * stride_o_split + pid_b * stride_o_b + offs_i * stride_o_s
              + offs_h * stride_o_h)[:, None] + offs_dv[None, :] * stride_o_d
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & dv_mask[None, :])
    lse_ptrs = lse_ptr + pid_s * stride_lse_split + pid_b * stride_lse_b + offs_h * stride_lse_h + offs_i * stride_lse_s
    tl.store(lse_ptrs, lse, mask=row_mask)


@triton.jit
def _merge_states_kernel(
    # pointers
    o_in_ptr,  # [num_parts, b, s_q, h, d_v] partial outputs (ignored where their lse is -inf)
    lse_in_ptr,  # [num_parts, b, h, s_q] fp32
    o_ptr,  # [b, s_q, h, d_v]
    lse_ptr,  # [b, h, s_q] fp32
    # strides
    stride_oi_part, stride_oi_b, stride_oi_s, stride_oi_h, stride_oi_d,
    stride_li_part, stride_li_b, stride_li_h, stride_li_s,
    stride_o_b, stride_o_s, stride_o_h, stride_o_d,
    stride_lse_b, stride_lse_h, stride_lse_s,
    # sizes
    num_rows,  # b * s_q * h
    s_q,
    h,
    d_v,
    num_parts,
    # meta-parameters
    BLOCK_R: tl.constexpr,  # (request, query, head) rows per program
    BLOCK_DV: tl.constexpr,
):
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    row_mask = offs_r < num_rows
    offs_b = offs_r // (s_q * h)
    offs_i = (offs_r // h) % s_q
    offs_h = offs_r % h
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < d_v

    lse_in_ptrs = lse_in_ptr + offs_b * stride_li_b + offs_h * stride_li_h + offs_i * stride_li_s  # [BLOCK_R]
    o_in_ptrs = (o_in_ptr + offs_b * stride_oi_b + offs_i * stride_oi_s + offs_h * stride_oi_h)[:, None] \
        + offs_dv[None, :] * stride_oi_d  # [BLOCK_R, BLOCK_DV]

    lse_max = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    for part in range(num_parts):
        lse_part = tl.load(lse_in_ptrs + part * stride_li_part, mask=row_mask, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse_part.to(tl.float32))
    max_safe = tl.where(lse_max == float("-inf"), 0.0, lse_max)

    weight_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    for part in range(num_parts):
        lse_part = tl.load(lse_in_ptrs + part * stride_li_part, mask=row_mask, other=float("-inf")).to(tl.float32)
        live_mask = lse_part > float("-inf")  # empty partials are neither read nor weighted (their out may be NaN)
        weight = tl.where(live_mask, tl.exp(lse_part - max_safe), 0.0)
        o_part = tl.load(o_in_ptrs + part * stride_oi_part,
                         mask=(row_mask & live_mask)[:, None] & dv_mask[None, :], other=0.0)
        acc += weight[:, None] * o_part.to(tl.float32)
        weight_sum += weight

    has_parts = weight_sum > 0.0
    sum_safe = tl.where(has_parts, weight_sum, 1.0)
    out = acc / sum_safe[:, None]
    lse = tl.where(has_parts, max_safe + tl.log(sum_safe), float("-inf"))

    o_ptrs = (o_ptr + offs_b * stride_o_b + offs_i * stride_o_s + offs_h * stride_o_h)[:, None] \
        + offs_dv[None, :] * stride_o_d
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & dv_mask[None, :])
    tl.store(lse_ptr + offs_b * stride_lse_b + offs_h * stride_lse_h + offs_i * stride_lse_s, lse, mask=row_mask)


# --------------------------------------------------------------------------- launch heuristics


def _next_pow2(x: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(max(int(x), 1)))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # H100/H200-sized default when asked off-GPU


def _stage1_config(rows: int, d_v: int, interpreter: bool) -> dict:
    """Tile sizes and launch knobs for stage 1; ``rows = s_q * heads_per_kv``."""
    if interpreter:
        # numpy vectorises whole tiles: few, large programs are fastest
        return dict(BLOCK_M=min(_next_pow2(rows), 1024), BLOCK_N=128, num_warps=4, num_stages=1)
    # GPU choices below were checked by compiling for sm90 (ptxas -v) without a GPU: all spill-free.
    # They are not timed yet (no GPU in the session that wrote them): run benchmarks/kernel.py to tune.
    if d_v >= 256:  # MLA 512 + 64: acc [BLOCK_M, 512] fp32 in registers, K tile [BLOCK_N, 576] per stage
        if rows <= 16:
            return dict(BLOCK_M=16, BLOCK_N=32, num_warps=8, num_stages=2)  # 254 regs, 66 KiB smem
        return dict(BLOCK_M=32, BLOCK_N=16, num_warps=8, num_stages=3)  # 255 regs, 60 KiB smem
    if rows <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, num_warps=8, num_stages=2)  # d_v 128: 221 regs
    if rows <= 32:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=2)  # d_v 128: 176 regs
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)  # d_v 128: 221 regs


def default_num_splits(b: int, h_q: int, s_k_max: int, *, s_q: int = 1, h_kv: int = 1, d_v: int = 512,
                       num_sms: int | None = None, interpreter: bool | None = None) -> int:
    """KV splits per request so that stage 1 fills the GPU, each split keeping at least one tile of work.

    ``b * h_kv * row_blocks`` programs exist without splitting; splits are added
    until there are about two programs per SM, capped so that every split
    covers at least one ``BLOCK_N`` tile of the longest sequence. Under the
    interpreter, one split (no stage 2: fewer, larger numpy ops are faster).
    """
    if interpreter is None:
        interpreter = _mode.is_interpreter()
    if interpreter:
        return 1
    rows = s_q * max(h_q // max(h_kv, 1), 1)
    cfg = _stage1_config(rows, d_v, interpreter=False)
    programs = max(b, 1) * max(h_kv, 1) * triton.cdiv(rows, cfg["BLOCK_M"])
    target = 2 * (num_sms or 132)
    splits = triton.cdiv(target, programs)
    max_by_work = max(triton.cdiv(max(s_k_max, 1), cfg["BLOCK_N"]), 1)
    return int(max(1, min(splits, max_by_work, _MAX_SPLITS)))


# --------------------------------------------------------------------------- validation helpers


def _fail(msg: str) -> None:
    raise ValueError(msg)


def _check_tensor(name: str, t, ndim: int, dtypes: tuple, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        _fail(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        _fail(f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.device != device:
        _fail(f"{name} is on {t.device} but q is on {device}")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(f"{name} must be an int, got {value!r}")
    if value < minimum:
        _fail(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_device(device: torch.device) -> bool:
    """Return whether kernels run under the interpreter; reject tensors the mode cannot use."""
    interpreter = _mode.is_interpreter()
    if not interpreter and device.type != "cuda":
        _fail(f"q is on {device} but Triton runs on a GPU here (set TRITON_INTERPRET=1 before importing "
              f"pytest_mla.kernels.triton_mla to run on CPU)")
    return interpreter


# --------------------------------------------------------------------------- public API


def mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale=None, causal=True,
               kv_scale=None, num_splits=None, return_lse=True, *, v_cache=None, tree_mask=None,
               dcp_rank=0, dcp_world_size=1, dcp_interleave=1, global_seqlens=None, out=None,
               check_inputs=True):
    """Paged MLA (or GQA) decode attention with split-KV; returns ``(out, lse)`` or ``out``.

    Args (shapes; ``d_qk = kv_lora_rank + qk_rope_head_dim``, ``d_v = head_dim_v``):
        q: ``[b, s_q, h_q, d_qk]`` fp32 / fp16 / bf16.
        kv_cache: ``[num_pages, page_size, h_kv, d_qk]``, q's dtype or ``float8_e4m3fn``
            (then ``kv_scale`` is required: ``k = kv.float() * kv_scale``).
        block_table: ``[b, max_pages]`` int32; entries past a request's pages are never read.
        cache_seqlens: ``[b]`` int32, tokens in this rank's cache per request.
        head_dim_v: ``d_v <= d_qk``. With ``v_cache=None`` (MLA) V is ``kv_cache[..., :d_v]``.
        softmax_scale: default ``1/sqrt(d_qk)``.
        causal: query ``i`` sits at global position ``S - s_q + i`` (``S = global_seqlens[b]``
            if given, else ``cache_seqlens[b]``) and sees keys at global positions ``<=`` it.
        kv_scale: per-tensor dequantisation scale (python float), applied to K and V.
        num_splits: KV splits (stage 1 programs per request and head block); default
            :func:`default_num_splits`.
        v_cache: ``[num_pages, page_size, h_kv, d_v]`` for GQA; query head ``h`` uses KV head
            ``h // (h_q // h_kv)``.
        tree_mask: ``[b, s_q, s_q]`` bool (causal only, ``s_q <= 64``, diagonal True): key at
            global position ``g >= S - s_q`` is draft ``t = g - (S - s_q)``, visible to query
            ``i`` iff ``tree_mask[b, i, t]``; the prefix is always visible.
        dcp_rank, dcp_world_size, dcp_interleave: this rank's local token ``j`` has global
            position ``(j // I) * (N * I) + r * I + j % I``. ``global_seqlens`` ``[b]`` int32
            is required when ``N > 1``; keys at global positions ``>= S`` are never visible.
        out: optional ``[b, s_q, h_q, d_v]`` of q's dtype, fully overwritten.
        check_inputs: (extension) check the *values* of ``cache_seqlens``, ``block_table``
            and ``global_seqlens`` on the host (one device sync). Shape/dtype checks always
            run. Under the interpreter the value checks always run: it does no bounds checks.

    Returns:
        ``out`` ``[b, s_q, h_q, d_v]`` in q's dtype and ``lse`` ``[b, h_q, s_q]`` fp32 (natural
        log). A query with no visible key (empty sequence, empty DCP rank, ``S == 0``) gets
        ``out = 0`` and ``lse = -inf``, never NaN, so that an LSE merge drops it.

    Raises:
        ValueError: naming the argument and the offending values, before any launch.
    """
    args = _check_decode_args(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                              kv_scale, num_splits, v_cache, tree_mask, dcp_rank, dcp_world_size,
                              dcp_interleave, global_seqlens, out, check_inputs)
    b, s_q, h_q, _ = q.shape
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)  # [b, h_q, s_q]
    if out is None:
        out = torch.empty((b, s_q, h_q, head_dim_v), dtype=q.dtype, device=q.device)  # [b, s_q, h_q, d_v]
    if out.numel() and lse.numel():
        _launch_decode(args, q, kv_cache, v_cache, block_table, cache_seqlens, global_seqlens, tree_mask, out, lse)
    return (out, lse) if return_lse else out


@dataclasses.dataclass(frozen=True)
class _DecodeArgs:
    """What the checks resolved: the defaults filled in, the scalars normalised."""

    interpreter: bool
    head_dim_v: int
    softmax_scale: float
    kv_scale: float | None
    causal: bool
    num_splits: int | None
    dcp_rank: int
    dcp_world_size: int
    dcp_interleave: int
    check_inputs: bool


def _check_decode_args(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, kv_scale,
                       num_splits, v_cache, tree_mask, dcp_rank, dcp_world_size, dcp_interleave, global_seqlens,
                       out, check_inputs) -> _DecodeArgs:
    """Every check of :func:`mla_decode`'s arguments, before anything is allocated or launched."""
    # ---- shapes, dtypes, devices
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        _fail(f"q must be a 4-D tensor [b, s_q, h_q, d_qk], got "
              f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    device = q.device
    interpreter = _check_device(device)
    _check_tensor("q", q, 4, _Q_DTYPES, device)
    b, s_q, h_q, d_qk = q.shape
    kv_dtypes = (q.dtype,) + _FP8_DTYPES
    _check_tensor("kv_cache", kv_cache, 4, kv_dtypes, device)
    num_pages, page_size, h_kv, d_kv = kv_cache.shape
    if d_kv != d_qk:
        _fail(f"kv_cache head dim {d_kv} != q head dim {d_qk} (q {tuple(q.shape)}, kv_cache {tuple(kv_cache.shape)})")
    if page_size < 1 or h_kv < 1:
        _fail(f"kv_cache must have page_size >= 1 and h_kv >= 1, got shape {tuple(kv_cache.shape)}")
    if h_q < 1 or h_q % h_kv != 0:
        _fail(f"h_q ({h_q}) must be a positive multiple of h_kv ({h_kv})")
    head_dim_v = _check_int("head_dim_v", head_dim_v, 1)
    if head_dim_v > d_qk:
        _fail(f"head_dim_v ({head_dim_v}) must be <= the q/k head dim d_qk ({d_qk})")
    _check_tensor("block_table", block_table, 2, (torch.int32,), device)
    _check_tensor("cache_seqlens", cache_seqlens, 1, (torch.int32,), device)
    if block_table.shape[0] != b or cache_seqlens.shape[0] != b:
        _fail(f"block_table {tuple(block_table.shape)} and cache_seqlens {tuple(cache_seqlens.shape)} "
              f"must have b = {b} rows (q {tuple(q.shape)})")
    is_fp8 = kv_cache.dtype in _FP8_DTYPES
    if kv_scale is not None:
        if isinstance(kv_scale, torch.Tensor):
            kv_scale = float(kv_scale)
        if not isinstance(kv_scale, (int, float)) or not math.isfinite(kv_scale) or kv_scale <= 0:
            _fail(f"kv_scale must be a positive finite float, got {kv_scale!r}")
    elif is_fp8:
        _fail(f"kv_scale is required with a {kv_cache.dtype} kv_cache")
    if v_cache is not None:
        _check_tensor("v_cache", v_cache, 4, (kv_cache.dtype,), device)
        want = (num_pages, page_size, h_kv, head_dim_v)
        if tuple(v_cache.shape) != want:
            _fail(f"v_cache shape {tuple(v_cache.shape)} != [num_pages, page_size, h_kv, head_dim_v] = {want}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d_qk)
    if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale) or softmax_scale <= 0:
        _fail(f"softmax_scale must be a positive finite float, got {softmax_scale!r}")
    dcp_world_size = _check_int("dcp_world_size", dcp_world_size, 1)
    dcp_interleave = _check_int("dcp_interleave", dcp_interleave, 1)
    dcp_rank = _check_int("dcp_rank", dcp_rank, 0)
    if dcp_rank >= dcp_world_size:
        _fail(f"dcp_rank ({dcp_rank}) must be < dcp_world_size ({dcp_world_size})")
    if global_seqlens is not None:
        _check_tensor("global_seqlens", global_seqlens, 1, (torch.int32,), device)
        if global_seqlens.shape[0] != b:
            _fail(f"global_seqlens shape {tuple(global_seqlens.shape)} must be [b] = [{b}]")
    elif dcp_world_size > 1:
        _fail(f"global_seqlens is required when dcp_world_size > 1 (got dcp_world_size={dcp_world_size})")
    if tree_mask is not None:
        if not causal:
            _fail("tree_mask needs causal=True")
        _check_tensor("tree_mask", tree_mask, 3, (torch.bool,), device)
        if tuple(tree_mask.shape) != (b, s_q, s_q):
            _fail(f"tree_mask shape {tuple(tree_mask.shape)} != [b, s_q, s_q] = {(b, s_q, s_q)}")
        if s_q > _MAX_TREE_QUERIES:
            _fail(f"tree_mask supports s_q <= {_MAX_TREE_QUERIES}, got s_q={s_q}")
        if s_q and not bool(tree_mask.diagonal(dim1=1, dim2=2).all()):
            _fail("tree_mask diagonal must be True (each draft token sees itself)")
    if num_splits is not None:
        num_splits = _check_int("num_splits", num_splits, 1)
        if num_splits > _MAX_SPLITS:
            _fail(f"num_splits must be <= {_MAX_SPLITS}, got {num_splits}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.device != device or out.dtype != q.dtype \
                or tuple(out.shape) != (b, s_q, h_q, head_dim_v):
            desc = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                    else type(out).__name__)
            _fail(f"out must be [b, s_q, h_q, head_dim_v] = {(b, s_q, h_q, head_dim_v)} {q.dtype} on {device}, "
                  f"got {desc}")

    # ---- values (host sync): the interpreter reads raw memory, so out-of-range indices must never launch
    if check_inputs or interpreter:
        _check_values(block_table, cache_seqlens, global_seqlens, num_pages, page_size, s_q, causal,
                      dcp_rank, dcp_world_size, dcp_interleave)
    return _DecodeArgs(interpreter, head_dim_v, float(softmax_scale), float(kv_scale) if kv_scale is not None else None,
                       bool(causal), num_splits,
                       dcp_rank, dcp_world_size, dcp_interleave, bool(check_inputs))


def _launch_decode(args: _DecodeArgs, q, kv_cache, v_cache, block_table, cache_seqlens, global_seqlens, tree_mask,
                   out, lse) -> None:
    """Stage 1 (and stage 2 when split) into ``out`` / ``lse``, allocated by the caller."""
    interpreter, head_dim_v, causal = args.interpreter, args.head_dim_v, args.causal
    device = q.device
    b, s_q, h_q, d_qk = q.shape
    num_pages, page_size, h_kv, _ = kv_cache.shape
    num_splits = args.num_splits
    if num_splits is None:
        s_k_max = int(cache_seqlens.max()) if (args.check_inputs or interpreter) else block_table.shape[1] * page_size
        num_splits = default_num_splits(b, h_q, s_k_max, s_q=s_q, h_kv=h_kv, d_v=head_dim_v,
                                        num_sms=_num_sms(device), interpreter=interpreter)

    heads_per_kv = h_q // h_kv
    rows = s_q * heads_per_kv
    cfg = _stage1_config(rows, head_dim_v, interpreter)
    d_tail = d_qk - head_dim_v
    # Under the interpreter fp32->bf16/fp16 casts are not rounded: write fp32 and cast on the host.
    host_cast = interpreter and q.dtype != torch.float32
    if num_splits == 1:
        o_stage1 = torch.empty(out.shape, dtype=torch.float32, device=device) if host_cast else out
        o_stage1_5d = o_stage1.unsqueeze(0)
        lse_stage1 = lse.unsqueeze(0)
    else:
        o_stage1_5d = torch.empty((num_splits, b, s_q, h_q, head_dim_v), dtype=torch.float32, device=device)
        lse_stage1 = torch.empty((num_splits, b, h_q, s_q), dtype=torch.float32, device=device)

    tree_bits = None
    if tree_mask is not None:
        weights = torch.ones(s_q, dtype=torch.int64, device=device) << torch.arange(s_q, device=device)
        tree_bits = (tree_mask.to(torch.int64) * weights).sum(-1).contiguous()  # [b, s_q]; bit 63 wraps: fine
    if interpreter:
        # The interpreter's bf16 -> fp32 cast is a bit-level numpy emulation (slow); widening on the host is
        # exact and the kernel then runs its UPCAST (fp32) path on fp32 operands. Large pools stay as they are.
        q = q.float() if q.dtype == torch.bfloat16 else q
        if kv_cache.dtype == torch.bfloat16 and kv_cache.numel() <= _HOST_UPCAST_MAX_ELEMENTS:
            kv_cache = kv_cache.float()
            v_cache = v_cache.float() if v_cache is not None else None
    v_arg = v_cache if v_cache is not None else kv_cache
    scale = args.kv_scale if args.kv_scale is not None else 1.0
    dummy = cache_seqlens  # stands in for absent optional pointers (never read)

    grid = (b, h_kv * triton.cdiv(rows, cfg["BLOCK_M"]), num_splits)
    _mla_decode_stage1_kernel[grid](
        q, kv_cache, v_arg, block_table, cache_seqlens,
        global_seqlens if global_seqlens is not None else dummy,
        tree_bits if tree_bits is not None else dummy,
        o_stage1_5d, lse_stage1,
        *q.stride(), *kv_cache.stride(), *v_arg.stride(), *block_table.stride(),
        *(tree_bits.stride() if tree_bits is not None else (0, 0)),
        *o_stage1_5d.stride(), *lse_stage1.stride(),
        s_q, heads_per_kv, head_dim_v, d_tail, num_splits,
        args.softmax_scale * scale * _LOG2E, scale,
        args.dcp_rank, args.dcp_world_size, args.dcp_interleave,
        PAGE_SIZE=page_size,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_DV=_next_pow2(head_dim_v), BLOCK_DT=_next_pow2(d_tail), HAS_TAIL=d_tail > 0,
        SHARED_KV=v_cache is None,
        CAUSAL=bool(causal), HAS_TREE=tree_mask is not None,
        HAS_DCP=args.dcp_world_size > 1, HAS_GLOBAL_SEQLENS=global_seqlens is not None,
        UPCAST=interpreter,
        DOT_PRECISION="ieee",
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if num_splits == 1:
        if host_cast:
            out.copy_(o_stage1)
    else:
        _launch_merge(o_stage1_5d, lse_stage1, out, lse, interpreter)


def _check_values(block_table, cache_seqlens, global_seqlens, num_pages, page_size, s_q, causal,
                  dcp_rank, dcp_world_size, dcp_interleave) -> None:
    seqlens = cache_seqlens.to("cpu", torch.int64)  # [b]
    if bool((seqlens < 0).any()):
        _fail(f"cache_seqlens must be >= 0, got {seqlens.tolist()}")
    pages_needed = (seqlens + page_size - 1) // page_size  # [b]
    max_pages = block_table.shape[1]
    if bool((pages_needed > max_pages).any()):
        _fail(f"block_table has {max_pages} columns but cache_seqlens {seqlens.tolist()} with page_size "
              f"{page_size} need up to {int(pages_needed.max())} pages")
    table = block_table.to("cpu", torch.int64)
    used = torch.arange(max_pages)[None, :] < pages_needed[:, None]  # [b, max_pages]
    bad = used & ((table < 0) | (table >= num_pages))
    if bool(bad.any()):
        row, col = (int(x) for x in bad.nonzero()[0])
        _fail(f"block_table[{row}, {col}] = {int(table[row, col])} is outside [0, num_pages={num_pages}) "
              f"but holds tokens of cache_seqlens[{row}] = {int(seqlens[row])}")
    if global_seqlens is not None:
        totals = global_seqlens.to("cpu", torch.int64)
        if bool((totals < 0).any()):
            _fail(f"global_seqlens must be >= 0, got {totals.tolist()}")
        last = seqlens - 1  # position of each rank's last local token
        last_pos = (last // dcp_interleave) * (dcp_world_size * dcp_interleave) + dcp_rank * dcp_interleave \
            + last % dcp_interleave
        bad_rows = ((seqlens > 0) & (last_pos >= totals)).nonzero().flatten().tolist()
        if bad_rows:
            r = bad_rows[0]
            _fail(f"cache_seqlens[{r}] = {int(seqlens[r])} local tokens on dcp_rank {dcp_rank}/{dcp_world_size} "
                  f"(interleave {dcp_interleave}) reach global position {int(last_pos[r])} >= "
                  f"global_seqlens[{r}] = {int(totals[r])}")
    else:
        totals = seqlens
    if causal:
        short = ((totals > 0) & (totals < s_q)).nonzero().flatten().tolist()
        if short:
            r = short[0]
            _fail(f"causal decode with s_q={s_q} needs at least s_q tokens per request (or 0 for an empty "
                  f"request), but request {r} has {int(totals[r])}")


def _launch_merge(o_parts, lse_parts, out, lse, interpreter: bool) -> None:
    """Stage 2 / DCP merge: ``o_parts [R, b, s_q, h, d_v]``, ``lse_parts [R, b, h, s_q]`` -> ``out``, ``lse``."""
    num_parts, b, s_q, h, d_v = o_parts.shape
    num_rows = b * s_q * h
    host_cast = interpreter and out.dtype != torch.float32
    target = torch.empty(out.shape, dtype=torch.float32, device=out.device) if host_cast else out
    block_dv = _next_pow2(d_v)
    if interpreter:
        block_r = min(_next_pow2(num_rows), max(16, 65536 // block_dv))
    else:
        block_r = max(1, min(16, 4096 // block_dv))
    grid = (triton.cdiv(num_rows, block_r),)
    _merge_states_kernel[grid](
        o_parts, lse_parts, target, lse,
        *o_parts.stride(), *lse_parts.stride(), *target.stride(), *lse.stride(),
        num_rows, s_q, h, d_v, num_parts,
        BLOCK_R=block_r, BLOCK_DV=block_dv,
        num_warps=4,
    )
    if host_cast:
        out.copy_(target)


def _check_merge_inputs(outs, lses):
    if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)):
        _fail("outs and lses must be lists of tensors")
    if len(outs) == 0 or len(outs) != len(lses):
        _fail(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    o0 = outs[0]
    if not isinstance(o0, torch.Tensor) or o0.dim() != 4:
        _fail(f"outs[0] must be a 4-D tensor [b, s_q, h, d_v], got "
              f"{tuple(o0.shape) if isinstance(o0, torch.Tensor) else type(o0).__name__}")
    b, s_q, h, _ = o0.shape
    for r, (o, l) in enumerate(zip(outs, lses)):
        if not isinstance(o, torch.Tensor) or tuple(o.shape) != tuple(o0.shape) or o.dtype != o0.dtype \
                or o.device != o0.device:
            _fail(f"outs[{r}] must match outs[0] ({tuple(o0.shape)} {o0.dtype} on {o0.device})")
        if not isinstance(l, torch.Tensor) or tuple(l.shape) != (b, h, s_q) or not l.is_floating_point() \
                or l.device != o0.device:
            _fail(f"lses[{r}] must be a float tensor [b, h, s_q] = {(b, h, s_q)} on {o0.device}, got "
                  f"{tuple(l.shape) if isinstance(l, torch.Tensor) else type(l).__name__}")
    return o0


def merge_attention_states(outs, lses):
    """Merge partial attention results by LSE (Triton): the DCP cross-rank merge.

    ``outs[r]`` ``[b, s_q, h, d_v]`` and ``lses[r]`` ``[b, h, s_q]`` (natural log, mla_decode's
    layout) -> ``(out [b, s_q, h, d_v] in outs' dtype, lse [b, h, s_q] fp32)`` with
    ``lse = logsumexp_r lse_r`` and ``out = Σ_r exp(lse_r - lse) · out_r``. Partials with
    ``lse = -inf`` contribute nothing (their ``out`` is not read, NaN allowed); if all are
    ``-inf``: ``out = 0``, ``lse = -inf``.
    """
    o0 = _check_merge_inputs(outs, lses)
    interpreter = _check_device(o0.device)
    o_parts = torch.stack(list(outs))  # [R, b, s_q, h, d_v]
    if interpreter and o_parts.dtype == torch.bfloat16:
        o_parts = o_parts.float()  # exact; the interpreter's own bf16 cast is a slow bit-level emulation
    lse_parts = torch.stack([l.to(torch.float32) for l in lses])  # [R, b, h, s_q]
    out = torch.empty(o0.shape, dtype=o0.dtype, device=o0.device)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=o0.device)
    if out.numel() and lse.numel():
        _launch_merge(o_parts, lse_parts, out, lse, interpreter)
    elif lse.numel():
        lse.copy_(torch.logsumexp(lse_parts, 0))
    return out, lse


def merge_attention_states_torch(outs, lses):
    """Plain torch (fp32) version of :func:`merge_attention_states`; same contract, any device."""
    o0 = _check_merge_inputs(outs, lses)
    lse_parts = torch.stack([l.to(torch.float32) for l in lses])  # [R, b, h, s_q]
    live = lse_parts > float("-inf")
    lse_max = lse_parts.amax(0)  # [b, h, s_q]
    max_safe = torch.where(torch.isneginf(lse_max), 0.0, lse_max)
    weight = torch.where(live, torch.exp(lse_parts - max_safe), 0.0)  # [R, b, h, s_q]
    weight_sum = weight.sum(0)
    has_parts = weight_sum > 0
    lse = torch.where(has_parts, max_safe + torch.log(torch.where(has_parts, weight_sum, 1.0)), float("-inf"))
    w = (weight / torch.where(has_parts, weight_sum, 1.0)).permute(0, 1, 3, 2)[..., None]  # [R, b, s_q, h, 1]
    o_parts = torch.stack([o.to(torch.float32) for o in outs])  # [R, b, s_q, h, d_v]
    o_parts = torch.where(live.permute(0, 1, 3, 2)[..., None], o_parts, 0.0)  # drop NaN of empty partials
    out = (w * o_parts).sum(0).to(o0.dtype)
    return out, lse
