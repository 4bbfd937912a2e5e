"""The built-in engine: a small attention-backend registry with SGLang's semantics.

It is a real engine in miniature, written from SGLang's behaviour (see
``shared/reference/sglang.md``), not from any matrix file: argument
resolution first (DCP size, aliases, GPU arch, KV dtype, page size,
speculative limits), then the backend's factory (model kind, DCP
capabilities), as SGLang's ``ServerArgs`` hooks and
``attention_registry`` do. ``matrix/reference.toml`` declares what it is
expected to do; the matrix run compares the two.

Its ``triton`` backend runs this project's Triton MLA decode kernel; the
other backends have no kernel in this package.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from .. import __version__
from ..core.cells import Cell, arch_number
from ..core.models import ModelConfig
from ..core.spec import SpecSetting, parse_spec
from ..core.host import probe_host
from ..kernels.library_hook import library_kernel_for
from .protocol import Configured, Engine, KernelSpec

#: The project's kernel; each check also runs it with two KV splits on a schedule case whose long request
#: holds more than one tile per rank (``BLOCK_N`` is 128 under the interpreter, at most 64 on a GPU), so
#: both splits hold tokens and its split-KV merge runs: its own choice under the interpreter is one split
#: (``triton_mla.default_num_splits``).
TRITON_KERNEL = KernelSpec("triton", "pytest_mla.kernels.triton_mla:mla_decode",
                           options=(("num_splits", 2), ("split_from", 129)))


@dataclasses.dataclass
class ServerArgs:
    """The resolved configuration a factory sees (SGLang's ``ServerArgs`` in small)."""

    model: ModelConfig
    attention_backend: str
    arch: str
    dcp_size: int
    spec: SpecSetting
    kv_cache_dtype: str = "auto"
    page_size: int = 1
    tp_size: int = 1
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def sm(self) -> int:
        return arch_number(self.arch) or 0


Factory = Callable[[ServerArgs], Configured]
_FACTORIES: dict[str, Factory] = {}


def register_attention_backend(name: str) -> Callable[[Factory], Factory]:
    def wrap(factory: Factory) -> Factory:
        _FACTORIES[name] = factory
        return factory

    return wrap


def registered_backends() -> tuple[str, ...]:
    return tuple(_FACTORIES)


# --------------------------------------------------------------------------------------------
# Argument resolution: runs before any factory, in this order.
# --------------------------------------------------------------------------------------------

#: Deprecated names resolved to another backend (SGLang 0.5.23: tokenspeed_mla → cutedsl_mla, fp8 KV).
ALIASES = {"tokenspeed_mla": ("cutedsl_mla", "fp8_e4m3")}

#: Page sizes a backend's kernel needs; resolution rewrites the page size with a note.
FORCED_PAGE_SIZES = {"flashmla": (64,), "cutlass_mla": (128,), "trtllm_mla": (32, 64)}

#: Backends whose speculative verify takes one chain only (topk = 1).
TOPK1_ONLY = {
    "flashmla": "Currently FlashMLA only supports topk=1 for speculative decoding",
    "cutlass_mla": "Cutlass MLA backend only supports topk=1 for speculative decoding.",
    "trtllm_mla": "TRTLLM MLA backend only supports topk=1 for speculative decoding.",
    "cutedsl_mla": "CuteDSL MLA backend only supports topk=1 for speculative decoding.",
}


def resolve(args: ServerArgs) -> None:
    if args.dcp_size < 1:
        raise ValueError(
            "Decode context parallel size (--dcp-size / --decode-context-parallel-size) "
            f"must be >= 1, but got dcp_size={args.dcp_size}."
        )
    name = args.attention_backend
    if name in ALIASES:
        target, kv_dtype = ALIASES[name]
        args.notes.append(f"{name} is deprecated: using {target} with kv-cache-dtype {kv_dtype}")
        args.attention_backend, args.kv_cache_dtype = target, kv_dtype
        name = target
    if name not in _FACTORIES:
        raise ValueError(f"Invalid attention backend: {name}")
    _check_arch(args)
    if name == "trtllm_mla" and args.kv_cache_dtype not in ("auto", "bf16", "fp8_e4m3"):
        raise ValueError("TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto.")
    if name in FORCED_PAGE_SIZES and args.page_size not in FORCED_PAGE_SIZES[name]:
        forced = FORCED_PAGE_SIZES[name][-1]
        args.notes.append(f"page size {args.page_size} → {forced} for {name}")
        args.page_size = forced
    if args.spec.topk > 1:
        if name in TOPK1_ONLY and args.model.mla:
            raise ValueError(TOPK1_ONLY[name])
        if name == "flashinfer" and args.model.mla:
            raise ValueError("FlashInfer MLA backend only supports topk=1 for speculative decoding.")
        if args.page_size > 1 and name not in ("flashinfer", "fa3"):
            raise ValueError(
                "Speculative decoding with topk > 1 and page_size > 1 is only supported "
                "by the flashinfer and fa3 backends."
            )


def _check_arch(args: ServerArgs) -> None:
    name, sm = args.attention_backend, args.sm
    if name == "trtllm_mla" and sm // 10 not in (10, 12):
        raise ValueError(
            "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend."
        )
    if name == "cutedsl_mla" and sm // 10 != 10:
        raise ValueError(
            "CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). Please use a different backend."
        )
    if name == "cutlass_mla" and sm // 10 != 10:
        raise ValueError(
            "Cutlass MLA backend is only supported on Blackwell GPUs (SM100). Please use a different backend."
        )
    if name == "flashmla" and sm not in (90, 100):
        raise ValueError(
            "FlashMLA backend requires Hopper (SM90) or Blackwell (SM100) GPUs. Please use a different backend."
        )
    if name == "fa3" and not (80 <= sm <= 90 and (sm >= 90 or not args.model.mla)):
        raise AssertionError(
            "FlashAttention v3 Backend requires SM>=80 and SM<=90. Please use `--attention-backend flashinfer`."
        )


# --------------------------------------------------------------------------------------------
# Factories: each refuses what its backend cannot serve, then says what it builds.
# --------------------------------------------------------------------------------------------


def _mla_only(args: ServerArgs) -> None:
    if not args.model.mla:
        raise ValueError(f"{args.attention_backend} backend can only be used with MLA models.")


def _dcp_capable(args: ServerArgs, *, returns_lse: bool, dcp_positions: bool) -> None:
    """DCP merges rank-local results by their LSE; DCP + spec masks by global positions."""
    if args.dcp_size == 1:
        return
    if not args.model.mla:
        raise ValueError(
            "Decode context parallelism needs an MLA model (one latent KV head shared by all heads); "
            f"{args.model.name} has {args.model.num_kv_heads} KV heads."
        )
    if not returns_lse:
        raise ValueError(
            f"{args.attention_backend} cannot serve decode context parallelism: its decode kernel "
            "returns no rank-local LSE for the cross-rank merge."
        )
    if args.spec.enabled and not dcp_positions:
        raise ValueError(
            f"{args.attention_backend} cannot serve decode context parallelism with speculative decoding: "
            "its decode kernel does not take the global token positions of a DCP rank."
        )


def _no_kernel(backend: str, library: str) -> str:
    return f"no {backend} decode kernel in the built-in engine ({library} is not wrapped here)"


def _library_kernel(args: ServerArgs, default_reason: str) -> dict[str, Any]:
    """The installed library's kernel (flash_mla, flashinfer) where it runs on this host, else why not."""
    spec, reason = library_kernel_for(args.attention_backend, probe_host()["arch"], model=args.model,
                                      spec=args.spec, dcp=args.dcp_size, kv_cache_dtype=args.kv_cache_dtype)
    if spec is None and reason is None:
        return {"kernel_reason": default_reason}
    return {"kernel": spec, "kernel_reason": reason}


@register_attention_backend("triton")
def _triton(args: ServerArgs) -> Configured:
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    return Configured({"decode": "triton", "prefill": "triton"}, kernel=TRITON_KERNEL)


@register_attention_backend("flashinfer")
def _flashinfer(args: ServerArgs) -> Configured:
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    role = "flashinfer_mla" if args.model.mla else "flashinfer"
    return Configured({"decode": role, "prefill": role}, **_library_kernel(args, _no_kernel("flashinfer", "flashinfer")))


@register_attention_backend("fa3")
def _fa3(args: ServerArgs) -> Configured:
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    return Configured({"decode": "fa3", "prefill": "fa3"}, kernel_reason=_no_kernel("fa3", "flash-attn 3"))


@register_attention_backend("flashmla")
def _flashmla(args: ServerArgs) -> Configured:
    _mla_only(args)
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    return Configured({"decode": "flashmla", "prefill": "flashmla"},
                      **_library_kernel(args, _no_kernel("flashmla", "flash_mla")), notes=tuple(args.notes))


@register_attention_backend("cutlass_mla")
def _cutlass_mla(args: ServerArgs) -> Configured:
    _mla_only(args)
    _dcp_capable(args, returns_lse=False, dcp_positions=False)
    return Configured({"decode": "cutlass_mla", "prefill": "cutlass_mla"},
                      kernel_reason=_no_kernel("cutlass_mla", "sgl-kernel"), notes=tuple(args.notes))


@register_attention_backend("trtllm_mla")
def _trtllm_mla(args: ServerArgs) -> Configured:
    _mla_only(args)
    if args.dcp_size > 1 and args.spec.enabled:
        raise ValueError(
            "trtllm_mla cannot serve decode context parallelism with speculative decoding: it does not "
            "forward the cyclic DCP metadata to its decode kernel and returns no rank-local LSE for the "
            "cross-rank merge. Select cutedsl_mla."
        )
    _dcp_capable(args, returns_lse=True, dcp_positions=False)
    return Configured({"decode": "trtllm_mla", "prefill": "trtllm_mla"},
                      **_library_kernel(args, _no_kernel("trtllm_mla", "flashinfer")), notes=tuple(args.notes))


@register_attention_backend("cutedsl_mla")
def _cutedsl_mla(args: ServerArgs) -> Configured:
    _mla_only(args)
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    # CuteDSL MLA decodes only; prefill stays on trtllm_mla as in SGLang's hybrid wrapper.
    return Configured({"decode": "cutedsl_mla", "prefill": "trtllm_mla"},
                      kernel_reason=_no_kernel("cutedsl_mla", "CuTe DSL"), notes=tuple(args.notes))


@register_attention_backend("trtllm_mha")
def _trtllm_mha(args: ServerArgs) -> Configured:
    if args.model.mla:
        raise ValueError("trtllm_mha backend can only be used with non-MLA models.")
    _dcp_capable(args, returns_lse=True, dcp_positions=True)
    return Configured({"decode": "trtllm_mha", "prefill": "trtllm_mha"},
                      kernel_reason=_no_kernel("trtllm_mha", "flashinfer"))


class ReferenceEngine(Engine):
    """The embedded default engine (``[engine] name = "reference"``)."""

    name = "reference"
    version = __version__
    refusal_errors: tuple[type[BaseException], ...] = (ValueError, AssertionError)

    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        args = ServerArgs(
            model=model,
            attention_backend=cell.backend,
            arch=cell.arch,
            dcp_size=cell.dcp,
            spec=parse_spec(cell.spec),
            kv_cache_dtype=cell.kv_dtype or "auto",
            page_size=cell.page_size or 1,
            tp_size=cell.tp or 1,
        )
        resolve(args)
        configured = _FACTORIES[args.attention_backend](args)
        if args.notes and not configured.notes:
            configured = dataclasses.replace(configured, notes=tuple(args.notes))
        return configured

    def metadata(self) -> Mapping[str, Any]:
        return {"backends": list(registered_backends())}
