"""Seeded decode inputs, following FlashMLA's test practice, with queries that make a check able to fail.

* KV ~ ``randn / 10`` clamped to [-1, 1] (FlashMLA's distribution).
* q is drawn so that the attention logits *at the case's own softmax scale*
  look like real attention (``LogitProfile``): ordinary tokens spread with a
  standard deviation of 1.5, one planted token per (request, query, head)
  dominates (the newest, the first, the tokens either side of a page boundary,
  one on every DCP rank, random ones — cycled over the heads), a token the
  speculative mask hides would dominate if the mask were dropped, and under DCP
  one rank's tokens are pushed down so that it holds almost none of the mass
  while another holds most. With FlashMLA's ``randn / 10`` queries the logits
  of a 576-wide MLA head have a standard deviation of about 0.017: every
  softmax is nearly uniform and a 25% scale error stays inside the bf16
  tolerance (see docs/check-power.md).
* Paged cache with a randomly permuted block table; cache slots past each
  sequence's length and spare pages are NaN, and unused block-table entries hold
  ``UNUSED_PAGE`` (2**30), so any out-of-bounds read shows as NaN or a crash.
* fp8 e4m3 KV carries a power-of-two ``kv_scale``, so the dequantised values are
  exact in bf16/fp16/fp32 and the reference sees exactly what the kernel sees.
* Speculative trees: ``gen_tree_mask`` draws a random draft tree per request.
* Sparse attention (DeepSeek-V3.2's indexer): ``gen_topk_indices`` draws each
  query token's selection, a strict subset of what it may see whenever it sees
  more than ``K`` tokens; the planted tokens are chosen among the selected ones
  and an unselected token would dominate if the selection were ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Sequence

import torch

from .reference import ref_gather

__all__ = [
    "DISCRIMINATING",
    "DTYPES",
    "FALLBACK_PROFILES",
    "LogitProfile",
    "UNUSED_PAGE",
    "DecodeInputs",
    "gen_decode_inputs",
    "gen_fp8",
    "gen_generator",
    "gen_paged_cache",
    "gen_poisoned_out",
    "gen_topk_indices",
    "gen_tree_mask",
    "selected_mask",
    "gen_uniform_values",
    "free_slot_value",
    "free_slots",
]

#: What the free cache slots hold (``free_slot_value``): NaN, so that a read past a sequence shows.
_FREE_SLOT = [math.nan]


def free_slot_value() -> float:
    """The value every free slot of a check's caches holds: NaN (a missing mask shows), or, inside
    ``free_slots(v)``, ``v``. Engine runners fill their own caches' free slots with it."""
    return _FREE_SLOT[0]


@contextlib.contextmanager
def free_slots(value: float) -> Iterator[None]:
    """Free cache slots hold ``value`` for the duration: ``0.0`` is the state a server's cache starts in
    (SGLang and vLLM allocate it with ``torch.zeros``). One check at a time per process."""
    saved = _FREE_SLOT[0]
    _FREE_SLOT[0] = float(value)
    try:
        yield
    finally:
        _FREE_SLOT[0] = saved

#: Block-table value of an entry past a sequence's last page; never to be read.
UNUSED_PAGE = 2**30

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FP8_E4M3_MAX = 448.0
#: KV-cache dtypes of an fp8 cache: the torch dtype and its largest finite value.
FP8_DTYPES = {"fp8_e4m3": (torch.float8_e4m3fn, FP8_E4M3_MAX), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


@dataclasses.dataclass(frozen=True)
class LogitProfile:
    """The attention logits a case's queries produce at its softmax scale.

    Per (request, query, head): ordinary visible tokens get logits of standard
    deviation ``spread``; one planted visible token gets ``target_share`` of
    the softmax mass (which token cycles over the heads, see
    ``_planted_targets``); under speculative verify one token the mask hides
    is set so that it would take ``hidden_share`` of the mass if the mask were
    dropped; under DCP the visible tokens of one rank other than the target's
    sit ``quiet`` below their ordinary logits for every other head (that rank
    holds almost nothing, the target's rank most; the other heads keep every
    rank's share, which a wrong LSE base or equal weights would change). Logit values are set exactly on those tokens (a
    least-norm correction of q), not on average.
    """

    spread: float = 1.0
    target_share: float = 0.8
    hidden_share: float = 0.9
    quiet: float = 4.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


#: The default profile of every check (our kernel's and the engines'). Chosen by measurement
#: (docs/check-power.md): a 5% scale error moves the output's cosine by >= 2.5e-4 on the engine
#: matrices' shapes, while an fp8-e5m2 P·V rounding moves it by <= 4e-5 (a bulk holding more
#: of the mass, or spread wider, costs signal and adds rounding noise).
DISCRIMINATING = LogitProfile()
#: Tried in turn when a case's power measurement sees a planted fault slip through.
FALLBACK_PROFILES = (LogitProfile(spread=1.5, target_share=0.7), LogitProfile(spread=0.5, target_share=0.9))


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
    #: Sparse attention: ``[b, s_q, K]`` int32, the request-relative positions of the tokens each query
    #: token attends (the indexer's top-k, in no order), ``-1`` padding at the end; None = dense.
    topk_indices: torch.Tensor | None = None

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
                "v_cache": self.v_cache, "tree_mask": self.tree_mask,
                **({"topk_indices": self.topk_indices} if self.topk_indices is not None else {})}

    def stored_unscaled(self) -> "DecodeInputs":
        """The inputs as an engine holds them when it stores each token itself in the cache format,
        ignoring ``kv_scale`` (the "raw" write convention): cache = fp8(cache · kv_scale), scale 1.
        The reference of such a run is computed from these, so the precision the engine gives up by
        not scaling is not counted against it; anything it reads with the wrong scale still is."""
        if self.kv_scale is None:
            return self

        def unscaled(cache: torch.Tensor | None) -> torch.Tensor | None:
            if cache is None:
                return None
            return (cache.to(torch.float64) * self.kv_scale).to(cache.dtype)

        return dataclasses.replace(self, kv_cache=unscaled(self.kv_cache), v_cache=unscaled(self.v_cache),
                                   kv_scale=1.0)

    def with_free_slots(self, value: float) -> "DecodeInputs":
        """These inputs with every NaN of the caches (their free slots and spare pages: real tokens are
        finite) replaced by ``value``."""
        def filled(cache: torch.Tensor | None) -> torch.Tensor | None:
            if cache is None:
                return None
            wide = cache.to(torch.float32)
            return torch.where(torch.isnan(wide), torch.full_like(wide, value), wide).to(cache.dtype)
        return dataclasses.replace(self, kv_cache=filled(self.kv_cache), v_cache=filled(self.v_cache))

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
        return cache.fill_(free_slot_value())

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


def _visible(n: int, s_q: int, i: int, tree_mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Which of a request's ``n`` tokens query ``i`` sees (``reference.ref_attend``'s rule), ``[n]`` bool."""
    pos = torch.arange(n)
    first_draft = n - s_q
    if tree_mask is not None:
        draft = (pos - first_draft).clamp(min=0, max=s_q - 1)
        return (pos < first_draft) | tree_mask[i, draft]
    if causal:
        return pos <= first_draft + i
    return torch.ones(n, dtype=torch.bool)


def selected_mask(topk_row: torch.Tensor, n: int) -> torch.Tensor:
    """Which of a request's ``n`` tokens one query token's selection ``[K]`` (``-1`` = none) names, ``[n]`` bool.

    An entry outside ``[-1, n)`` raises: a selection never names a token the request does not hold.
    """
    row = topk_row.to(torch.int64).flatten()
    bad = (row < -1) | (row >= n)
    if bool(bad.any()):
        raise ValueError(f"top-k index {int(row[bad][0])} out of range for a request of {n} tokens (-1 = none)")
    mask = torch.zeros(n, dtype=torch.bool)
    mask[row[row >= 0]] = True
    return mask


def gen_topk_indices(seqlens: Sequence[int], s_q: int, k: int, generator: torch.Generator, *, page_size: int,
                     tree_mask: torch.Tensor | None = None, causal: bool = True) -> torch.Tensor:
    """Each query token's sparse selection, ``[b, s_q, k]`` int32: request-relative positions, ``-1`` padding.

    Drawn among the tokens the query may see (causal or tree mask). A query that sees ``k`` tokens
    or fewer selects all of them; otherwise exactly ``k``: always its newest and first visible token
    and those either side of the first page boundary (the positions ``power`` reads from a neighbour's
    slot, so each misread is of a selected token), the rest at random. The positions come in a random
    order (an indexer's top-k is not sorted), the ``-1`` padding at the end.
    """
    if k < 1:
        raise ValueError(f"a sparse selection needs k >= 1, not {k}")
    b = len(seqlens)
    out = torch.full((b, s_q, k), -1, dtype=torch.int32)
    for r, n in enumerate(seqlens):
        for i in range(s_q):
            vis = _visible(n, s_q, i, tree_mask[r] if tree_mask is not None else None, causal)
            idx = vis.nonzero().flatten()
            if idx.numel() > k:
                must = [p for p in dict.fromkeys([int(idx[-1]), int(idx[0]), page_size - 1, page_size])
                        if 0 <= p < n and bool(vis[p])][:k]
                rest = idx[~torch.isin(idx, torch.tensor(must, dtype=idx.dtype))]
                extra = rest[torch.randperm(rest.numel(), generator=generator)[: k - len(must)]]
                idx = torch.cat([torch.tensor(must, dtype=idx.dtype), extra])
            idx = idx[torch.randperm(idx.numel(), generator=generator)]
            out[r, i, : idx.numel()] = idx.to(torch.int32)
    return out


def _planted_targets(visible: torch.Tensor, page_size: int, owner_of: list[int], world: int) -> list[int]:
    """Positions worth a head's dominant token, in order: the newest visible token, the first, the
    tokens either side of the first page boundary, the first token of every DCP rank (so every
    rank dominates some head). Heads cycle through them; a head past them takes a random one."""
    idx = visible.nonzero().flatten().tolist()
    if not idx:
        return []
    wanted = [idx[-1], idx[0], page_size - 1, page_size, *(idx[len(idx) // 2:len(idx) // 2 + 1])]
    first_of_rank: dict[int, int] = {}
    for p in idx:
        first_of_rank.setdefault(owner_of[p], p)
    wanted += [first_of_rank[r] for r in range(world) if r in first_of_rank]
    seen: list[int] = []
    for p in wanted:
        if p in idx and p not in seen:
            seen.append(p)
    return seen


def gen_planted_q(
    z: torch.Tensor,  # [b, s_q, h_q, d_qk] standard normal draws
    k_rows: Sequence[torch.Tensor],  # per request [n, h_kv, d_qk] float64, as the reference reads them
    softmax_scale: float,
    profile: LogitProfile,
    generator: torch.Generator,
    *,
    page_size: int,
    tree_mask: torch.Tensor | None = None,  # [b, s_q, s_q]
    causal: bool = True,
    dcp: tuple[int, int] = (1, 1),  # (world, interleave): the rank that owns each position
    topk_indices: torch.Tensor | None = None,  # [b, s_q, K] sparse selection (-1 = none)
) -> torch.Tensor:
    """Queries ``[b, s_q, h_q, d_qk]`` (float64) whose logits follow ``profile`` at ``softmax_scale``.

    With ``topk_indices`` a query sees only its selected tokens: the planted target is a selected
    token and the hidden one (which would dominate if the mask were dropped) may be an unselected one.

    Per (request, query), for all heads at once: ``a·z`` gives ordinary logits
    a spread of ``profile.spread`` (``a`` from the rms norm of the visible
    keys); the least-norm direction that lowers every visible key of a rank by
    ``profile.quiet`` is added for the head's quiet rank; then, twice (each
    correction moves the other tokens a little), the combination of the target's
    and the hidden token's keys that puts exactly those two logits where the
    profile wants them. Heads of one KV group share its keys.
    """
    b, s_q, h_q, d_qk = z.shape
    world, interleave = dcp
    q = torch.zeros(b, s_q, h_q, d_qk, dtype=torch.float64)
    heads = torch.arange(h_q)
    for r_i, rows in enumerate(k_rows):
        n = rows.shape[0]
        if n == 0:  # nothing to attend: FlashMLA's plain draw
            q[r_i] = (z[r_i] / 10).clamp(-1.0, 1.0)
            continue
        h_kv = rows.shape[1]
        kv_of = heads // (h_q // h_kv)  # [h_q] KV head of each query head
        keys = rows.permute(1, 0, 2).contiguous()  # [h_kv, n, d_qk]
        norms2 = (keys * keys).sum(-1)  # [h_kv, n]
        owners = (torch.arange(n) // interleave) % world
        owner_of = owners.tolist()
        lowering: dict[tuple[int, int, bytes], torch.Tensor] = {}  # (kv head, rank, visible set) -> direction
        for i in range(s_q):
            vis = _visible(n, s_q, i, tree_mask[r_i] if tree_mask is not None else None, causal)  # [n]
            if topk_indices is not None:
                vis = vis & selected_mask(topk_indices[r_i, i], n)
            vis_idx = vis.nonzero().flatten()
            hidden = (~vis).nonzero().flatten()
            rms = norms2[:, vis_idx if vis_idx.numel() else slice(None)].mean(-1).sqrt().clamp(min=1e-30)  # [h_kv]
            v = z[r_i, i].to(torch.float64) * (profile.spread / (softmax_scale * rms[kv_of]))[:, None]  # [h_q, d]
            targets = _planted_targets(vis, page_size, owner_of, world)
            if not targets:  # this query sees nothing: its logits do not matter
                q[r_i, i] = v
                continue
            laps = heads // len(targets)
            drawn = vis_idx[torch.randint(len(vis_idx), (h_q,), generator=generator)]
            t = torch.where(laps % 2 == 0, torch.tensor(targets)[heads % len(targets)], drawn)  # [h_q]
            u = hidden[torch.randint(hidden.numel(), (h_q,), generator=generator)] if hidden.numel() else None

            if world > 1:
                quiet = (owners[t] + 1 + laps) % world
                quiet = torch.where(quiet == owners[t], (quiet + 1) % world, quiet)  # [h_q]
                # Every other head keeps all ranks in play: with two ranks a quiet one leaves nothing
                # for the merge's weights to get wrong (a base-2 LSE read as natural log shows where
                # ranks share the mass unevenly, not where one holds it all).
                quiet = torch.where(heads % 2 == 0, quiet, -1)
                for kv in range(h_kv):
                    for rank in range(world):
                        chosen = (kv_of == kv) & (quiet == rank)
                        members = vis_idx[owners[vis_idx] == rank]
                        if not (members.numel() and chosen.any()):
                            continue
                        key = (kv, rank, vis.numpy().tobytes())
                        if key not in lowering:
                            lowering[key] = _least_norm(keys[kv, members], -profile.quiet / softmax_scale)
                        v[chosen] += lowering[key]

            group = h_q // h_kv
            k_t = keys[kv_of, t]  # [h_q, d]
            k_u = keys[kv_of, u] if u is not None else None
            others = vis[None, :].expand(h_q, n).clone()
            others[heads, t] = False
            for _ in range(2):
                logits = softmax_scale * torch.einsum("kgd,knd->kgn", v.view(h_kv, group, d_qk), keys).reshape(h_q, n)
                want_t = torch.where(others.any(-1), _share_logits(profile.target_share, logits, others),
                                     logits[heads, t])
                if k_u is None:
                    step = (want_t - logits[heads, t]) / softmax_scale
                    v = v + (step / (k_t * k_t).sum(-1))[:, None] * k_t
                    continue
                with_target = logits.clone()
                with_target[heads, t] = want_t
                want_u = _share_logits(profile.hidden_share, with_target, vis[None, :].expand(h_q, n))
                # [alpha, beta] with v += alpha·k_t + beta·k_u hitting both logits: a 2x2 solve per head
                tt, tu, uu = (k_t * k_t).sum(-1), (k_t * k_u).sum(-1), (k_u * k_u).sum(-1)
                gram = torch.stack([torch.stack([tt, tu], -1), torch.stack([tu, uu], -1)], -2)  # [h_q, 2, 2]
                rhs = torch.stack([want_t - logits[heads, t], want_u - logits[heads, u]], -1) / softmax_scale
                coef = torch.linalg.solve(gram, rhs[..., None])[..., 0]  # [h_q, 2]
                v = v + coef[:, :1] * k_t + coef[:, 1:] * k_u
            q[r_i, i] = v
    return q


def _least_norm(k: torch.Tensor, value: float) -> torch.Tensor:
    """The shortest ``x`` with ``k @ x == value`` for every row of ``k`` ``[m, d]`` (least squares when m > d).

    Both branches solve a small Gram system: ``torch.linalg.lstsq`` on a CPU gives different bits from one
    call to the next (LAPACK's pivoted QR under threaded BLAS), which made a seeded case's q irreproducible.
    """
    m, d = k.shape
    rhs = torch.full((m, 1), value, dtype=torch.float64)
    if m <= d:
        gram = k @ k.T + 1e-12 * torch.eye(m, dtype=torch.float64)
        return (k.T @ torch.linalg.solve(gram, rhs)).flatten()
    gram = k.T @ k + 1e-12 * torch.eye(d, dtype=torch.float64)  # the normal equations
    return torch.linalg.solve(gram, k.T @ rhs).flatten()


def _share_logits(share: float, logits: torch.Tensor, among: torch.Tensor) -> torch.Tensor:
    """Per row, the logit that takes ``share`` of the softmax mass from the tokens ``among`` (``[rows, n]``)."""
    return math.log(share / (1.0 - share)) + torch.where(among, logits, -math.inf).logsumexp(-1)


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
    logits: LogitProfile | None = DISCRIMINATING,
    dcp: tuple[int, int] = (1, 1),
    kv_scale: float | str | None = None,
    sparse_topk: int = 0,
) -> DecodeInputs:
    """Seeded inputs for one decode call: ``len(seqlens)`` requests of ``s_q`` query tokens.

    ``mla``: one latent KV head whose first ``d_v`` columns are V; otherwise GQA
    with separate ``v_cache``. ``spec_topk > 1`` draws a tree mask (``s_q`` must
    be ``1 + topk * steps``); otherwise the mask is causal (chain or plain decode).
    ``logits``: how q is drawn (``LogitProfile``; ``None`` = FlashMLA's plain
    ``randn / 10``, whose logits are nearly flat). ``dcp``: ``(world,
    interleave)`` of the ranks the cache will be split over (the profile's quiet
    rank). ``kv_dtype="fp8_e4m3"`` / ``"fp8_e5m2"`` quantises the cache with
    ``kv_scale``: ``"pow2"`` (default: the power of two that maps the cache's
    amax into the format), ``"calibrated"`` (a calibration pass's amax over the
    format's largest value, rounded up to three significant bits and never a power
    of two: ``calibrated_scale``), ``1.0`` (a checkpoint without KV scales), or a
    number. With an fp8 cache q is rounded through the cache's fp8
    format too, so a kernel that feeds q to an fp8 MMA rounds nothing. ``sparse_topk > 0``: each query
    token attends only the ``sparse_topk`` tokens ``gen_topk_indices`` selects (``topk_indices``), drawn
    after the tree mask; 0 = dense (the inputs are then what they were without the option).
    """
    if mla and h_kv != 1:
        raise ValueError("an MLA cache has one latent head (h_kv = 1)")
    if h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    if kv_dtype != "auto" and kv_dtype not in FP8_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r} (known: auto, {', '.join(FP8_DTYPES)})")
    if spec_topk > 1 and s_q != 1 + spec_topk * spec_steps:
        raise ValueError(f"a {spec_topk}x{spec_steps} tree verifies {1 + spec_topk * spec_steps} tokens, not s_q={s_q}")
    torch_dtype = DTYPES[dtype]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d_qk)
    g = gen_generator(seed)
    b = len(seqlens)

    z = torch.randn(b, s_q, h_q, d_qk, generator=g)  # [b, s_q, h_q, d_qk]
    k_rows = [gen_uniform_values((n, h_kv, d_qk), g) for n in seqlens]  # [s_k, h_kv, d_qk] each
    v_rows = None if mla else [gen_uniform_values((n, h_kv, d_v), g) for n in seqlens]
    kv_cache, v_cache, block_table = gen_paged_cache(k_rows, page_size, g, v_rows=v_rows)

    fp8_scale = None
    if kv_dtype in FP8_DTYPES:
        kv_cache, fp8_scale = gen_fp8(kv_cache, scale=_fp8_scale(kv_cache, kv_scale, kv_dtype), kind=kv_dtype)
        if v_cache is not None:
            v_cache, _ = gen_fp8(v_cache, scale=fp8_scale, kind=kv_dtype)
    else:
        kv_cache = kv_cache.to(torch_dtype)
        v_cache = v_cache.to(torch_dtype) if v_cache is not None else None

    tree_mask = gen_tree_mask(spec_topk, spec_steps, g, batch=b) if spec_topk > 1 else None
    topk_indices = gen_topk_indices(seqlens, s_q, sparse_topk, g, page_size=page_size, tree_mask=tree_mask) \
        if sparse_topk > 0 else None

    if logits is None:
        q = (z / 10).clamp(-1.0, 1.0)  # FlashMLA's randn / 10 (nearly flat logits)
    else:
        # the keys as the reference reads them (dequantised), request by request
        seen = [_dequantised_rows(kv_cache, block_table[i], n, fp8_scale) for i, n in enumerate(seqlens)]
        q = gen_planted_q(z, seen, scale, logits, g, page_size=page_size, tree_mask=tree_mask, dcp=dcp,
                          topk_indices=topk_indices)
    if kv_dtype in FP8_DTYPES:
        q = q.to(FP8_DTYPES[kv_dtype][0]).to(torch.float64)  # exact in bf16 / fp16 / fp32 too
    q = q.to(torch_dtype)
    return DecodeInputs(
        q=q,
        kv_cache=kv_cache,
        block_table=block_table,
        cache_seqlens=torch.tensor(list(seqlens), dtype=torch.int32),
        head_dim_v=d_v,
        softmax_scale=scale,
        v_cache=v_cache,
        kv_scale=fp8_scale,
        tree_mask=tree_mask,
        topk_indices=topk_indices,
    )


def _fp8_scale(cache: torch.Tensor, kv_scale: float | str | None, kind: str) -> float:
    """The per-tensor scale of an fp8 cache (see ``gen_decode_inputs``)."""
    finite = cache[torch.isfinite(cache)]
    amax = float(finite.abs().max()) if finite.numel() else 1.0
    fmax = FP8_DTYPES[kind][1]
    if kv_scale == "calibrated":
        return calibrated_scale(max(amax, 1e-30) / fmax)
    if kv_scale is None or kv_scale == "pow2":
        return 2.0 ** math.ceil(math.log2(max(amax, 1e-30) / fmax))
    if isinstance(kv_scale, str):
        raise ValueError(f"unknown kv_scale {kv_scale!r} (known: calibrated, pow2, or a number)")
    if not kv_scale > 0:
        raise ValueError(f"kv_scale must be positive, got {kv_scale!r}")
    return float(kv_scale)


#: The mantissas a calibrated-style scale takes (``calibrated_scale``): three significant bits, none 1.
CALIBRATED_MANTISSAS = (1.25, 1.5, 1.75, 2.5)


def calibrated_scale(least: float) -> float:
    """The smallest scale ``>= least`` of the form ``m * 2**e`` with ``m`` in ``CALIBRATED_MANTISSAS``.

    A calibration pass picks ``amax / fmax``, a scale with an arbitrary mantissa;
    the checks want one that is not a power of two (a kernel that keeps only the
    scale's exponent, or rounds it to bf16 and back, is then wrong by up to 25%)
    and that still leaves every cached value exact: an fp8 code has at most four
    significant bits (e4m3; three for e5m2), so ``code * scale`` has at most seven
    and is exact in bf16, fp16 and fp32, and an engine's own write path
    (``x / k_scale`` or ``x * (1 / k_scale)`` in fp32) stores back the same code.
    """
    if not least > 0 or not math.isfinite(least):
        raise ValueError(f"a calibrated scale needs a positive finite amax / fmax, got {least!r}")
    exponent = math.floor(math.log2(least))
    mantissa = least / 2.0 ** exponent  # in [1, 2), up to log2's rounding
    chosen = next((m for m in CALIBRATED_MANTISSAS if m >= mantissa), CALIBRATED_MANTISSAS[-1])
    return chosen * 2.0 ** exponent


def _dequantised_rows(cache: torch.Tensor, block_table_row: torch.Tensor, n: int, scale: float | None) -> torch.Tensor:
    rows = ref_gather(cache, block_table_row, n).to(torch.float64)
    return rows * scale if scale is not None else rows
