"""Decode context parallelism (DCP), simulated in one process.

Each request's KV cache is split over ``N`` ranks: token ``t`` goes to rank
``(t // I) % N`` (``I`` = interleave; ``I = 1`` is SGLang's cyclic split). Local
token ``j`` of rank ``r`` has global position ``(j // I)·N·I + r·I + j % I``.
Every rank attends with all query heads over its local tokens, masking by
those global positions, and returns ``(out, lse)``; the partials are merged by
LSE. Each rank gets its own paged cache with a freshly shuffled block table
and NaN past its local lengths, like an engine's per-rank pool.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from .inputs import DecodeInputs, gen_generator, gen_paged_cache, gen_poisoned_out
from .reference import ref_gather

__all__ = ["DcpShard", "dcp_owner", "describe_partial_nans", "gen_dcp_shards", "partial_nans", "run_dcp", "run_shard",
           "run_shards"]

Merge = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def dcp_owner(t: torch.Tensor | int, world: int, interleave: int = 1):
    """Rank that holds global token ``t``."""
    return (t // interleave) % world


@dataclasses.dataclass
class DcpShard:
    rank: int
    world: int
    interleave: int
    inputs: DecodeInputs  # this rank's local cache; cache_seqlens = local lengths [b]
    global_seqlens: torch.Tensor  # [b] int32, lengths of the whole requests


def gen_dcp_shards(inputs: DecodeInputs, world: int, interleave: int = 1, *, seed: int = 0) -> list[DcpShard]:
    """Split ``inputs``' cache over ``world`` ranks (q, masks and scales are shared).

    With ``world == 1`` the one shard is ``inputs`` itself.
    """
    if world < 1 or interleave < 1:
        raise ValueError(f"need world >= 1 and interleave >= 1, got {world}, {interleave}")
    if world == 1:
        return [DcpShard(0, 1, 1, inputs, inputs.cache_seqlens.clone())]
    device = inputs.q.device
    kv_cache, v_cache = inputs.kv_cache.cpu(), inputs.v_cache.cpu() if inputs.v_cache is not None else None
    block_table, seqlens = inputs.block_table.cpu(), inputs.cache_seqlens.cpu()
    page_size = kv_cache.shape[1]
    g = gen_generator(seed)
    shards = []
    for rank in range(world):
        k_rows, v_rows = [], []
        for i, n in enumerate(seqlens.tolist()):
            mine = (dcp_owner(torch.arange(n), world, interleave) == rank).nonzero().flatten()  # ascending
            k_rows.append(ref_gather(kv_cache, block_table[i], n)[mine])  # [local_n, h_kv, d_qk]
            if v_cache is not None:
                v_rows.append(ref_gather(v_cache, block_table[i], n)[mine])  # [local_n, h_kv, d_v]
        local_kv, local_v, local_table = gen_paged_cache(
            k_rows, page_size, g, v_rows=v_rows if v_cache is not None else None
        )
        local = dataclasses.replace(
            inputs,
            kv_cache=local_kv.to(device),
            v_cache=local_v.to(device) if local_v is not None else None,
            block_table=local_table.to(device),
            cache_seqlens=torch.tensor([r.shape[0] for r in k_rows], dtype=torch.int32, device=device),
        )
        shards.append(DcpShard(rank, world, interleave, local, inputs.cache_seqlens.clone()))
    return shards


def run_shard(kernel: Callable, shard: DcpShard, *, pass_positions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``kernel`` (``mla_decode``'s signature) on one rank's shard into a NaN-poisoned output.

    ``pass_positions=False`` calls the kernel as if it were alone (world 1, no
    global lengths), so it masks by *local* positions: the bug that DCP with
    speculative verify must not have.
    """
    x = shard.inputs
    b, s_q, h_q, _ = x.q.shape
    out = gen_poisoned_out(b, s_q, h_q, x.head_dim_v, x.q.dtype, device=x.q.device)
    dcp = (
        {"dcp_rank": shard.rank, "dcp_world_size": shard.world, "dcp_interleave": shard.interleave,
         "global_seqlens": shard.global_seqlens}
        if pass_positions
        else {"dcp_rank": 0, "dcp_world_size": 1, "dcp_interleave": 1, "global_seqlens": None}
    )
    return kernel(
        x.q, x.kv_cache, x.block_table, x.cache_seqlens, x.head_dim_v, x.softmax_scale, x.causal, x.kv_scale,
        v_cache=x.v_cache, tree_mask=x.tree_mask, out=out, **dcp,
    )


def _default_merge() -> Merge:
    from ._mode import ensure_triton_mode

    ensure_triton_mode()  # TRITON_INTERPRET must be decided before triton_mla is imported
    from .triton_mla import merge_attention_states

    return merge_attention_states


def run_shards(
    kernel: Callable, shards: Sequence[DcpShard], *, pass_positions: bool = True, merge: Merge | None = None,
    findings: list[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``kernel`` on every shard here and merge the partials by LSE (one shard: no merge).

    ``findings``, when given, gets a line for each rule of the partials the kernel broke
    (``describe_partial_nans``): the merge would hide them.
    """
    outs, lses = zip(*(run_shard(kernel, s, pass_positions=pass_positions) for s in shards))
    if len(shards) == 1:
        return outs[0], lses[0]
    if findings is not None:
        problem = describe_partial_nans(partial_nans(outs, lses), shards)
        if problem:
            findings.append(problem)
    return (merge or _default_merge())(list(outs), list(lses))


def partial_nans(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[ranks, b, 2]`` bool: whether rank ``r``'s ``out`` / ``lse`` of request ``b`` holds a NaN."""
    return torch.stack([torch.stack([torch.isnan(o).flatten(1).any(1).cpu(), torch.isnan(l).flatten(1).any(1).cpu()],
                                    dim=1) for o, l in zip(outs, lses)])


def describe_partial_nans(nans: torch.Tensor, shards: Sequence[DcpShard]) -> str | None:
    """The first rank partial with a NaN, in words (None: there is none).

    The rule (DESIGN, and ``mla_decode``'s contract): a rank with nothing to attend for a
    query gives ``out = 0`` and ``lse = -inf``, never NaN. The harness's merge skips a
    partial whose LSE is not above ``-inf``, so a NaN partial would vanish into a correct
    merged result here; an engine's own merge may not skip it.
    """
    for rank, shard in enumerate(shards):
        for b in range(nans.shape[1]):
            out_nan, lse_nan = bool(nans[rank, b, 0]), bool(nans[rank, b, 1])
            if not (out_nan or lse_nan):
                continue
            what = " and ".join(name for name, bad in (("out", out_nan), ("lse", lse_nan)) if bad)
            local = int(shard.inputs.cache_seqlens[b])
            held = "no tokens" if local == 0 else f"{local} of its tokens"
            return (f"DCP rank {rank} of {len(shards)} returned NaN {what} for request {b}, which has {held} on "
                    f"that rank: a rank with nothing to attend must give out 0 and lse -inf, never NaN (this "
                    f"harness's merge skips such a partial; an engine's merge may not)")
    return None


def run_dcp(
    kernel: Callable,
    inputs: DecodeInputs,
    world: int,
    interleave: int = 1,
    *,
    pass_positions: bool = True,
    merge: Merge | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard ``inputs`` over ``world`` ranks, run ``kernel`` once per rank here, merge by LSE.

    Returns ``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])``. ``merge`` defaults to
    the Triton ``merge_attention_states``. ``world == 1`` runs on ``inputs`` as
    they are. ``seed`` shuffles the per-rank block tables.
    """
    return run_shards(kernel, gen_dcp_shards(inputs, world, interleave, seed=seed),
                      pass_positions=pass_positions, merge=merge)
