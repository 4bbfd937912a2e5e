"""A check's requests as SGLang holds them: cache slots poisoned, cached tokens' write locations, and the
verify input of a speculative check, built by SGLang's own EAGLE draft-tree code.

SGLang's EAGLE worker drafts ``steps`` rounds: round 0 takes the root's
``topk`` children, each later round expands the ``topk`` best nodes of the
previous one by ``topk`` children each and keeps the ``topk`` best by
cumulative score (``select_top_k_tokens``); ``organize_draft_results``
keeps the ``num_draft_tokens - 1`` best candidates in candidate order, and
``build_tree_kernel_efficient`` turns them into the flat verify mask
(``draft rows x (prefix + draft)`` columns per request), the positions and
the retrieve links the backend and the sampler read.

``verify_input`` runs that code with draft probabilities chosen so that it
selects the check's own tree (``inputs.tree_mask``; a chain when it is
None): a node of the tree gets a probability near 1 (nodes that have
children slightly higher, so the beam keeps them), every other candidate
1e-6. SGLang's order of the draft tokens (root first, then candidate
order) is returned, so the runner lays q and the new KV out in it. The
tree builder is SGLang's Triton implementation (``sgl_build_tree_kernel_triton``,
the one its XPU path calls): the CUDA one is a JIT extension that needs a GPU.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch

from ...kernels.inputs import free_slot_value
from .support import adapter_error, construct, make_dataclass

__all__ = ["poison", "verify_input", "write_loc"]

_P_LEAF = 0.9  # a tree node without children
_P_INNER = 0.999  # a tree node with children (kept by the beam before leaves)
_P_OTHER = 1e-6  # a candidate outside the tree


def _tree_of(mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """``(parent, depth)`` of each node of an ancestor mask ``[s_q, s_q]`` (node 0 the root)."""
    s_q = mask.shape[0]
    depth = [int(mask[u].sum()) - 1 for u in range(s_q)]
    parent = [-1] + [max((a for a in range(s_q) if a != u and bool(mask[u, a])), key=lambda a: depth[a])
                     for u in range(1, s_q)]
    return parent, depth


def _children(parent: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parent]
    for u, p in enumerate(parent):
        if p >= 0:
            kids[p].append(u)
    # children with children first: a draft model's top-k probabilities are sorted
    return [sorted(k, key=lambda u: (not kids[u], u)) for k in kids]


def _probs(nodes: list[int | None], kids: list[list[int]], topk: int) -> list[list[float]]:
    """The draft model's top-k probabilities for each beam slot (``None``: a candidate outside the tree)."""
    rows = []
    for u in nodes:
        children = kids[u] if u is not None else []
        row = []
        for c in range(topk):
            if c < len(children):
                row.append((_P_INNER if kids[children[c]] else _P_LEAF) - 1e-4 * c)
            else:
                row.append(_P_OTHER * (1 - 1e-3 * c))
        rows.append(row)
    return rows


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """``_select_top_k_tokens_later`` is ``torch.compile``d; run it eagerly on this host."""
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        yield
        return
    with stance("force_eager"):
        yield


@contextlib.contextmanager
def _triton_tree_builder(eagle_utils: Any) -> Iterator[None]:
    """Route ``build_tree_kernel_efficient`` to SGLang's Triton tree builder for the call."""
    triton_builder = getattr(eagle_utils, "sgl_build_tree_kernel_triton", None)
    if triton_builder is None:  # 0.5.23: moved beside its dispatcher
        from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton as triton_builder
    # 0.5.23 dispatches through build_tree_kernel_efficient_func; 0.5.20-0.5.22 branch inline on the
    # platform and call these names (the CUDA extension, or sgl_kernel's CPU op).
    names = ("build_tree_kernel_efficient_func", "sgl_build_tree_kernel_efficient", "sgl_build_tree_kernel_efficient_cpu")
    missing = object()
    saved = {name: getattr(eagle_utils, name, missing) for name in names}
    for name in names:
        setattr(eagle_utils, name, triton_builder)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(eagle_utils, name)
            else:
                setattr(eagle_utils, name, value)


def verify_input(setup: Any, engine: Any) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """``(EagleVerifyInput, order [b, s_q], positions [b * s_q])`` for the check's tree (or chain)."""
    from sglang.srt.speculative import eagle_utils, spec_utils
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    TreeMaskMode = getattr(eagle_utils, "TreeMaskMode", None)
    if TreeMaskMode is None:  # 0.5.23
        from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode


    inputs = setup.inputs
    _, topk, steps, num_draft = setup.spec
    b, s_q = inputs.q.shape[:2]
    if s_q != num_draft:
        raise adapter_error("kernel check", f"{s_q} query tokens for {num_draft} draft tokens")
    if inputs.tree_mask is not None:
        masks = inputs.tree_mask.cpu()
    else:
        masks = torch.tril(torch.ones(s_q, s_q, dtype=torch.bool)).expand(b, s_q, s_q)
    trees = [_tree_of(masks[i]) for i in range(b)]
    kids = [_children(parent) for parent, _ in trees]

    # the draft loop, as EAGLE's draft_forward runs it
    score_list, token_list, parents_list = [], [], []
    candidates: list[dict[int, int]] = [dict() for _ in range(b)]  # candidate index -> node
    beams: list[list[int | None]] = [[0] for _ in range(b)]  # round 0 expands the root
    scores = None
    with _eager():
        for step in range(steps):
            width = 1 if step == 0 else topk
            probs = torch.tensor([row for i in range(b) for row in _probs(beams[i], kids[i], topk)],
                                 dtype=torch.float32).reshape(b * width, topk)
            tokens = torch.arange(b * width * topk, dtype=torch.int64).reshape(b * width, topk)
            offset = 0 if step == 0 else topk + topk * topk * (step - 1)
            for i in range(b):
                for slot, u in enumerate(beams[i]):
                    children = kids[i][u] if u is not None else []
                    for c, child in enumerate(children):
                        candidates[i][offset + slot * topk + c] = child
            if step == 0:
                probs, tokens = probs.reshape(b, topk), tokens.reshape(b, topk)
            _, _, scores, tree_info = spec_utils.select_top_k_tokens(step, probs, tokens, None, scores, topk)
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])
            kept = (tree_info[2] if step > 0 else torch.arange(topk).expand(b, topk)) - offset
            beams = [[candidates[i].get(offset + int(x)) for x in kept[i].tolist()] for i in range(b)]
    parent_list, top_scores_index, draft_tokens = eagle_utils.organize_draft_results(
        score_list, token_list, parents_list, num_draft)
    order = torch.zeros(b, s_q, dtype=torch.int64)
    for i in range(b):
        chosen = [0] + [candidates[i].get(int(x), -1) for x in top_scores_index[i].tolist()]
        if sorted(chosen) != list(range(s_q)):
            raise adapter_error("kernel check", f"SGLang's draft loop did not select the check's tree ({chosen})")
        order[i] = torch.tensor(chosen)

    device = setup.device
    seq_lens = torch.tensor(setup.prefix_lens, dtype=torch.int64, device=device)
    values = {
        "bonus_tokens": torch.zeros(b, dtype=torch.int64, device=device),
        "verified_id": torch.zeros(b, dtype=torch.int64, device=device),
        "parent_list": parent_list.to(device), "top_scores_index": top_scores_index.to(device),
        "draft_tokens": draft_tokens.to(device), "seq_lens": seq_lens, "seq_lens_sum": int(seq_lens.sum()),
        "topk": topk, "spec_steps": steps, "num_verify_tokens": num_draft,
        "tree_mask_mode": TreeMaskMode.FULL_MASK,
    }
    params = inspect.signature(eagle_utils.build_tree_kernel_efficient).parameters
    with _triton_tree_builder(eagle_utils):
        built = eagle_utils.build_tree_kernel_efficient(**{k: v for k, v in values.items() if k in params})
    tree_mask, positions, retrieve_index, retrieve_next_token, retrieve_next_sibling, draft_tokens = built[:6]
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    spec_info = make_dataclass(
        EagleVerifyInput, draft_token=draft_tokens, custom_mask=tree_mask, positions=positions,
        retrieve_index=retrieve_index, retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling, retrieve_cum_len=None, spec_steps=steps, topk=topk,
        draft_token_num=num_draft, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
    )
    return spec_info, order, positions


def poison(buffer: torch.Tensor, dtype: torch.dtype) -> None:
    """Fill a pool buffer (possibly stored as bytes) with the free-slot value of its logical ``dtype``
    (``kernels.inputs.free_slot_value``: NaN, or zero for a server's fresh cache)."""
    nan = torch.full(buffer.shape, free_slot_value(), dtype=dtype, device=buffer.device)
    buffer.copy_(nan.view(buffer.dtype) if buffer.dtype != dtype else nan)


def write_loc(loc: torch.Tensor) -> Any:
    """The write location a pool's door takes: SGLang's ``KVWriteLoc`` of logical slots, where the release has it."""
    try:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    except ImportError:
        return loc
    return construct(KVWriteLoc, loc, physical=False)
