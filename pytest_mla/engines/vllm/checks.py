"""A vLLM kernel check: which of vLLM's kernels an accepted cell runs, whether it can run here, its ``KernelSpec``.

``kernel_for`` turns the backend vLLM's start-up selected for a cell
(``startup.Startup``) into the check the harness runs: the runner (``RUNNER``
for MLA models, ``ATTN_RUNNER`` for GQA ones: ``rank.run_mla``, ``rank.run_attn``), the options
the rank needs to rebuild vLLM's layer, the path vLLM's builder sends the
cell's rows to, and the level (``backend``: the real kernels; ``emulated``:
``emulation``'s float64 stand-ins). Or why the cell runs no check here.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..common.process_group import DcpGroup
from . import emulation
from .backends import backend
from .batch import spec_tokens
from .model import backend_class, build_mla_layer, gqa_config, mla_config
from .platform_check import other_platform_reason, platform_options, runs_here, unchecked_path_reason
from .rank import vllm_context
from .support import LAYER_NAME, PACKAGE, stand_in_guard

#: The runners, in the adapter's module: a process running one makes its engine first (``adapter.run_mla``).
RUNNER = "pytest_mla.engines.vllm.adapter:run_mla"
ATTN_RUNNER = "pytest_mla.engines.vllm.adapter:run_attn"


def _startup_compilation(options: dict[str, Any], startup: Any) -> None:
    """The start-up's resolved CUDA-graph settings into the check's options (see ``model.compilation_config``)."""
    if startup is not None:
        compilation = startup.vllm_config.compilation_config
        options["cudagraph_mode"] = compilation.cudagraph_mode.name
        options["max_cudagraph_capture_size"] = compilation.max_cudagraph_capture_size


#: The largest decode graph the checks pad to: a check's batch holds a handful of requests.
MAX_GRAPH_REQUESTS = 64


def decode_graph_sizes(startup: Any) -> tuple[int, ...]:
    """The request counts of the FULL CUDA graphs the cell's server replays uniform decode batches on, as its
    start-up resolved them (``decode_cudagraph_capture_request_sizes``; () where its decode batches run
    without a FULL graph: ``cudagraph_mode``'s decode mode, lowered for the backend, is not FULL)."""
    if startup is None:
        return ()
    from vllm.config.compilation import CUDAGraphMode

    compilation = startup.vllm_config.compilation_config
    if compilation.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:
        return ()
    sizes = getattr(compilation, "decode_cudagraph_capture_request_sizes", None) or ()  # a V2-runner field
    return tuple(int(n) for n in sizes if int(n) <= MAX_GRAPH_REQUESTS)


def backend_name(path: str) -> str:
    """The ``AttentionBackendEnum`` name of the backend class vLLM selected (``path``: its qualified name)."""
    import importlib

    module, _, qualname = path.rpartition(".")
    return getattr(importlib.import_module(module), qualname).get_name()


def kernel_for(engine: Any, cell: Any, model: Any, path: str, tp: int,
               startup: Any = None) -> tuple[Any, str | None]:
    """``(KernelSpec, None)`` when vLLM's own backend for this cell can run here, else ``(None, why)``.

    ``startup`` (the adapter's ``Startup``) holds the metadata builder vLLM
    constructed for the cell: its reorder threshold decides whether the
    cell's query rows take the decode path or the MLA prefill path.
    """
    from ...core.cells import platform_of
    from ...kernels._mode import ensure_triton_mode

    name = backend_name(path)
    platform = platform_of(cell.arch)
    if platform != "cuda":
        if not runs_here(engine, name, platform):
            return None, other_platform_reason(name, cell.arch, platform)
        return _platform_spec(engine, cell, model, tp, name, platform, startup)
    record = backend(name)
    if record.cpu_op:  # a CPU backend forced on a CUDA arch: its ops exist in a CPU build of vllm._C only
        return None, (f"vLLM's {name} on a CUDA arch ({cell.arch}) calls torch.ops._C.{record.cpu_op} (and, for "
                      "AMX_MLA, convert_weight_packed when its weights load), which only a CPU build of vllm._C "
                      "registers: not checked here (a CUDA build would raise AttributeError; a candidate finding)")
    where = ensure_triton_mode()
    if record.runner == "attn" and not model.mla:
        return _attn_spec(engine, cell, model, tp, where, name, startup), None
    if record.runner == "mla" and model.mla:
        return _mla_spec(engine, cell, model, tp, where, name, startup), None
    return None, f"no engine check for vLLM's {name} backend on this host"


def _path_of(cell: Any, startup: Any) -> str:
    """"prefill" when vLLM's builder classes the cell's query rows as prefills, else "decode".

    vLLM's ``split_decodes_and_prefills`` sends rows longer than the builder's
    ``reorder_batch_threshold`` to ``forward_mha``: speculative verify on a
    backend whose decode takes one token (CUTLASS_MLA) or, under DCP, on one
    without DCP support for multi-token decode (TRITON_MLA, FLASHMLA).
    """
    from ...core.spec import parse_spec

    s_q = parse_spec(str(cell.spec)).s_q
    if startup is None or s_q == 1 or startup.builder.reorder_batch_threshold is None:
        # no threshold: the builder splits nothing (XPUMLASparseMetadataBuilder decodes every token)
        return "decode"
    return "prefill" if s_q > startup.builder.reorder_batch_threshold else "decode"


def _platform_spec(engine: Any, cell: Any, model: Any, tp: int, name: str, platform: str,
                   startup: Any) -> tuple[Any, str | None]:
    """The check of a ROCm / XPU / CPU cell: vLLM's layer on the child's platform, the cell's arch (``platform_check``).

    The same runners as the CUDA cells (``run_mla``, ``run_attn``); the spec
    names the platform (the parent sends the check to that child) and the arch
    (the platform answers for it while the check runs: ROCm's ``_GCN_ARCH``,
    its fp8 format). Only paths whose compiled calls are all Triton run here.
    """
    from ...kernels._mode import ensure_triton_mode

    where = ensure_triton_mode()
    extra = platform_options(cell, platform)
    if backend(name).runner == "attn" and not model.mla:
        return _attn_spec(engine, cell, model, tp, where, name, startup, extra=extra), None
    path = _path_of(cell, startup)
    reason = unchecked_path_reason(name, cell.arch, platform, path)
    if reason is not None:
        return None, reason
    return _mla_spec(engine, cell, model, tp, where, name, startup, extra=extra), None


def _mla_options(cell: Any, model: Any, tp: int) -> dict[str, Any]:
    tokens, method = spec_tokens(cell)
    options = {"model": model.name, "num_heads": model.num_heads, "kv_lora_rank": model.kv_lora_rank,
               "qk_rope_head_dim": model.qk_rope_head_dim, "qk_nope_head_dim": model.qk_nope_head_dim,
               "v_head_dim": model.v_head_dim, "tp": tp, "dcp": max(cell.dcp, 1), "block_size": int(cell.page_size),
               "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens,
               "spec_method": method}
    if getattr(model, "index_topk", 0):  # a sparse model: the layer gets the indexer's top-k buffer
        options["index_topk"] = model.index_topk
    return options


def _mla_spec(engine: Any, cell: Any, model: Any, tp: int, where: str, name: str, startup: Any,
              extra: Mapping[str, Any] | None = None) -> Any:
    """The engine check of an MLA cell on ``name`` (``run_mla``), at the level this host allows.

    The kernel source: the real kernels where ``emulation.real_kernels_missing``
    finds them (level ``backend``), else the emulations of the path's compiled
    calls (level ``emulated``); TRITON_MLA's decode needs none (Triton runs
    here). TRITON_MLA's decode layer is first built (no kernel runs) under the
    cell's arch: if vLLM's construction raises there (``TritonMLAImpl.__init__``
    refuses FP8 KV below SM89, say), the spec carries the arch so that the
    check raises the same and records it; otherwise that check is the same
    numeric case for every arch and is shared. Every other check runs under
    the cell's arch (the MLA prefill backend and the flash-attention version
    follow it).
    """
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES

    options = _mla_options(cell, model, tp)
    path = _path_of(cell, startup)
    options["backend"] = name
    options["path"] = path
    if not backend(name).compilation_blind:
        _startup_compilation(options, startup)
    calls = emulation.calls_of(name, path, (extra or {}).get("platform"))
    if extra:  # another platform's cell: it runs under its own arch (``_platform_spec``)
        options.update(extra)
        level = "emulated" if calls else "backend"  # a CPU build's ops are not in the installed vllm._C
    elif not calls:
        capability = _capability_of(cell.arch)
        level = "backend"
        if _construction_raises(engine, options, capability):
            options["capability"] = capability
    else:
        capability = _capability_of(cell.arch)
        level = "backend" if emulation.real_kernels_missing(name, path, where, capability) is None else "emulated"
        if path == "prefill":  # see emulation.PREFILL_CALLS: no real kernel takes the check's 576-wide heads
            level = "emulated"
        options["capability"] = capability
    options["level"] = level
    schedule = backend(name).schedule
    if schedule is not None and path == "decode":  # verify rows too: flattened to decode rows, one extent each
        split_from = schedule.split_from()  # per rank: the builder divides max_seq_len over the DCP group
        if split_from:
            options["split_from"] = split_from
    sizes = decode_graph_sizes(startup) if path == "decode" else ()
    if sizes:  # the check pads one run's batch as a FULL graph replays it (rank.run_mla)
        options["graph_padding"] = sizes
    function = emulation.prefill_function(name, options.get("platform")) if path == "prefill" \
        else backend(name).function
    dcp = options["dcp"]
    case = (("h_q", model.num_heads // tp * dcp), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    if options.get("index_topk"):  # the selection the stand-in indexer hands the layer (harness.SPARSE_CHECK_TOPK)
        from ...kernels.harness import SPARSE_CHECK_TOPK

        case += (("sparse_topk", min(SPARSE_CHECK_TOPK, options["index_topk"])),)
    return KernelSpec(name=name, target=RUNNER, protocol="engine", level=level, function=function,
                      package=PACKAGE, returns_lse=False, tree_mask=False,
                      options=tuple(sorted(options.items())), case=case)


def _attn_spec(engine: Any, cell: Any, model: Any, tp: int, where: str, name: str, startup: Any,
               extra: Mapping[str, Any] | None = None) -> Any:
    """The engine check of a GQA cell on TRITON_ATTN, FLASH_ATTN, CPU_ATTN or ROCM_ATTN (``run_attn``).

    TRITON_ATTN runs its Triton kernel here (level ``backend``, shared over
    archs unless the construction raises under the cell's); FLASH_ATTN runs
    under the cell's arch (FA2 on SM80, FA3 on SM90) with flash-attention's
    varlen kernel real on a GPU with it, else emulated. CPU_ATTN (the CPU
    platform's child, ``_platform_spec``) runs with its ``torch.ops._C`` ops
    emulated (a CUDA build of ``vllm._C`` has none of them); ROCM_ATTN (the
    ROCm child) runs its Triton kernels at level ``backend``.
    """
    from ...core.kernelspec import KernelSpec
    from ...kernels.harness import _KV_DTYPES

    tokens, method = spec_tokens(cell)
    options = {"model": model.name, "num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
               "head_dim": model.head_dim, "tp": tp, "block_size": int(cell.page_size),
               "cache_dtype": str(cell.kv_dtype or "auto"), "num_speculative_tokens": tokens, "spec_method": method,
               "backend": name, "dcp": max(cell.dcp, 1)}
    record = backend(name)
    level = "backend"
    if extra:  # another platform's cell: it runs under its own arch (``_platform_spec``)
        options.update(extra)
        if emulation.calls_of(name, "decode", extra["platform"]):  # a CPU build's ops: not in this vllm._C
            level = "emulated"
    elif record.compilation_blind:  # Triton: runs here, one case for every arch its construction accepts
        capability = _capability_of(cell.arch)
        if _attn_construction_raises(engine, options, capability):
            options["capability"] = capability
    else:
        capability = options["capability"] = _capability_of(cell.arch)
        _startup_compilation(options, startup)
        level = "backend" if emulation.real_kernels_missing(name, "decode", where, capability) is None \
            else "emulated"
    options["level"] = level
    case = (("h_q", model.num_heads // tp * options["dcp"]), ("page_size", options["block_size"]),
            ("kv_dtype", _KV_DTYPES.get(options["cache_dtype"], options["cache_dtype"])), ("min_seqlen", 1))
    return KernelSpec(name=name, target=ATTN_RUNNER, protocol="engine", level=level,
                      function=record.function, package=PACKAGE, returns_lse=False, tree_mask=False,
                      dcp_positions=False, options=tuple(sorted(options.items())), case=case)


def _attn_construction_raises(engine: Any, options: Mapping[str, Any], capability: str) -> bool:
    """Whether vLLM raises building the GQA layer of ``options["backend"]`` under ``capability`` (cached; no kernel runs)."""
    key = ("attn", capability, tuple(sorted(options.items())))
    if key not in _probes:
        from vllm.model_executor.layers.attention.attention import Attention

        config = gqa_config(engine, options)
        heads = options["num_heads"] // options["tp"]
        kv_heads = max(1, options["num_kv_heads"] // options["tp"])
        backend_cls = backend_class(options["backend"])

        def build() -> None:
            with stand_in_guard(), vllm_context(engine, config, capability, None):
                Attention(num_heads=heads, head_size=options["head_dim"], scale=1.0, num_kv_heads=kv_heads,
                          cache_config=config.cache_config, prefix=LAYER_NAME, attn_backend=backend_cls)

        _probes[key] = _raises_in_vllm(build)
    return _probes[key]


def _capability_of(arch: str) -> str:
    from ...core.cells import arch_number

    sm = arch_number(arch)
    return f"{sm // 10}.{sm % 10}"


class _NoCollectives:
    """The DCP group's size for building a layer; nothing is exchanged at construction."""

    process_group = None

    def __init__(self, world: int) -> None:
        self.rank, self.world = 0, world

    def all_gather(self, tensor: Any) -> Any:
        raise RuntimeError("no collectives while building the layer")

    all_reduce = all_gather


_probes: dict[tuple[Any, ...], bool] = {}


def _raises_in_vllm(build: Any) -> bool:
    """Whether ``build()`` raises in vLLM's own code; an adapter error is raised on."""
    from ...core.errors import AdapterError
    from ...kernels.engine_runner import engine_function_of

    try:
        build()
        return False
    except AdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 - whether vLLM's own code refused is all we keep
        return engine_function_of(exc, PACKAGE) is not None


def _construction_raises(engine: Any, options: Mapping[str, Any], capability: str) -> bool:
    """Whether vLLM raises building this layer under ``capability`` (cached; no kernel runs)."""
    import torch

    key = (capability, tuple(sorted(options.items())))
    if key not in _probes:
        config = mla_config(engine, options)
        world = options["dcp"]
        group = DcpGroup(_NoCollectives(world), torch.device("cpu")) if world > 1 else None

        def build() -> None:
            with stand_in_guard(), vllm_context(engine, config, capability, group):
                build_mla_layer(options, 1.0, torch.device("cpu"))

        _probes[key] = _raises_in_vllm(build)
    return _probes[key]


# ---- TRITON_ATTN (GQA models) -------------------------------------------------------------------
