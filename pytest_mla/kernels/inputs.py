"""Seeded decode inputs, following FlashMLA's test practice.

* q and KV ~ ``randn / 10`` clamped to [-1, 1].
* Paged cache with a randomly permuted block table; cache slots past each
  sequence's length and spare pages are NaN, and unused block-table entries hold
  ``UNUSED_PAGE`` (2**30), so any out-of-bounds read shows as NaN or a crash.
* fp8 e4m3 KV carries a power-of-two ``kv_scale``, so the dequantised values are
  exact in bf16/fp16/fp32 and the reference sees exactly what the kernel sees.
* Speculative trees: ``gen_tree_mask`` draws a random draft tree per request.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import torch

__all__ = [
    "DTYPES",
    "UNUSED_PAGE",
    "DecodeInputs",
    "gen_decode_inputs",
    "gen_fp8",
    "gen_generator",
    "gen_paged_cache",
    "gen_poisoned_out",
    "gen_tree_mask",
    "gen_uniform_values",
]

#: Block-table value of an entry past a sequence's last page; never to be read.
UNUSED_PAGE = 2**30

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FP8_E4M3_MAX = 448.0
#: KV-cache dtypes of an fp8 cache: the torch dtype and its largest finite value.
FP8_DTYPES = {"fp8_e4m3": (torch.float8_e4m3fn, FP8_E4M3_MAX), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


@dataclasses.dataclass
class DecodeInputs:
    """One decode call's inputs (the kernel's arguments) on an unsharded cache."""

    q: torch.Tensor  # [b, s_q, h_q, d_qk] bf16/fp16/fp32
    kv_cache: torch.Tensor  # [num_pages, page_size, h_kv, d_qk] q.dtype, float8_e4m3fn or float8_e5m2
    block_table: torch.Tensor  # [b, max_pages] int32, UNUSED_PAGE past each sequence
    cache_seqlens: torch.Tensor  # [b] int32
    head_dim_v: int  # d_v
    softmax_scale: float
    v_cache: torch.Tensor | None = None  # [num_pages, page_size, h_kv, d_v] (GQA); None for MLA
    kv_scale: float | None = None  # dequantisation scale of an fp8 cache
    tree_mask: torch.Tensor | None = None  # [b, s_q, s_q] bool, speculative tree; None = causal
    causal: bool = True

    @property
    def shape(self) -> dict[str, int]:
        b, s_q, h_q, d_qk = self.q.shape
        return {"b": b, "s_q": s_q, "h_q": h_q, "h_kv": self.kv_cache.shape[2], "d_qk": d_qk,
                "d_v": self.head_dim_v, "page_size": self.kv_cache.shape[1]}

    def ref_args(self) -> dict:
        """Keyword arguments of ``ref_mla_decode`` (and the unsharded kernel call)."""
        return {"q": self.q, "kv_cache": self.kv_cache, "block_table": self.block_table,
                "cache_seqlens": self.cache_seqlens, "head_dim_v": self.head_dim_v,
                "softmax_scale": self.softmax_scale, "causal": self.causal, "kv_scale": self.kv_scale,
                "v_cache": self.v_cache, "tree_mask": self.tree_mask}

    def to(self, device: torch.device | str) -> "DecodeInputs":
        def move(x):
            return x.to(device) if isinstance(x, torch.Tensor) else x
        return dataclasses.replace(self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)})


def gen_generator(seed: int) -> torch.Generator:
    """A CPU generator; every ``gen_*`` draws from the one it is given, in a fixed order."""
    return torch.Generator().manual_seed(int(seed))


def gen_uniform_values(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """FlashMLA's value distribution in float32: ``clamp(randn / 10, -1, 1)``."""
    return (torch.randn(*shape, generator=generator) / 10).clamp(-1.0, 1.0)


def gen_fp8(x: torch.Tensor, *, scale: float | None = None, kind: str = "fp8_e4m3") -> tuple[torch.Tensor, float]:
    """Quantise to fp8 (``kind``: e4m3fn or e5m2) with a power-of-two scale: ``(x_fp8, kv_scale)``, ``x ≈ x_fp8 * kv_scale``.

    The scale maps the largest finite ``|x|`` into the format's range (448 for e4m3) unless given.
    """
    dtype, fmax = FP8_DTYPES[kind]
    if scale is None:
        finite = x[torch.isfinite(x)]
        amax = float(finite.abs().max()) if finite.numel() else 1.0
        scale = 2.0 ** math.ceil(math.log2(max(amax, 1e-30) / fmax))
    return (x / scale).to(dtype), scale


def gen_paged_cache(
    rows: Sequence[torch.Tensor],  # per request: [s_k, h_kv, d]
    page_size: int,
    generator: torch.Generator,
    *,
    v_rows: Sequence[torch.Tensor] | None = None,  # per request: [s_k, h_kv, d_v] (GQA)
    spare_pages: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Pack dense rows into a paged cache with a shuffled block table.

    Returns ``(cache [num_pages, page_size, h, d], v_cache or None, block_table
    [b, max_pages] int32)``. Pages are assigned in a random order; slots past a
    sequence's length and ``spare_pages`` never-referenced pages are NaN; the
    block table has one extra column so every row ends in ``UNUSED_PAGE``.
    """
    pages_per_req = [-(-r.shape[0] // page_size) for r in rows]
    num_pages = sum(pages_per_req) + spare_pages
    max_pages = max(pages_per_req, default=0) + 1
    order = torch.randperm(num_pages, generator=generator).to(torch.int32)

    def empty_like_rows(sample: torch.Tensor) -> torch.Tensor:
        cache = torch.empty(num_pages, page_size, *sample.shape[1:], dtype=sample.dtype)
        return cache.fill_(math.nan)

    cache = empty_like_rows(rows[0])
    v_cache = empty_like_rows(v_rows[0]) if v_rows is not None else None
    block_table = torch.full((len(rows), max_pages), UNUSED_PAGE, dtype=torch.int32)
    next_page = 0
    for i, n_pages in enumerate(pages_per_req):
        pages = order[next_page : next_page + n_pages]
        next_page += n_pages
        block_table[i, :n_pages] = pages
        n = rows[i].shape[0]
        for p, page in enumerate(pages.tolist()):
            lo, hi = p * page_size, min((p + 1) * page_size, n)
            cache[page, : hi - lo] = rows[i][lo:hi]
            if v_cache is not None:
                v_cache[page, : hi - lo] = v_rows[i][lo:hi]
    return cache, v_cache, block_table


def gen_tree_mask(topk: int, steps: int, generator: torch.Generator, *, batch: int = 1) -> torch.Tensor:
    """Random draft trees, ``[batch, s_q, s_q]`` bool with ``s_q = 1 + topk * steps``.

    Node 0 is the root (the verified token); every other node's parent is an
    earlier node with fewer than ``topk`` children and depth ``< steps``, and
    at most ``topk`` nodes of one depth have children: the shape of an EAGLE
    draft tree, whose draft loop expands its ``topk`` best nodes per step (so
    an engine's own tree builder can express every tree drawn here).
    ``mask[i, j]`` is true iff ``j`` is ``i`` or an ancestor of ``i``. With
    ``topk == 1`` this is the chain, i.e. lower-triangular. (A free parent
    always exists: otherwise every depth ``1..steps`` would hold ``topk`` or
    more nodes, more than the ``topk * steps`` non-root nodes placed so far.)
    """
    s_q = 1 + topk * steps
    masks = torch.zeros(batch, s_q, s_q, dtype=torch.bool)
    for b in range(batch):
        parent, depth, children = [-1], [0], [0]
        masks[b, 0, 0] = True
        for node in range(1, s_q):
            expanding = [sum(1 for p in range(node) if depth[p] == d and children[p]) for d in range(steps)]
            free = [p for p in range(node) if children[p] < topk and depth[p] < steps
                    and (children[p] or expanding[depth[p]] < topk)]
            p = free[int(torch.randint(len(free), (1,), generator=generator))]
            parent.append(p)
            depth.append(depth[p] + 1)
            children.append(0)
            children[p] += 1
            masks[b, node] = masks[b, p]
            masks[b, node, node] = True
    return masks


def gen_poisoned_out(b: int, s_q: int, h_q: int, d_v: int, dtype: torch.dtype,
                     device: torch.device | str = "cpu") -> torch.Tensor:
    """A NaN-filled ``[b, s_q, h_q, d_v]`` output buffer: unwritten elements show."""
    return torch.full((b, s_q, h_q, d_v), math.nan, dtype=dtype, device=device)


def gen_decode_inputs(
    seqlens: Sequence[int],
    *,
    s_q: int,
    h_q: int,
    d_qk: int,
    d_v: int,
    h_kv: int = 1,
    mla: bool = True,
    page_size: int = 16,
    dtype: str = "bf16",
    kv_dtype: str = "auto",
    softmax_scale: float | None = None,
    spec_topk: int = 1,
    spec_steps: int = 0,
    seed: int = 0,
) -> DecodeInputs:
    """Seeded inputs for one decode call: ``len(seqlens)`` requests of ``s_q`` query tokens.

    ``mla``: one latent KV head whose first ``d_v`` columns are V; otherwise GQA
    with separate ``v_cache``. ``spec_topk > 1`` draws a tree mask (``s_q`` must
    be ``1 + topk * steps``); otherwise the mask is causal (chain or plain decode).
    ``kv_dtype="fp8_e4m3"`` quantises the cache with a power-of-two scale.
    """
    if mla and h_kv != 1:
        raise ValueError("an MLA cache has one latent head (h_kv = 1)")
    if h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    if kv_dtype != "auto" and kv_dtype not in FP8_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r} (known: auto, {', '.join(FP8_DTYPES)})")
    torch_dtype = DTYPES[dtype]
    g = gen_generator(seed)
    b = len(seqlens)

    q = gen_uniform_values((b, s_q, h_q, d_qk), g).to(torch_dtype)  # [b, s_q, h_q, d_qk]
    k_rows = [gen_uniform_values((n, h_kv, d_qk), g) for n in seqlens]  # [s_k, h_kv, d_qk] each
    v_rows = None if mla else [gen_uniform_values((n, h_kv, d_v), g) for n in seqlens]
    kv_cache, v_cache, block_table = gen_paged_cache(k_rows, page_size, g, v_rows=v_rows)

    kv_scale = None
    if kv_dtype in FP8_DTYPES:
        kv_cache, kv_scale = gen_fp8(kv_cache, kind=kv_dtype)  # values are in [-1, 1]: K and V share one scale
        if v_cache is not None:
            v_cache, _ = gen_fp8(v_cache, scale=kv_scale, kind=kv_dtype)
    else:
        kv_cache = kv_cache.to(torch_dtype)
        v_cache = v_cache.to(torch_dtype) if v_cache is not None else None

    tree_mask = None
    if spec_topk > 1:
        if s_q != 1 + spec_topk * spec_steps:
            raise ValueError(f"a {spec_topk}x{spec_steps} tree verifies {1 + spec_topk * spec_steps} tokens, not s_q={s_q}")
        tree_mask = gen_tree_mask(spec_topk, spec_steps, g, batch=b)
    return DecodeInputs(
        q=q,
        kv_cache=kv_cache,
        block_table=block_table,
        cache_seqlens=torch.tensor(list(seqlens), dtype=torch.int32),
        head_dim_v=d_v,
        softmax_scale=softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d_qk),
        v_cache=v_cache,
        kv_scale=kv_scale,
        tree_mask=tree_mask,
    )
