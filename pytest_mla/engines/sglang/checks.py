"""Running SGLang's own attention backend on a kernel check's inputs (``KernelSpec.protocol == "engine"``).

For an accepted cell the adapter (``adapter.SGLangEngine``) asks ``kernel_for``
which check the cell runs; the harness then calls ``run`` once per DCP rank
(``kernels/engine_check.py``). Nothing here computes attention or merges
ranks: SGLang does, with what SGLang built.

What ``run`` builds, per rank, in this process (``rank`` builds the pieces, ``batch`` the requests):

* **Server arguments** as ``sglang serve`` parses them for the cell's decode
  backend, with the page size, KV-cache dtype, TP / DCP sizes, speculative
  settings and ``--triton-attention-num-kv-splits`` that the adapter
  resolved, published through ``runtime_context``; the rank's place (TP /
  attention-TP / DCP ranks and the DCP group) is stated on SGLang's
  ``ParallelContext``.
* **The smallest real model runner** the backend reads: SGLang's own
  ``ReqToTokenPool``, ``MLATokenToKVPool`` (``MHATokenToKVPool`` for a GQA
  model), its token allocator (the paged one, widened by the DCP size, as
  the KV-cache configurator builds it under DCP) and ``KVIndexTranslator``,
  on the check's device. Requests get their slots from the allocator; the
  cached tokens are written through the pool's own write path (under DCP
  each rank keeps what SGLang's owner rule gives it); every other slot is NaN.
* **The backend** through SGLang's factory (``ATTENTION_BACKENDS[name]``),
  a ``ForwardBatch`` (``DECODE`` or ``TARGET_VERIFY``) bound to the
  translator's plan, ``init_forward_metadata`` and the layer's own
  ``RadixAttention.forward``. For a speculative cell the verify mask comes from
  SGLang's draft-tree code (``select_top_k_tokens``,
  ``organize_draft_results``, ``build_tree_kernel_efficient`` with SGLang's
  Triton tree builder), fed draft scores that make it pick the check's tree.
* **The model's attention path.** A DeepSeek-style MLA model does not call the
  backend directly: its absorbed-MLA code (``forward_absorb_core``) does,
  after ``all_gather_q_for_mla_decode`` under DCP, and merges ranks with
  ``cp_lse_ag_out_rs_mla`` where its backend returns an LSE. ``run`` calls
  that code on a stand-in attention module whose up-projection ``w_vc`` and
  ``o_proj`` are identities, so what comes out is the attention output. A GQA
  model's layer calls ``RadixAttention`` itself (the backend merges under DCP
  with ``cp_lse_ag_out_rs_mha``).
* **The DCP group**: in process, a stand-in with ``GroupCoordinator``'s
  collective methods over the harness's turn-taking ranks; with
  ``--mla-dcp-mode=distributed``, SGLang's own ``init_model_parallel_group``
  on gloo.

A failure while building any of this is the adapter's (``AdapterError``);
an exception raised by SGLang once it computes is a finding (the harness's
``BackendRaised``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

from ...core.errors import AdapterError
from ...core.kernelspec import KernelSpec
from ...core.spec import parse_spec
from .backends import backend
from .support import missing_kernel_library

__all__ = ["TARGET", "kernel_for", "kernel_from", "run"]

#: The engine runner (``KernelSpec.target``).
TARGET = "pytest_mla.engines.sglang.checks:run"
PACKAGE = "sglang"
#: ``--triton-attention-num-kv-splits`` the checks run with (SGLang's default is 8); see docs/engines.md.
NUM_KV_SPLITS = 2

# ---- what a cell runs (called by the adapter's configure) --------------------------------------


def kernel_from(cell: Any, model: Any, server_args: Any, runner: Any, kernel_target: str,
                platform: str | None = None) -> tuple[KernelSpec | None, str]:
    """``kernel_for`` with what SGLang resolved for the cell (its server args and the runner facts).

    ``platform``: the platform of the child process that resolved a cell of
    another platform (None: the CUDA process).
    """
    import torch

    host_arch = None if kernel_target in ("interpreter", "cpu") else kernel_target
    reason = not_runnable(cell, runner.decode_attention_backend_str, host_arch)
    # (another platform's cell, in its child: ``kernel_for`` says whether its check runs there)
    if reason is not None and backend(runner.decode_attention_backend_str).cpu_check != "emulated" and platform is None:
        return None, reason  # nothing more to read: the backend cannot run here
    tp = int(server_args.tp_size)
    dcp = max(int(getattr(server_args, "dcp_size", 1) or 1), 1)
    # (ROCm's e4m3fnuz cache is SGLang's fp8_e4m3 there: kv_cache_dtype.py TORCH_DTYPE_TO_KV_CACHE_STR)
    kv = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2",
          torch.float8_e4m3fnuz: "fp8_e4m3"}.get(runner.kv_cache_dtype, "auto")
    if kv == "auto" and runner.kv_cache_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None, f"SGLang resolved a {runner.kv_cache_dtype} KV cache, which the checks do not build"
    config = runner.model_config
    heads = config.get_num_attention_heads(tp)
    kv_heads = config.get_num_kv_heads(tp, dcp) if not model.mla else 1
    return kernel_for(cell, model, decode_backend=runner.decode_attention_backend_str, page_size=runner.page_size,
                      kv_cache_dtype=kv, tp=tp, num_heads=heads, num_kv_heads=kv_heads, host_arch=host_arch,
                      platform=platform)


#: How a cached MLA row of an FP8 cache may hold its token (see ``kernel_for``).
MLA_KV_CONVENTIONS = (("scaled", "K / k_scale (triton decode, trtllm_mla extend)"),
                      ("raw", "K itself (flashinfer, the pool's set_kv_buffer / set_mla_kv_buffer)"))


def kernel_for(cell: Any, model: Any, *, decode_backend: str, page_size: int, kv_cache_dtype: str,
               tp: int, num_heads: int, num_kv_heads: int, host_arch: str | None,
               platform: str | None = None) -> tuple[KernelSpec | None, str]:
    """The kernel check of an accepted cell: ``(spec, "")``, or ``(None, reason)`` when it cannot run here.

    ``decode_backend`` is the backend SGLang resolved for decode (``triton``
    for ``fa3`` + fp8_e5m2 too); ``page_size`` / ``kv_cache_dtype`` as it
    resolved them; ``num_heads`` / ``num_kv_heads`` the query and KV heads one
    rank's attention holds (SGLang's ``num_attention_heads // tp`` and
    ``get_num_kv_heads``); ``host_arch`` this host's GPU (None: none).
    Everything the check depends on goes into the spec's plain options, so
    cells that resolve to the same engine kernel share one check.
    """
    spec = parse_spec(cell.spec)
    record = backend(decode_backend)
    reason = not_runnable(cell, decode_backend, host_arch)
    emulate = reason is not None and record.cpu_check == "emulated"
    if platform is not None:  # another platform's cell, resolved in its child: its check runs there
        emulate, reason = False, None
        if platform not in record.checked_on:
            reason = f"SGLang's {decode_backend} on the {platform} platform has no check"
        platform_ops = platform_emulations(cell, model, platform, decode_backend)
    # A DSA checkpoint (index_topk) on a dense backend: SGLang builds its DSA KV pool and runs the
    # indexer, which hands no top-k to a backend without indexer metadata, so the backend attends
    # every cached token (``DSA_DENSE``; docs/engines.md). QSA's backend has indexer metadata of its
    # own, which the DSA indexer would read: not modelled.
    dsa = bool(getattr(model, "index_topk", 0))
    if (reason is None or emulate) and dsa and record.dsa_unmodelled:
        reason = (f"SGLang serves {cell.model}, a DeepSeek DSA checkpoint, with its DSA KV pool and its indexer's "
                  "top-k handed to the backend (DeepseekMLAForwardMixin, use_dsa: forward_mla.py's indexer call); "
                  f"{decode_backend}'s backend has indexer metadata of its own (get_indexer_metadata), which the "
                  "check does not model")
        emulate = False
    if reason is not None and not emulate:
        return None, reason
    dcp = max(cell.dcp, 1)
    options = (
        ("backend", decode_backend),
        ("model", cell.model),
        ("tp", tp),
        ("dcp", dcp),
        ("page_size", int(page_size)),
        ("kv_cache_dtype", str(kv_cache_dtype)),
        ("speculative", (spec.algorithm, spec.topk, spec.steps, spec.num_draft_tokens) if spec.enabled else None),
        ("num_kv_splits", NUM_KV_SPLITS),
        ("mla", bool(model.mla)),
        # SGLang's MLA write paths disagree on what an FP8 row holds when k_scale != 1: triton's
        # decode and trtllm_mla's extend divide by k_scale first, flashinfer's and the pool's plain
        # doors (set_kv_buffer, set_mla_kv_buffer) store K as it is. The cached tokens come from
        # whichever prefill served them: the check fills the cache each way (rank.RankSetup._write_mla).
        ("kv_conventions", MLA_KV_CONVENTIONS if model.mla else None),
        ("emulate", emulate),
        # the arch the backend's code sees (it branches on it); an interpreted or native check runs
        # the same on every CUDA arch, an emulated one under the cell's faked platform, another
        # platform's cell in that platform's child under its own arch (``platform_check``)
        # (a DSA checkpoint's native CUDA check too: its server arguments resolve per arch, ``run``)
        ("arch", cell.arch if emulate or platform is not None or (dsa and record.cpu_check == "native") else None),
        ("platform", platform),
        ("platform_emulations", platform_ops if platform is not None else ()),
        # a DSA checkpoint: SGLang's DSA KV pool and its indexer's gate (``DSA_DENSE``)
        ("dsa", (int(model.index_topk),) if dsa else None),
    )
    case = [("h_q", num_heads * dcp), ("page_size", int(page_size)), ("kv_dtype", str(kv_cache_dtype)),
            ("min_seqlen", 1)]
    if not model.mla:
        case.append(("h_kv", num_kv_heads))
    # SGLang's DeepSeek and Llama checkpoints get KV scales only through their quantization config
    # (Fp8KVCacheMethod: k_scale 1.0 unless the checkpoint stores one); an unquantized checkpoint has none.
    case.append(("kv_scales", (1.0, "calibrated") if model.quant_method != "none" else (1.0,)))
    method = "forward_extend" if spec.enabled else "forward_decode"
    return KernelSpec(
        name=decode_backend, target=TARGET, protocol="engine",
        level="emulated" if emulate or (platform is not None and platform_ops) else "backend",
        package=PACKAGE, function=f"{record.module}:{record.class_name}.{method}", options=options,
        case=tuple(case), returns_lse=False, fp8_dots=record.cpu_check == "interpreted",
    ), ""


#: Compiled ops of a platform's own sgl_kernel build that a platform check's path calls, with an emulation in
#: ``kernels.emulated`` (used where this host's torch lacks the op): (platform, arch, MLA model?) -> ops.
#: ``cpu_amx`` and ``xpu``: a GQA pool's writes (``memory_pool._set_kv_buffer_impl``: ``_is_cpu and
#: _cpu_has_amx_support``, ``_is_xpu``), except a backend's whose DCP writes take the pool's masked path
#: (``Backend.masked_dcp_writes``), which never reach it.
PLATFORM_OPS = {("cpu", "cpu_amx", False): ("torch.ops.sgl_kernel:store_cache_cpu",),
                ("xpu", "xpu", False): ("sgl_kernel:store_cache_xpu",)}


def platform_emulations(cell: Any, model: Any, platform: str, decode_backend: str) -> tuple[str, ...]:
    """The ops of ``PLATFORM_OPS`` and the backend's ``platform_ops`` the cell's platform check calls and this
    host does not have."""
    import importlib

    import torch

    record = backend(decode_backend)
    if record.masked_dcp_writes and int(cell.dcp) > 1:
        return ()
    from ..common.gpu_steps import _KernelName

    ops = PLATFORM_OPS.get((platform, str(cell.arch), bool(model.mla)), ())
    ops += record.platform_ops.get((platform, bool(model.mla)), ())
    missing = []
    for op in ops:
        path, _, name = op.partition(":")
        if path.startswith("torch.ops."):
            present = hasattr(getattr(torch.ops, path.removeprefix("torch.ops.")), name)
        else:  # a kernel library's function: absent, or the platform child's import stub of it
            try:
                present = not isinstance(getattr(importlib.import_module(path), name), _KernelName)
            except (ImportError, AttributeError):
                present = False
        if not present:
            missing.append(op)
    return tuple(missing)


def not_runnable(cell: Any, decode_backend: str, host_arch: str | None) -> str | None:
    """Why SGLang's ``decode_backend`` cannot run for ``cell`` on this host (None: it can)."""
    record = backend(decode_backend)
    if record.cpu_check in ("interpreted", "native"):
        return None
    modules = record.gpu_libraries
    missing = [m for m in modules if not _importable(m)]
    if host_arch is None or host_arch != cell.arch or missing:
        needs = f"a CUDA {cell.arch} GPU" + (f" with {', '.join(modules)} installed" if modules else "")
        here = "this host has no GPU" if host_arch is None else f"this host is {host_arch}"
        if host_arch is not None and missing:
            here += f" without {', '.join(missing)}"
        return f"SGLang's {decode_backend} backend runs on {needs}; {here}"
    return None


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ---- the engine runner -------------------------------------------------------------------------


def run(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One DCP rank of a check: build SGLang's pieces for ``inputs``, run its attention path, return the rank's heads."""
    from .rank import load_engine

    engine = load_engine()
    if backend(options["backend"]).compiled_by_torch:
        if options.get("dsa") and options.get("arch") and options.get("platform") is None:
            from . import emulation

            from ...kernels.engine_runner import EngineCannotRun

            try:
                with emulation.stated_arch(engine, options["arch"]):
                    result = _run_flex(engine, inputs, ctx, options)
            except ImportError as exc:  # e.g. the stated Blackwell's fi_a2a DCP exchange: FlashInfer, not here
                library = missing_kernel_library(exc)
                if library is None:
                    raise
                raise EngineCannotRun(f"SGLang on the stated {options['arch']} imports {library}, a kernel library "
                                      "this host lacks (this flex_attention check emulates none)") from None
            import dataclasses

            return dataclasses.replace(result, notes=tuple(result.notes) + (
                f"SGLang's server arguments resolved on a CPU host stated to SGLang as an {options['arch']} GPU "
                "(runtime_context platform facts, get_device_capability): a DSA checkpoint's resolution reads "
                "the capability; flex_attention itself ran on this CPU",))
        return _run_flex(engine, inputs, ctx, options)
    if options.get("platform") is not None:
        return _run_on_platform(engine, inputs, ctx, options)
    if not options.get("emulate"):
        return _run_rank(engine, inputs, ctx, options, None)
    from ...kernels.emulated.glue import OutOfContractError, OutOfRangeRead
    from ...kernels.engine_runner import EngineCannotRun
    from . import emulation

    try:
        with emulation.scope(engine, dict(options)) as shared:
            return _run_rank(engine, inputs, ctx, options, shared)
    except OutOfRangeRead:
        raise  # SGLang handed the kernel an index it would follow outside the cache: its bug
    except OutOfContractError as exc:  # a kernel call no emulation models: not a finding, not verified
        raise EngineCannotRun(f"SGLang's {options['backend']} backend called a kernel outside the emulations' "
                              f"contracts: {exc}") from None
    except ImportError as exc:
        library = missing_kernel_library(exc)
        if library is None:
            raise
        raise EngineCannotRun(f"SGLang's {options['backend']} backend imports {library}, a kernel library this "
                              "host lacks and no emulation stands in for") from None


def _run_on_platform(engine: Any, inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One rank of another platform's cell, in that platform's child, under the cell's arch (``platform_check``).

    A compiled call of the platform's own kernel libraries (an import stub
    here: ``GpuStep``) or a ``torch.ops.sgl_kernel`` op this host's torch
    lacks is what the path needs and this host cannot run: not-run naming it.
    """
    import dataclasses

    from ...kernels.emulated.glue import OutOfContractError, OutOfRangeRead
    from ...kernels.engine_runner import EngineCannotRun
    from ..common.gpu_steps import GpuStep
    from . import platform_check
    from .platforms import loaded_platform

    if options.get("platform") != loaded_platform():
        # (a rank process of --mla-dcp-mode=distributed loads SGLang afresh, for CUDA)
        raise EngineCannotRun(f"SGLang's {options['backend']} on the {options['platform']} platform runs in a process "
                              f"that loaded SGLang on it; this one loaded it for {loaded_platform()} (with "
                              "--mla-dcp-mode=distributed each rank is such a process: use in-process DCP)")
    try:
        with platform_check.scope(engine.rc, options["arch"]) as changed, \
                platform_check.emulations(options.get("platform_emulations") or (), options["platform"]) as log:
            result = _run_rank(engine, inputs, ctx, options, None)
        if log is not None:
            result = dataclasses.replace(result, emulated=tuple(log.called), notes=tuple(result.notes) + (
                "the platform's compiled ops " + ", ".join(log.called) + " ran as their emulations (kernels/emulated: "
                "this host lacks the platform's sgl_kernel build); everything else ran as on the platform",))
    except OutOfRangeRead:
        raise  # SGLang handed an op an index outside the cache: its bug
    except OutOfContractError as exc:
        raise EngineCannotRun(f"SGLang's {options['backend']} on the {options['platform']} platform "
                              f"({options['arch']}) called a platform op outside its emulation's contract: {exc}") from None
    except GpuStep as step:
        raise EngineCannotRun(f"SGLang's {options['backend']} on the {options['platform']} platform "
                              f"({options['arch']}) calls {step.what}") from None
    except Exception as exc:
        # (while the check's pools are filled, the adapter's stage wraps it: its cause says)
        op = _missing_op(exc) or _missing_op(exc.__cause__)
        if op is None:
            raise
        raise EngineCannotRun(f"SGLang's {options['backend']} on the {options['platform']} platform "
                              f"({options['arch']}) calls torch.ops.{op}, which this host's torch does not have "
                              "(the platform's sgl_kernel build is not installed)") from None
    return dataclasses.replace(result, notes=tuple(result.notes) + platform_check.notes(options, changed))


#: What Inductor's CPU flex-attention lowering says of a query and KV of different dtypes
#: (torch/_inductor/kernel/flex/flex_cpu.py); its CUDA Triton template takes them.
_FLEX_CPU_MIXED_DTYPES = "Mixed query, key, and value dtype is not supported on this platform"


def _run_flex(engine: Any, inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """One rank of a flex_attention cell: SGLang's TorchFlexAttnBackend on this CPU (its torch.compile'd
    flex_attention compiled by Inductor for the CPU). An fp8 cache reaches flex_attention as it is stored
    (TorchFlexAttnBackend passes the cache rows unconverted), which the CPU lowering refuses: not-run."""
    from ...kernels.engine_runner import EngineCannotRun

    try:
        return _run_rank(engine, inputs, ctx, options, None)
    except Exception as exc:
        if _FLEX_CPU_MIXED_DTYPES not in str(exc):
            raise
        raise EngineCannotRun(f"SGLang's TorchFlexAttnBackend hands flex_attention the {options['kv_cache_dtype']} "
                              "cache rows as stored with a bf16 query; torch.compile on this CPU refuses mixed "
                              "dtypes (Inductor's flex_cpu lowering: 'Mixed query, key, and value dtype is not "
                              "supported on this platform'), where a CUDA GPU's Triton template takes them") from None


def _missing_op(exc: BaseException) -> str | None:
    """``namespace.op`` when ``exc`` says ``torch.ops`` has no such operator (None otherwise)."""
    import re

    if exc is None:
        return None
    found = re.search(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'", str(exc))
    return f"{found.group(1)}.{found.group(2)}" if isinstance(exc, AttributeError) and found else None


def _run_rank(engine: Any, inputs: Any, ctx: Any, options: Mapping[str, Any], shared: Any) -> Any:
    import dataclasses

    from .rank import RankSetup

    with _ADAPTER_STAGE("set up SGLang for the check"):
        rank = RankSetup.build(engine, inputs, ctx, options)
    compiled = _compiled_counts() if backend(options["backend"]).compiled_by_torch else None
    try:
        result = rank.compute()
    finally:
        rank.close()
    if compiled is not None:
        result = dataclasses.replace(result, notes=tuple(result.notes) + _flex_notes(compiled, _compiled_counts()))
    if shared is None:
        return result
    return dataclasses.replace(result, emulated=tuple(shared.log.called),
                               notes=tuple(result.notes) + tuple(shared.notes()))


def _compiled_counts() -> dict[str, int]:
    """What ``torch.compile`` did so far in this process (dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {"cpp_templates": int(counters["inductor"].get("cpp_templated_kernel_counter", 0)),
            "frames": int(counters["frames"].get("ok", 0)),
            "breaks": sum(counters["unimplemented"].values()) + sum(counters["graph_break"].values())}


def _flex_notes(before: Mapping[str, int], after: Mapping[str, int]) -> tuple[str, ...]:
    """What ran of SGLang's ``torch.compile(flex_attention, dynamic=True)`` during the check.

    SGLang's TorchFlexAttnBackend calls flex_attention through torch.compile; on
    this host Inductor compiles it for the CPU (its C++ flex-attention
    template), where a CUDA GPU gets Inductor's Triton template.
    """
    templates = after["cpp_templates"] - before["cpp_templates"]
    breaks = after["breaks"] - before["breaks"]
    if templates <= 0:
        return ("torch.compile(flex_attention) compiled no flex-attention kernel during the check (an earlier "
                "check's compiled frames served it, or dynamo ran it eagerly)",)
    return (f"torch.compile(flex_attention) ran on this host's CPU: Inductor's C++ flex-attention template "
            f"({templates} kernel(s); a CUDA GPU gets Inductor's Triton template)"
            + (f"; dynamo broke the graph {breaks} time(s) on data-dependent branches over SGLang's tensor "
               "sequence lengths (block-mask sizes), so flex_attention's Python around the kernel ran eagerly"
               if breaks else ""),)


class _AdapterStage:
    """``with _ADAPTER_STAGE(what):`` turns any exception into ``AdapterError`` (the adapter's failure)."""

    def __call__(self, what: str) -> contextlib.AbstractContextManager:
        return self._stage(what)

    @staticmethod
    @contextlib.contextmanager
    def _stage(what: str) -> Iterator[None]:
        from ...kernels.emulated.glue import OutOfContractError, OutOfRangeRead

        try:
            yield
        except (AdapterError, OutOfContractError, OutOfRangeRead):  # an emulation's refusal is the run's verdict, not ours
            raise
        except Exception as exc:
            if getattr(exc, "mla_engine_raised", False):  # SGLang's own code raised (rank marks it): a finding
                raise
            from .support import adapter_error

            raise adapter_error(what, f"{type(exc).__name__}: {exc}") from exc


_ADAPTER_STAGE = _AdapterStage()
