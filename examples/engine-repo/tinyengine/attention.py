"""tinyengine's attention backends and the checks that pick one.

``select_backend(args)`` runs the checks in a fixed order (backend name,
model kind, GPU, decode context parallelism, speculative decoding) and
returns the chosen ``Backend``, or raises ``AttentionConfigError`` with a
message for the user. The checks read what each backend declares in
``BACKENDS``; nothing here knows about pytest-mla.
"""

from __future__ import annotations

import dataclasses


class AttentionConfigError(ValueError):
    """The requested attention configuration cannot be served."""


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What attention needs to know about a model."""

    name: str
    use_mla: bool  # multi-head latent attention: one latent KV row per token, shared by all heads
    num_kv_heads: int  # 1 for MLA


@dataclasses.dataclass(frozen=True)
class EngineArgs:
    model: ModelInfo
    attention_backend: str
    compute_capability: tuple[int, int]  # (9, 0) on an H100, (10, 0) on a B200
    dcp_size: int = 1  # decode context parallelism: ranks the KV cache of a request is split over
    speculative_num_steps: int = 0  # draft depth; 0 = no speculative decoding
    speculative_topk: int = 1  # draft branches per step; > 1 = a draft tree


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    mla_only: bool = False
    min_capability: tuple[int, int] = (8, 0)
    dcp_with_spec: bool = True  # its kernel masks by global token positions on a DCP rank
    draft_trees: bool = True  # verifies speculative trees (topk > 1), not only chains
    decode_kernel: str | None = None  # "module:attr" of the decode kernel tinyengine ships


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("triton", decode_kernel="tinyengine.kernels:mla_decode"),
        Backend("flashinfer", draft_trees=False),
        Backend("flashmla", mla_only=True, min_capability=(9, 0), draft_trees=False),
        Backend("trtllm_mla", mla_only=True, min_capability=(10, 0), dcp_with_spec=False, draft_trees=False),
    )
}


def select_backend(args: EngineArgs) -> Backend:
    """The backend that serves ``args``; ``AttentionConfigError`` if none can."""
    backend = BACKENDS.get(args.attention_backend)
    if backend is None:
        raise AttentionConfigError(
            f"unknown attention backend {args.attention_backend!r} (choose from: {', '.join(BACKENDS)})"
        )
    model = args.model
    if backend.mla_only and not model.use_mla:
        raise AttentionConfigError(
            f"{backend.name} serves MLA models only; {model.name} has {model.num_kv_heads} KV heads."
        )
    if args.compute_capability < backend.min_capability:
        need, have = backend.min_capability, args.compute_capability
        raise AttentionConfigError(
            f"{backend.name} needs compute capability {need[0]}.{need[1]} or newer; "
            f"this GPU has {have[0]}.{have[1]}."
        )
    speculative = args.speculative_num_steps > 0
    if args.dcp_size > 1:
        if not model.use_mla:
            raise AttentionConfigError(
                f"decode context parallelism (dcp={args.dcp_size}) shards the latent cache of MLA models; "
                f"{model.name} has {model.num_kv_heads} KV heads."
            )
        if speculative and not backend.dcp_with_spec:
            raise AttentionConfigError(
                f"{backend.name} cannot combine decode context parallelism (dcp={args.dcp_size}) with "
                "speculative decoding: its kernel takes no global token positions."
            )
    if speculative and args.speculative_topk > 1 and not backend.draft_trees:
        raise AttentionConfigError(
            f"{backend.name} verifies draft chains only (speculative topk 1), not trees (topk {args.speculative_topk})."
        )
    return backend
