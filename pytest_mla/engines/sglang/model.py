"""The DeepSeek model's absorbed-MLA attention path, run on a stand-in attention module.

A DeepSeek-style MLA model (DeepSeek-V2/V3, Kimi-K2: ``DeepseekV2AttentionMLA``)
never hands its decode to the backend directly. ``forward_absorb_prepare``
projects q and, under DCP, all-gathers it over the DCP group
(``all_gather_q_for_mla_decode``); ``forward_absorb_core`` then calls the
backend through the layer's ``RadixAttention`` (``attn_mqa``, or
``attn_mqa_for_dcp_decode`` for the absorb-core backends), merges the DCP
ranks with ``cp_lse_ag_out_rs_mla`` where its branch returns an LSE, and
up-projects with ``w_vc`` and ``o_proj``.

``deepseek_attention`` runs SGLang's own ``forward_absorb_core`` on a
stand-in module that has exactly the attributes it reads, with ``w_vc`` and
``o_proj`` identities (so its output is the attention output, exactly), after
the DCP q gather ``forward_absorb_prepare`` performs under the same
condition. The projections before the gather need weights and are left out:
the check's q and k are already the absorbed ``[q_nope_out, q_pe]`` and
``[k_nope, k_pe]``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Any, Iterator

import torch

__all__ = ["deepseek_attention", "dsa_indexer_gate"]

_DSA_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer"

_FORWARD_MLA = "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla"


def _stand_in(setup: Any, fm: Any) -> Any:
    """A ``DeepseekMLAForwardMixin`` with the attributes ``forward_absorb_core`` reads."""
    mixin = fm.DeepseekMLAForwardMixin
    stand_in_cls = type("DeepseekAttentionStandIn", (mixin,), {})
    attn = stand_in_cls.__new__(stand_in_cls)
    heads = setup.heads[1] - setup.heads[0]
    kv_lora = setup.inputs.head_dim_v
    values = {
        "current_attention_backend": setup.options["backend"],
        "dcp_size": setup.world,
        "use_dsa": bool(setup.options.get("dsa")),
        "num_local_heads": heads,
        "kv_lora_rank": kv_lora,
        "qk_rope_head_dim": setup.inputs.q.shape[-1] - kv_lora,
        "v_head_dim": kv_lora,  # with w_vc the identity, the up-projection keeps the latent width
        "attn_mqa": setup.layer,
        "rotary_emb": None,  # rope is already applied to the check's q_pe and k_pe
        "use_deep_gemm_bmm": False,
        "w_vc": torch.eye(kv_lora, dtype=setup.dtype, device=setup.device).expand(heads, kv_lora, kv_lora).contiguous(),
        "w_scale": 1.0,
        "o_proj": lambda x: (x, None),
        "next_skip_topk": None,
        "learnable_sink_param": None,
        "w_kc_qrep": None,
    }
    if setup.layer_gathered is not None:
        values["attn_mqa_for_dcp_decode"] = setup.layer_gathered
    for name, value in values.items():
        setattr(attn, name, value)
    return attn


def _dcp_decode_phase(attn: Any, fm: Any, forward_batch: Any) -> bool:
    method = getattr(attn, "is_dcp_mla_decode_phase", None)
    if method is not None:
        return bool(method(forward_batch))
    return bool(fm.is_dcp_mla_decode_phase(forward_batch))  # 0.5.20: a module function


def _q_replicate(attn: Any, forward_batch: Any) -> bool:
    method = getattr(attn, "is_dcp_q_replicate_phase", None)
    return bool(method(forward_batch)) and attn.w_kc_qrep is not None if method is not None else False


def deepseek_attention(setup: Any, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, tuple[str, ...]]:
    """``forward_absorb_core`` on the rank's ``q`` ``[T, h, 576]`` and new ``k`` ``[T, 1, 576]``: ``[T, h * 512]``."""
    import importlib

    fm = importlib.import_module(_FORWARD_MLA)
    attn = _stand_in(setup, fm)
    fb = setup.forward_batch
    kv_lora = setup.inputs.head_dim_v
    q_nope_out, q_pe = q[..., :kv_lora], q[..., kv_lora:]
    k_nope, k_pe = k[..., :kv_lora], k[..., kv_lora:]
    functions = [f"{_FORWARD_MLA}:DeepseekMLAForwardMixin.forward_absorb_core"]
    if setup.world > 1 and _dcp_decode_phase(attn, fm, fb) and not _q_replicate(attn, fb):
        q_nope_out, q_pe = fm.all_gather_q_for_mla_decode(q_nope_out=q_nope_out, q_pe=q_pe)
        functions.append("sglang.srt.layers.dcp.comm:all_gather_q_for_mla_decode")
    topk_indices = None
    if setup.options.get("dsa"):
        topk_indices, gate = dsa_indexer_gate(setup, q)
        functions.insert(0, gate)
    from sglang.srt.utils import BumpAllocator

    arguments = {
        "q_pe": q_pe, "k_pe": k_pe, "q_nope_out": q_nope_out, "k_nope": k_nope, "forward_batch": fb,
        "zero_allocator": BumpAllocator(buffer_size=16, dtype=torch.float32, device=setup.device),
        "positions": fb.positions, "topk_indices": topk_indices, "llama_4_scaling": None,
    }
    params = inspect.signature(fm.DeepseekMLAForwardMixin.forward_absorb_core).parameters
    out = attn.forward_absorb_core(**{k: v for k, v in arguments.items() if k in params})
    if isinstance(out, tuple):
        out = out[0]
    return out, tuple(functions)


def dsa_indexer_gate(setup: Any, q: torch.Tensor) -> tuple[Any, str]:
    """What a DSA checkpoint's indexer hands the attention: ``(topk_indices, the function that ran)``.

    ``forward_absorb_prepare`` calls ``self.indexer(...)`` for every DSA layer
    (``use_dsa``, whatever the backend) and passes what it returns to
    ``forward_absorb_core`` (``topk_indices``, forwarded to the backend only
    when not None). The indexer's CUDA forward (the one CUDA and ROCm
    dispatch to; XPU's ``forward_xpu`` calls it) first asks the active
    backend for its indexer metadata and returns None when it has none, before
    reading a weight or its inputs. That gate runs here, SGLang's own method on
    an indexer without weights, with placeholder hidden states: a dense
    backend's ``get_indexer_metadata`` (``AttentionBackend``'s: None) decides.
    A backend that answers with metadata would go on to compute a top-k from
    weights the check does not have: refused (the check does not model it).
    """
    import importlib

    from .support import adapter_error

    indexer_module = importlib.import_module(_DSA_INDEXER)
    cls = indexer_module.Indexer
    indexer = cls.__new__(cls)
    fb = setup.forward_batch
    platform = setup.options.get("platform")
    method = "forward_xpu" if platform == "xpu" else "forward_cuda"
    backend = setup.backend
    if type(backend).get_indexer_metadata is not _base_indexer_metadata():
        raise adapter_error("kernel check", f"SGLang's {type(backend).__name__} answers the DSA indexer with "
                            "metadata of its own (get_indexer_metadata): the check does not model its top-k")
    placeholder = torch.full((q.shape[0], 1), float("nan"), dtype=setup.dtype, device=setup.device)
    try:
        with _tilelang_declarations(setup):
            topk = getattr(indexer, method)(placeholder, placeholder, fb.positions, fb, 0)
    except ImportError as exc:
        from ...kernels.engine_runner import EngineCannotRun
        from .support import missing_kernel_library

        library = missing_kernel_library(exc)
        if library is None or library.split(".")[0] != "tilelang":
            raise
        # (0.5.22: its TileLang module patches TileLang's own adapter classes at import, beyond the stand-in)
        raise EngineCannotRun(f"SGLang's DSA indexer ({method}) imports SGLang's TileLang kernels, which need "
                              f"{library} at import beyond the declarations pytest-mla's stand-in takes; the "
                              "TileLang kernel library is not installed here") from None
    if topk is None:
        top_k = setup.options["dsa"][0]
        longest = max(setup.seqlens)
        setup._notes.append(
            f"DSA indexer: {type(backend).__name__} has no indexer metadata (AttentionBackend.get_indexer_metadata: "
            f"None), so Indexer.{method} returned no top-k and forward_absorb_core handed none to the backend, which "
            f"attends every cached token; the check's longest request has {longest} tokens, "
            + (f"within index_topk {top_k}, where the model's top-k keeps every token" if longest <= top_k else
               f"more than index_topk {top_k}: the model would attend {top_k} of them"))
    return topk, f"{_DSA_INDEXER}:Indexer.{method}"


#: The module the indexer's forward imports its ``act_quant`` from on ROCm (``_is_hip``): TileLang's.
_ACT_QUANT_TILELANG = "sglang.kernels.ops.quantization.act_quant_tilelang"


@contextlib.contextmanager
def _tilelang_declarations(setup: Any) -> Iterator[None]:
    """While the indexer's gate runs on a host without TileLang: a stand-in that takes its import-time declarations.

    On ROCm the indexer's forward imports ``act_quant`` from SGLang's TileLang
    module before it asks the backend for metadata; importing it sets
    TileLang's log level, reads ``PassConfigKey`` names and declares
    ``act_quant_kernel`` with ``@tilelang.jit`` (compiled on its first call).
    None of that computes. The stand-in takes those three and nothing else:
    the declared kernel, and every other TileLang name, is a GPU step when
    called (``common.gpu_steps``), so a path that would quantise with it stops
    there. Both modules are dropped afterwards (the engine's other code sees
    TileLang absent, as before).
    """
    from ..common.gpu_steps import KernelLibraryStub, _KernelName, missing_libraries

    if not missing_libraries(["tilelang"]) or "tilelang" in sys.modules:
        yield
        return

    class _PassConfigKey:
        def __getattr__(self, name: str) -> str:
            if name.startswith("__"):
                raise AttributeError(name)
            return f"tilelang.PassConfigKey.{name}"

    def jit(*args: Any, **kwargs: Any) -> Any:
        def declare(fn: Any) -> Any:
            return _KernelName(f"tilelang.jit[{fn.__module__}.{fn.__qualname__}]")
        return declare(args[0]) if len(args) == 1 and callable(args[0]) and not kwargs else declare

    tilelang = KernelLibraryStub("tilelang")
    tilelang.__path__ = []
    tilelang.set_log_level = lambda *a, **k: None
    tilelang.PassConfigKey = _PassConfigKey()
    tilelang.jit = jit
    language = KernelLibraryStub("tilelang.language")
    tilelang.language = language
    sys.modules["tilelang"], sys.modules["tilelang.language"] = tilelang, language
    had = _ACT_QUANT_TILELANG in sys.modules
    try:
        yield
    finally:
        used = not had and _ACT_QUANT_TILELANG in sys.modules
        for name in ("tilelang", "tilelang.language") + (() if had else (_ACT_QUANT_TILELANG,)):
            sys.modules.pop(name, None)
        parent = sys.modules.get(_ACT_QUANT_TILELANG.rpartition(".")[0])
        if used and parent is not None and hasattr(parent, "act_quant_tilelang"):
            delattr(parent, "act_quant_tilelang")
    if used:
        setup._notes.append("the DSA indexer's forward imported SGLang's TileLang act_quant (ROCm) under a stand-in "
                            "that takes its import-time declarations only (log level, PassConfigKey, @tilelang.jit); "
                            "no TileLang kernel ran")


def _base_indexer_metadata() -> Any:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return AttentionBackend.get_indexer_metadata
