"""SGLang's own start-up, run on a faked GPU up to its first GPU step: resolution, factories, constructors.

For a cell ``Startup`` does what ``sglang serve`` does before it serves, in
the same order, with SGLang's own code:

1. **Server arguments**: the argv ``sglang serve`` parses (for a backend name
   outside the parser's ``choices``, which argparse would reject with
   ``SystemExit`` before SGLang checks anything, ``ServerArgs(**kwargs)`` as
   SGLang's programmatic ``Engine(**kwargs)`` builds it), resolved by
   ``ServerArgs.resolve_once`` (the ``arg_groups`` hooks) and published as the
   scheduler process publishes them.
2. **Draft model config** (speculative cells): the draft ``TpModelWorker``'s
   own ``_init_model_config`` (the model's weightless config is its own draft).
3. **Target backends**: the model runner's builder
   (``resolve_attention_backend_strs`` + ``_build_resolved_backend``: decode
   before prefill, a hybrid wrapper when they differ) through SGLang's
   ``ATTENTION_BACKENDS`` factories, **and the backend classes' constructors**.
4. **Draft backends** (speculative cells): the draft runner's own builder,
   then the EAGLE draft worker's ``init_attention_backend``
   (``DraftBackendFactory.create_decode_backend`` when
   ``speculative_num_steps > 1``, then ``create_draft_extend_backend``).

Constructors run until their first step that needs a GPU
(``_gpu_steps.stop_at_gpu_steps``: an allocation on CUDA, a CUDA stream, a
KV pool or the loaded model, a kernel library that is not installed here).
There a constructor stops: the object it was building is kept as far as it
got, the rest of the start-up goes on, and the cell carries a note saying
where each constructor stopped. A refusal raised before that point is the
engine's refusal; an error that only says CUDA is absent is such a stop,
never a refusal. Anything the adapter itself cannot do on the installed
release (an import that moved, a platform fact it cannot derive, a
model-runner attribute its stand-in lacks) raises ``AdapterError`` (verdict
``error``), never an error that would read as the engine's refusal.

How it runs on a CPU-only machine (see docs/engines.md, SGLang):

* **The GPU arch is faked with SGLang's own switch**,
  ``sglang.srt.runtime_context.override_platform(...)``, with every platform
  fact the installed release knows (read from the release, not assumed), and
  ``get_device_capability()`` answers the cell's arch wherever SGLang bound it.
* **Import stubs**: ``torchvision`` (imported for names only) for the whole
  run; uninstalled kernel libraries (``KERNEL_LIBRARIES``) only while
  constructors run, every name in them a GPU step when used.
* **Models** are weightless ``config.json`` files shipped in
  ``pytest_mla/engines/model_configs/<model>/`` (no quantization config).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import os
import sys
import textwrap
import types
import warnings
from typing import Any, Callable, Iterator, Mapping

from ...core.cells import Cell, platform_of
from ...core.models import ModelConfig
from ...core.records import construction_stop_note
from ...core.spec import parse_spec
from ..common import quiet as _quiet
from ..common.gpu_steps import GpuResource, GpuStep, UnsetField, cuda_absent, engine_frame, kernel_library_stubs, missing_libraries
from ..common.gpu_steps import stop_at_gpu_steps
from ..protocol import AdapterError, UnreachableError
from .platforms import PLAIN_LOADS, PLATFORM_LIBRARIES, arch_probes, capability_of, device_of, platform_fact_names
from .platforms import platform_facts
from .support import KERNEL_LIBRARIES, adapter_error, sglang_bindings

if importlib.util.find_spec("sglang") is None:  # the registry turns this into "unavailable"
    raise ImportError("sglang is not installed in this environment", name="sglang")

ENGINE = "sglang"

#: Weightless model configs, one folder per catalogue model.
from ..common import MODEL_CONFIGS

#: The kernel libraries backend modules import unguarded at their top (``from sgl_kernel import
#: merge_state_v2``): while constructors run, those not installed here are stubs whose every name
#: is a GPU step when used, so that the module imports and its constructors' checks run. The
#: others are imported behind availability checks that already answer "absent" here.
STUBBED_KERNEL_LIBRARIES = ("sgl_kernel", "flash_mla", "tokenspeed_mla")

#: SGLang's JIT kernel loader: entering it compiles CUDA code for the device, a GPU step.
JIT_LOADERS = (("sglang.kernels.jit.utils.compile.loader", "load_jit"),)

_BACKEND_OPTIONS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
_SPEC_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "nextn": "NEXTN"}

#: Objects of a model runner that exist only once weights are loaded and KV pools allocated on a GPU.
_GPU_ONLY_RUNNER_FIELDS = ("model", "req_to_token_pool", "token_to_kv_pool", "token_to_kv_pool_allocator",
                           "kv_index_translator", "max_total_num_tokens", "max_running_requests")


def server_kwargs(cell: Cell, model: ModelConfig, model_path: str) -> dict[str, Any]:
    """The ``ServerArgs`` fields a cell sets (``Engine(**kwargs)`` keywords), in argv order.

    A backend value ``P+D`` means ``prefill_attention_backend=P,
    decode_attention_backend=D`` (``attention_backend`` left to SGLang).
    """
    spec = parse_spec(cell.spec)
    tp = cell.tp if cell.tp is not None else max(cell.dcp, 1)
    prefill, plus, decode = cell.backend.partition("+")
    kwargs: dict[str, Any] = {"model_path": model_path, "device": device_of(cell.arch)}
    if plus:  # "P+D": separate prefill and decode backends, attention_backend left to SGLang
        kwargs.update(prefill_attention_backend=prefill, decode_attention_backend=decode)
    else:
        kwargs["attention_backend"] = cell.backend
    kwargs.update(tp_size=tp, dcp_size=cell.dcp)
    if spec.enabled:
        kwargs.update(
            speculative_algorithm=_SPEC_ALGORITHMS[spec.algorithm or ""],
            speculative_eagle_topk=spec.topk,
            speculative_num_steps=spec.steps,
            speculative_num_draft_tokens=spec.num_draft_tokens,
        )
        if not model.mla:  # DeepSeek-style models draft with their own MTP layer (same checkpoint)
            kwargs["speculative_draft_model_path"] = model_path
    if cell.kv_dtype is not None:
        kwargs["kv_cache_dtype"] = cell.kv_dtype
    if cell.page_size is not None:
        kwargs["page_size"] = cell.page_size
    return kwargs


def argv_of(kwargs: Mapping[str, Any]) -> list[str]:
    """``--field-name value`` for each ``ServerArgs`` field (every one used here is its own flag)."""
    return [part for field, value in kwargs.items() for part in ("--" + field.replace("_", "-"), str(value))]


@dataclasses.dataclass
class Resolution:
    """A cell's configuration as SGLang resolved it (valid while that cell's config is published).

    ``runner`` is the target model runner as the backend builder sees it (a
    ``ModelRunner`` whose GPU-only members are :class:`GpuResource`\\ s).
    """

    cell: Cell
    server_args: Any  # the resolved ``ServerArgs``
    model_config: Any  # SGLang's ``ModelConfig`` of the target
    runner: Any
    prefill_backend: str  # resolved backend names the runner builds
    decode_backend: str
    page_size: int
    kv_cache_dtype: Any  # the torch dtype of the KV cache
    use_mla_backend: bool
    facts: Mapping[str, Any]  # the platform facts set for the cell's arch
    notes: list[str] = dataclasses.field(default_factory=list)  # rewrites resolution made


@dataclasses.dataclass(frozen=True)
class Stop:
    """Where a piece of start-up code stopped at its first GPU step."""

    phase: str  # "target", "draft runner", "draft worker"
    unit: str  # "FlashInferMLAAttnBackend.__init__", or the phase's own function
    step: str  # "torch.empty(device='cuda')"
    where: str  # "flashinfer_mla_backend.py:256"

    def note(self) -> str:
        return construction_stop_note(self.phase, self.unit, self.step, self.where)


class RunnerAttributeError(AttributeError):
    """SGLang read a model-runner attribute the adapter's stand-in does not have."""


# ---- finding SGLang's pieces in the installed release ------------------------------------------

def _find(step: str, version: str, candidates: tuple[tuple[str, str], ...]) -> Any:
    """The first ``module.attr`` of ``candidates`` that exists; ``AdapterError`` naming all tried."""
    tried = []
    for module_name, attr in candidates:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            library = (getattr(exc, "name", None) or "").split(".", 1)[0]
            if library in PLATFORM_LIBRARIES:  # SGLang itself needs another platform's library to load here
                raise UnreachableError(step, f"importing {module_name} needs {exc.name!r} "
                                             f"({PLATFORM_LIBRARIES[library]}), which does not exist for this host",
                                       engine=ENGINE, version=version) from exc
            tried.append(f"{module_name}.{attr} ({type(exc).__name__}: {exc})")
            continue
        value = module
        for part in attr.split("."):
            value = getattr(value, part, None)
            if value is None:
                break
        if value is not None:
            return value
        tried.append(f"{module_name}.{attr} (absent)")
    raise AdapterError(step, f"cannot find {' or '.join(tried)}", engine=ENGINE, version=version)


class _SGLang:
    """SGLang's own functions and classes the adapter drives, found in the installed release."""

    def __init__(self, version: str) -> None:
        def find(step: str, *candidates: tuple[str, str]) -> Any:
            return _find(step, version, candidates)

        srt = "sglang.srt"
        find("import", (f"{srt}.runtime_context", "override_platform"))
        self.rc = importlib.import_module(f"{srt}.runtime_context")
        self.server_args_cls = find("import", (f"{srt}.server_args", "ServerArgs"))
        self.prepare_server_args = find("import", (f"{srt}.server_args", "prepare_server_args"))
        self.overrides = importlib.import_module(f"{srt}.arg_groups.overrides")
        self.model_config_of = find("import", (f"{srt}.arg_groups.overrides", "model_config_of"),
                                    (f"{srt}.arg_groups.model_override_base", "model_config_of"))
        self.resolution_result = find("import", (f"{srt}.arg_groups.overrides", "resolution_result"))
        self.mla_arch = find("import", (f"{srt}.configs.model_config", "AttentionArch.MLA"))
        self.registry = importlib.import_module(f"{srt}.layers.attention.attention_registry")
        self.backends = find("import", (f"{srt}.layers.attention.attention_registry", "ATTENTION_BACKENDS"))
        setup = f"{srt}.model_executor.model_runner_components.attention_backend_setup"
        self.resolve_strs = find("import", (setup, "resolve_attention_backend_strs"))
        self.build_resolved = find("import", (setup, "_build_resolved_backend"))
        self.model_runner_cls = find("import", (f"{srt}.model_executor.model_runner", "ModelRunner"))
        self.resolve_draft_backend = find("import", (f"{srt}.model_executor.model_runner",
                                                     "resolve_draft_attention_backend"))
        self.sliding_window = find("import", (f"{srt}.model_executor.model_runner_components.load_model_utils",
                                              "resolve_sliding_window_size"))
        self.tp_worker_cls = find("import", (f"{srt}.managers.tp_worker", "TpModelWorker"))
        self.spec_algorithm = find("import", (f"{srt}.speculative.spec_info", "SpeculativeAlgorithm"))
        self.draft_factory = find("import", (f"{srt}.speculative.draft_utils", "DraftBackendFactory"))
        self.utils_common = importlib.import_module(f"{srt}.utils.common")
        self.package_dir = os.path.dirname(os.path.abspath(importlib.import_module("sglang").__file__ or ""))


class Startup:
    """SGLang's start-up in this process, run for one cell at a time under that cell's platform.

    Finds SGLang's pieces in the installed release once (``AdapterError`` naming
    the one that is missing), then for a cell: the cell's arch stated
    (``cell_context``), its arguments resolved (``resolve``), the draft model
    config, and the target's and draft's backends constructed up to their first
    GPU step (``construct_target``, ``construct_draft``).
    """

    def __init__(self, version: str, platform: str, refusal_errors: tuple[type[BaseException], ...]) -> None:
        self.version = version
        self.platform = platform
        self.refusal_errors = refusal_errors
        self.kernel_stubs_made: set[str] = set()
        self.runner_misses: set[str] = set()
        self._capability: tuple[int, int] | None = None
        self._class_modules: set[str] | None = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.sg = _SGLang(version)
        self.fact_names = platform_fact_names(self.sg.rc, version)
        self._cli_parser = _cli_parser(self.sg.server_args_cls)
        self._cli_choices = _cli_choices(self._cli_parser)
        self._install_capability()
        self._arch_probes = arch_probes()
        self._load_plain()

    def _load_plain(self) -> None:
        """``PLAIN_LOADS`` of this process's platform, loaded under its plain arch (not a cell's)."""
        arch, modules = PLAIN_LOADS.get(self.platform, (None, ()))
        for name in modules:
            try:
                with self._arch_probes.on(arch), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    importlib.import_module(name)
            except ModuleNotFoundError:
                continue  # a release without the module
            except Exception as exc:  # noqa: BLE001 - named, never a refusal
                raise adapter_error("platform", f"cannot load {name} as on a plain {arch}: "
                                                f"{type(exc).__name__}: {exc}") from None

    # -- the cell's platform --------------------------------------------------------------
    def facts(self, arch: str) -> dict[str, Any]:
        """The platform facts of ``arch`` that the installed release knows."""
        return {k: v for k, v in platform_facts(arch).items() if k in self.fact_names}

    def _install_capability(self) -> None:
        """``get_device_capability()`` answers the active cell's arch wherever SGLang bound it.

        SGLang's own probe (``utils.common.get_device_capability``) is replaced
        once by a dispatcher that answers the cell's capability while a cell
        runs and calls the real probe otherwise; every loaded ``sglang`` module
        that imported the probe by name gets the dispatcher, and modules
        imported later bind it from ``sglang.srt.utils``.
        """
        common = self.sg.utils_common
        real = getattr(common, "get_device_capability", None)
        if real is None:
            raise AdapterError("platform", "sglang.srt.utils.common.get_device_capability not found",
                               engine=ENGINE, version=self.version)
        real = getattr(real, "__mla_real__", real)

        @functools.wraps(real)
        def get_device_capability(device_id: int = 0) -> Any:
            if self._capability is not None:
                return self._capability
            return real(device_id)

        get_device_capability.__mla_real__ = real  # type: ignore[attr-defined]
        self._dispatch = get_device_capability
        self._real_capability = real
        self._rebind_capability()

    def _rebind_capability(self) -> None:
        """Point modules imported since the last call at the dispatcher (a scan only when modules were added)."""
        if getattr(self, "_rebound_at", None) == len(sys.modules):
            return
        self._rebound_at = len(sys.modules)
        for name, module in list(sys.modules.items()):
            if (name == "sglang" or name.startswith("sglang.")) and module is not None:
                if getattr(module, "get_device_capability", None) is self._real_capability:
                    module.get_device_capability = self._dispatch  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def cell_context(self, cell: Cell) -> Iterator[dict[str, Any]]:
        """The cell's arch for everything SGLang asks while inside (platform facts, device capability).

        ``torch.cuda.get_device_capability`` answers on a CUDA or HIP device only: on the CPU,
        XPU and NPU platforms it is this host's torch, which has no CUDA, as theirs has none.
        """
        import torch

        facts = self.facts(cell.arch)
        capability = capability_of(cell.arch)
        torch_capability = torch.cuda.get_device_capability
        self._rebind_capability()
        with _quiet.quiet(), self.sg.rc.override_platform(**facts), self._arch_probes.on(cell.arch), \
                _derived_for(cell.arch):
            self._capability = capability
            if capability[0] is not None:
                torch.cuda.get_device_capability = lambda device=None: capability  # type: ignore[assignment]
            try:
                yield facts
            finally:
                self._capability = None
                torch.cuda.get_device_capability = torch_capability  # type: ignore[assignment]

    # -- 1. server arguments and resolution ----------------------------------------------------
    def resolve(self, cell: Cell, model: ModelConfig) -> Resolution:
        """Resolve a cell's arguments as SGLang does and publish them (inside ``cell_context``).

        The returned record stays valid until the next cell is resolved.
        """
        path = MODEL_CONFIGS / cell.model
        if not (path / "config.json").is_file():
            raise LookupError(f"sglang adapter: no weightless config.json for model {cell.model!r} under {MODEL_CONFIGS}")
        sg = self.sg
        kwargs = server_kwargs(cell, model, os.fspath(path))
        server_args = self._server_args(kwargs)
        server_args.resolve_once()  # SGLang's resolution pipeline: raises its own errors
        sg.rc.publish(server_args, role="test")
        _fresh_resources(sg.rc)
        runner = self._runner(server_args, sg.model_config_of(server_args), draft=False)
        notes = []
        for field, label in (("page_size", "page size"), ("kv_cache_dtype", "kv-cache-dtype"),
                             ("attention_backend", "attention backend")):
            if field == "attention_backend" and "+" in cell.backend:
                continue
            asked = _asked(cell, field)
            got = sg.resolution_result(server_args, field)
            if asked is not None and str(got) != str(asked):
                notes.append(f"{label} {asked} resolved to {got}")
        prefill, decode = sg.rc.attention_backends()
        return Resolution(cell=cell, server_args=server_args, model_config=runner.model_config, runner=runner,
                          prefill_backend=prefill, decode_backend=decode, page_size=runner.page_size,
                          kv_cache_dtype=runner.kv_cache_dtype, use_mla_backend=runner.use_mla_backend,
                          facts=self.facts(cell.arch), notes=notes)

    def _server_args(self, kwargs: Mapping[str, Any]) -> Any:
        """``ServerArgs`` as ``sglang serve`` builds them, or as ``Engine(**kwargs)`` does.

        A backend name outside the CLI's ``choices`` never gets past argparse
        (``SystemExit``), so such a cell builds the record the way SGLang's
        programmatic entry point does (``Engine.__init__``:
        ``ServerArgs(**kwargs)``, ``log_level="error"`` when absent); the
        engine's own registry lookup then answers for the name.
        """
        if all(kwargs.get(f) is None or kwargs[f] in self._cli_choices.get(f, (kwargs[f],)) for f in _BACKEND_OPTIONS):
            with _reused_cli_parser(self.sg.prepare_server_args, self.sg.server_args_cls, self._cli_parser):
                return self.sg.prepare_server_args(argv_of(kwargs))  # `sglang serve ...`
        return self.sg.server_args_cls(**{"log_level": "error", **kwargs})

    @staticmethod
    def is_spec(resolution: Resolution) -> bool:
        return parse_spec(resolution.cell.spec).enabled

    # -- the model runner the builders see ------------------------------------------------------
    def _runner(self, server_args: Any, model_config: Any, *, draft: bool) -> Any:
        """A ``ModelRunner`` as it stands when ``init_attention_backends`` runs, without a GPU.

        SGLang's ``ModelRunner.__init__`` loads weights and allocates KV pools
        on the GPU, so it is not run. The stand-in is an instance of SGLang's
        own ``ModelRunner`` class (its methods and properties are SGLang's) with
        the fields ``__init__``/``load_model``/``alloc_memory_pool`` set from the
        published configuration, computed by SGLang's functions where they need
        no GPU (draft backend, sliding window, KV dtype via the runner's own
        ``configure_kv_cache_dtype``). Weights, KV pools, the index translator
        and the memory-derived sizes are :class:`GpuResource`\\ s.
        """
        sg = self.sg
        rc = sg.rc
        spec = rc.get_spec()
        runner = _stand_in(sg.model_runner_cls, self.runner_misses)(
            model_config=model_config,
            server_args=server_args,
            is_draft_worker=draft,
            gpu_id=0,
            device=rc.get_device().device,
            draft_attention_backend=sg.resolve_draft_backend(draft_attention_backend=None, is_draft_worker=draft),
            spec_algorithm=sg.spec_algorithm.from_string(spec.speculative_algorithm),
            page_size=rc.get_schedule().page_size,
            is_generation=model_config.is_generation,
            is_multimodal=model_config.is_multimodal,
            is_hybrid_swa=getattr(model_config, "is_hybrid_swa", False),
            use_mla_backend=model_config.attention_arch == sg.mla_arch,
            attention_chunk_size=getattr(model_config, "attention_chunk_size", None),
            init_new_workspace=False,
            dtype=model_config.dtype,
            # load_model: `resolve_sliding_window_size(model, ...)`; none of the catalogue's
            # model classes defines get_attention_sliding_window_size, so the config decides.
            sliding_window_size=sg.sliding_window(None, model_config),
            prefill_aware_swa=False,
            model=None,  # unquantized weightless configs: configure_kv_cache_dtype reads no quant_config
        )
        runner.configure_kv_cache_dtype()  # SGLang's ModelRunner method, this runner's own KV dtype
        for field in _GPU_ONLY_RUNNER_FIELDS:
            runner.__dict__[field] = GpuResource(f"model_runner.{field}")
        return runner

    # -- 2. draft model config ------------------------------------------------------------------------
    def draft_model_config(self, resolution: Resolution) -> Any:
        """The draft worker's ModelConfig, built by ``TpModelWorker._init_model_config`` as the draft worker does."""
        init = getattr(self.sg.tp_worker_cls, "_init_model_config", None)
        if init is None:
            raise AdapterError("draft model config", "TpModelWorker._init_model_config not found",
                               engine=ENGINE, version=self.version)
        worker = types.SimpleNamespace(server_args=resolution.server_args, is_draft_worker=True,
                                       context_length=resolution.model_config.context_len)
        init(worker)
        return worker.model_config

    # -- 3. and 4. construction -----------------------------------------------------------------------
    def construct_target(self, resolution: Resolution) -> tuple[dict[str, str], list[Stop]]:
        runner = resolution.runner
        with self.constructing("target") as log:
            built = log.run(lambda: self._build_runner_backend(runner), "target")
        runner.__dict__["attn_backend"] = built
        return roles_of(built, {"decode": "decode_backend", "prefill": "prefill_backend"}, log), log.stops

    def _build_runner_backend(self, runner: Any) -> Any:
        """``ModelRunner.init_attention_backends``: resolve the pair, stamp it, build it."""
        sg = self.sg
        resolved = sg.resolve_strs(model_runner=runner)
        runner.prefill_attention_backend_str = resolved.prefill
        runner.decode_attention_backend_str = resolved.decode
        return sg.build_resolved(model_runner=runner, resolved=resolved, init_new_workspace=False)

    def construct_draft(self, resolution: Resolution, draft_config: Any) -> tuple[dict[str, str], list[Stop]]:
        """The EAGLE draft worker's backends: its runner's own, then ``DraftBackendFactory``'s."""
        sg = self.sg
        spec = sg.rc.get_spec()
        draft_runner = self._runner(resolution.server_args, draft_config, draft=True)
        stops: list[Stop] = []
        with self.constructing("draft runner") as log:
            own = log.run(lambda: self._build_runner_backend(draft_runner), "draft runner")
        draft_runner.__dict__["attn_backend"] = own
        stops += log.stops
        roles = {"draft": log.label(own, "draft runner")}
        worker = self._draft_worker(resolution, draft_runner)
        factory = self.sg.draft_factory.__qualname__
        with self.constructing("draft worker") as log:
            log.run(worker.init_attention_backend, "draft worker")
        stops += log.stops
        if spec.speculative_num_steps > 1:
            roles["draft_decode"] = log.label(worker.__dict__.get("draft_attn_backend"),
                                              f"{factory}.create_decode_backend")
        roles["draft_extend"] = log.label(worker.__dict__.get("draft_extend_attn_backend"),
                                          f"{factory}.create_draft_extend_backend")
        return roles, stops

    def _draft_worker(self, resolution: Resolution, draft_runner: Any) -> Any:
        """The EAGLE draft worker the server would create, with the fields its ``__init__`` sets.

        The worker class is the one SGLang's own ``create_worker`` picks for
        the resolved algorithm; its draft half (``EagleDraftWorker``) is built
        without its ``__init__`` (which loads the draft model on the GPU).
        """
        sg = self.sg
        spec = sg.rc.get_spec()
        algorithm = sg.spec_algorithm.from_string(spec.speculative_algorithm)
        worker_cls = algorithm.create_worker(resolution.server_args)
        module = sys.modules.get(getattr(worker_cls, "__module__", ""))
        draft_cls = getattr(module, "EagleDraftWorker", None)
        if draft_cls is None or not callable(getattr(draft_cls, "init_attention_backend", None)):
            raise AdapterError("draft worker", f"{getattr(worker_cls, '__qualname__', worker_cls)}: no EagleDraftWorker "
                               f"with init_attention_backend in {getattr(module, '__name__', module)}",
                               engine=ENGINE, version=self.version)
        stand_in = type(f"StandIn{draft_cls.__name__}", (draft_cls,), {"__init__": _set_fields})
        worker = stand_in(
            server_args=resolution.server_args, gpu_id=0, nccl_port=0,
            target_worker=types.SimpleNamespace(model_runner=resolution.runner),
            device=sg.rc.get_device().device,
            topk=spec.speculative_eagle_topk,
            speculative_num_steps=spec.speculative_num_steps,
            speculative_num_draft_tokens=spec.speculative_num_draft_tokens,
            speculative_algorithm=algorithm,
            draft_worker=types.SimpleNamespace(model_runner=draft_runner),
            draft_runner=draft_runner,
            seed_dsa_topk_from_draft_extend=False,
        )
        init_share = getattr(worker, "_init_dsa_index_share_state", None)
        if callable(init_share):
            init_share()  # EagleDraftWorker.__init__ does this from the draft config
        return worker

    @contextlib.contextmanager
    def constructing(self, phase: str) -> Iterator["_ConstructionLog"]:
        """Constructors run to their first GPU step; kernel libraries not installed here are stubs."""
        log = _ConstructionLog(phase, self.sg.package_dir, self.refusal_errors, self.version)
        with kernel_library_stubs(missing_libraries(STUBBED_KERNEL_LIBRARIES)) as made:
            self._import_backend_modules()
            self._rebind_capability()
            with _rebound(JIT_LOADERS, "SGLang JIT kernel build (compiles CUDA code for the device)"), \
                    stop_at_gpu_steps(), log.wrapping(self._backend_classes(), self._factory_methods()):
                yield log
        self.kernel_stubs_made.update(m.split(".", 1)[0] for m in made)

    def _import_backend_modules(self) -> None:
        """Import (once) the modules SGLang's factories import backend classes from, to wrap their classes.

        They are imported as a server imports them, before anything is
        constructed (outside the GPU-step guard: module-level code sees this
        host's torch), so that every cell wraps the same classes.
        """
        if self._class_modules is not None:
            return
        modules: set[str] = set()
        sources = [*set(self.sg.backends.values()), self.sg.draft_factory,
                   self.sg.build_resolved]
        for obj in sources:
            modules |= _imported_modules(obj)
        loaded = set()
        for name in sorted(m for m in modules if m.startswith("sglang.srt.")):
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # other platforms' modules print on import
                    importlib.import_module(name)
                loaded.add(name)
            except GpuStep:
                continue  # a module that needs a GPU to import: the factory importing it stops there
            except Exception:  # noqa: BLE001 - another platform's module (ROCm, NPU): not importable here
                continue
        self._class_modules = loaded

    def _backend_classes(self) -> list[type]:
        classes = []
        for name in sorted(self._class_modules or ()):
            module = sys.modules.get(name)
            for obj in vars(module).values() if module is not None else ():
                if inspect.isclass(obj) and obj.__module__ == name and "__init__" in obj.__dict__:
                    classes.append(obj)
        return classes

    def _factory_methods(self) -> list[tuple[type, str]]:
        """``DraftBackendFactory.create_*`` (decode, draft extend): each stops on its own, as a unit."""
        cls = self.sg.draft_factory
        return [(cls, name) for name in sorted(vars(cls)) if name.startswith("create_") and callable(vars(cls)[name])]



def _derived_for(arch: str) -> Any:
    """In the ROCm child: SGLang's load-time constants derived from the arch probes, for ``arch``.

    A gfx950 cell in a child that loaded SGLang answering gfx942 must see what SGLang derives at
    load on that arch (``_is_gfx95``, the platform fp8 type ``fp8_dtype``), as its checks do
    (``platform_check.scope``). The other children's validation keeps the constants SGLang loaded
    with (their checks derive them per cell); no cell's outcome differs either way today.
    """
    from .platform_check import FP8_PROBES, derived_constants
    from .platforms import ARCH_PROBES, loaded_platform

    if loaded_platform() != "rocm" or platform_of(arch) != "rocm":
        return contextlib.nullcontext([])
    return derived_constants(ARCH_PROBES + FP8_PROBES)


def _fresh_resources(rc: Any) -> None:
    """Each cell starts as a fresh server does, with no named buffers or streams (``runtime_context.Resources``).

    ``get_buffer(name, factory)`` keeps what a factory made for the process:
    a workspace an earlier cell's check made on this CPU would let the next
    cell's constructors skip the step that allocates it (where they stop),
    so a cell's notes would depend on the cells before it in its worker.
    """
    context = getattr(rc, "_CONTEXT", None)
    resources = getattr(context, "resources", None)
    if resources is not None:
        context.resources = type(resources)()


class _ConstructionLog:
    """Wraps backend constructors for one phase and records where each stopped and what it built."""

    def __init__(self, phase: str, package_dir: str, refusal_errors: tuple[type[BaseException], ...],
                 version: str = "") -> None:
        self.phase = phase
        self.version = version
        self.package_dir = package_dir
        self.refusal_errors = refusal_errors
        self.stops: list[Stop] = []
        self.built: dict[str, list[str]] = {}  # unit -> classes whose construction it started, outermost first
        self._units: list[str] = []
        self._depth = 0  # nesting of wrapped __init__ calls inside the current unit

    def stop_of(self, unit: str | None, exc: BaseException) -> Stop:
        where = engine_frame(exc.__traceback__, self.package_dir)
        step = exc.what if isinstance(exc, GpuStep) else f"{type(exc).__name__}: {exc}"
        return Stop(self.phase, unit or (where[0] if where else "?"), step, where[1] if where else "?")

    def checked_stop(self, stop: Stop, exc: BaseException) -> Stop:
        """A stop in module-level code (a backend's module loading) is no stop: nothing of the backend ran.

        The module uses a kernel library this host lacks while it loads, so the
        backend's class never exists here: ``UnreachableError``.
        """
        if stop.unit == "<module>":
            raise UnreachableError("construct", f"importing SGLang's module {stop.where.split(':')[0]} stops at "
                                   f"{stop.step} ({stop.where}): it uses a kernel library this host lacks while it "
                                   "loads, so the backend it defines cannot be built here", engine=ENGINE,
                                   version=self.version) from exc
        return stop

    def is_gpu_stop(self, exc: BaseException) -> bool:
        """A GPU step, the host saying CUDA is absent (never a refusal), or a kernel library missing."""
        if isinstance(exc, GpuStep):
            return True
        if isinstance(exc, (RuntimeError, *self.refusal_errors)) and cuda_absent(exc):
            return True
        if isinstance(exc, ModuleNotFoundError):
            return (exc.name or "").split(".", 1)[0] in KERNEL_LIBRARIES
        if isinstance(exc, TypeError) and ("_KernelName" in str(exc) or "UnsetField" in str(exc)):
            # a name of a kernel library that is not installed here, or a field a stopped constructor
            # never set, handed as a value to a function that checks its arguments' types (torch's)
            return True
        return False

    def run(self, fn: Callable[[], Any], unit: str) -> Any:
        """``fn()`` as one unit: a GPU step that reaches here stops it (recorded) and the result is None."""
        self._units.append(unit)
        depth, self._depth = self._depth, 0
        try:
            return fn()
        except BaseException as exc:
            if not self.is_gpu_stop(exc):
                raise
            self.stops.append(self.checked_stop(self.stop_of(None, exc), exc))
            return None
        finally:
            self._units.pop()
            self._depth = depth

    def label(self, built: Any, unit: str) -> str:
        """The backend class a role got: the object's, or the first class the unit began to build."""
        if built is not None:
            return type(built).__name__
        began = self.built.get(unit)
        if began:
            return began[0]
        mine = [stop for stop in self.stops]
        return f"not built ({mine[-1].unit} stopped at {mine[-1].step})" if mine else "none"

    @contextlib.contextmanager
    def wrapping(self, classes: list[type], methods: list[tuple[type, str]] = ()) -> Iterator[None]:
        """Each class's ``__init__`` stops at its first GPU step and returns; the object keeps what it set.

        Each of ``methods`` is a unit of its own (:meth:`run`): it stops the
        same way and returns None (the object it was building is not handed
        back), so that its caller goes on to its next step as the server would.
        """
        saved: list[tuple[type, str, Any]] = []
        try:
            for cls in classes:
                saved.append((cls, "__init__", cls.__dict__["__init__"]))
                saved.append((cls, "__getattr__", cls.__dict__.get("__getattr__")))
                cls.__init__ = self._wrapped_init(cls, cls.__dict__["__init__"])  # type: ignore[misc]
                cls.__getattr__ = _stopped_getattr(cls.__dict__.get("__getattr__"))  # type: ignore[attr-defined]
            for cls, name in methods:
                method = cls.__dict__[name]
                saved.append((cls, name, method))
                setattr(cls, name, self._wrapped_method(cls, name, method))
            yield
        finally:
            for cls, name, value in reversed(saved):
                if value is None:
                    delattr(cls, name)
                else:
                    setattr(cls, name, value)

    def _wrapped_method(self, cls: type, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        log = self

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return log.run(lambda: method(*args, **kwargs), f"{cls.__qualname__}.{name}")

        return wrapped

    def _wrapped_init(self, cls: type, init: Callable[..., None]) -> Callable[..., None]:
        log = self

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if log._depth == 0 and log._units:
                log.built.setdefault(log._units[-1], []).append(type(self).__name__)
            log._depth += 1
            try:
                init(self, *args, **kwargs)
            except BaseException as exc:
                if not log.is_gpu_stop(exc):
                    raise
                stop = log.checked_stop(log.stop_of(f"{cls.__qualname__}.__init__", exc), exc)
                log.stops.append(stop)
                with contextlib.suppress(AttributeError, TypeError):
                    self.__dict__.setdefault("_mla_gpu_step", stop)
            finally:
                log._depth -= 1

        return __init__


def _stopped_getattr(original: Callable[[Any, str], Any] | None) -> Callable[[Any, str], Any]:
    """``__getattr__`` for a wrapped class: a field its stopped ``__init__`` never set is an ``UnsetField``.

    Reading it (``self.page_size = self.inner.page_size``) goes on; using it is
    the GPU step. So a wrapper's own checks after it copied the inner
    backend's fields still run, as on a GPU host (MiniCPMSparseBackend's
    sparse-config check comes after it copies FlashAttentionBackend's pools).
    """

    def __getattr__(self: Any, name: str) -> Any:
        stop = None
        if not (name.startswith("__") and name.endswith("__")):
            try:
                stop = object.__getattribute__(self, "__dict__").get("_mla_gpu_step")
            except AttributeError:
                stop = None
        if stop is not None:
            return UnsetField(f"self.{name}", f"left unset when {stop.unit} stopped")
        if original is not None:
            return original(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    return __getattr__


@contextlib.contextmanager
def _rebound(functions: tuple[tuple[str, str], ...], what: str) -> Iterator[None]:
    """Inside: each ``module.function`` (where it exists) is a GPU step, in every sglang module bound to it."""
    saved: list[tuple[types.ModuleType, str, Any]] = []

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise GpuStep(what)

    try:
        for module_name, attr in functions:
            real = getattr(sys.modules.get(module_name), attr, None)
            if real is None:
                continue
            for module, key in sglang_bindings(real):
                if vars(module).get(key) is real:
                    saved.append((module, key, real))
                    setattr(module, key, stop)
        yield
    finally:
        for module, key, value in saved:
            setattr(module, key, value)


def _set_fields(self: Any, **fields: Any) -> None:
    self.__dict__.update(fields)


@functools.lru_cache(maxsize=None)
def _stand_in_class(model_runner_cls: type) -> type:
    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        object.__getattribute__(self, "_mla_misses").add(name)
        raise RunnerAttributeError(f"SGLang read model_runner.{name}, which the adapter's stand-in model runner "
                                    "does not provide", name=name, obj=self)

    return type(f"StandIn{model_runner_cls.__name__}", (model_runner_cls,),
                {"__init__": _set_fields, "__getattr__": __getattr__, "__module__": __name__})


def _stand_in(model_runner_cls: type, misses: set[str]) -> Callable[..., Any]:
    cls = _stand_in_class(model_runner_cls)
    return functools.partial(cls, _mla_misses=misses)


def _imported_modules(obj: Any) -> set[str]:
    """Modules named in ``from M import ...`` statements of ``obj``'s source (a function or class)."""
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def roles_of(built: Any, children: Mapping[str, str], log: _ConstructionLog) -> dict[str, str]:
    """Role → backend class: a hybrid's children by role, else the one backend for every role."""
    fields = getattr(built, "__dict__", {})
    if all(attr in fields and not isinstance(fields[attr], str) for attr in children.values()):
        return {role: log.label(fields[attr], log.phase) for role, attr in children.items()}
    return {role: log.label(built, log.phase) for role in children}


def _cli_parser(server_args_cls: Any) -> Any:
    """SGLang's own ``sglang serve`` parser, built once as ``prepare_server_args`` builds it."""
    import argparse

    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return parser


def _cli_choices(parser: Any) -> dict[str, tuple[str, ...]]:
    """The ``choices`` of SGLang's own parser for the backend options (read from ``add_cli_args``)."""
    return {a.dest: tuple(a.choices) for a in parser._actions if a.dest in _BACKEND_OPTIONS and a.choices}


@contextlib.contextmanager
def _reused_cli_parser(prepare: Any, server_args_cls: Any, parser: Any) -> Iterator[None]:
    """Let ``prepare_server_args`` run as written, but on the parser built once (``_cli_parser``).

    ``prepare_server_args`` builds the whole CLI parser (hundreds of options,
    ~80 ms) on every call before it parses; the parser does not depend on the
    argv, and parsing does not change it. While the block runs, the module's
    ``argparse.ArgumentParser`` hands back that parser and ``add_cli_args``
    leaves it as it is; every other step (config merge, parse, logging,
    ``from_cli_args``) is SGLang's own.
    """
    import argparse

    module = sys.modules[prepare.__module__]
    real_attr, real_add = server_args_cls.__dict__["add_cli_args"], server_args_cls.add_cli_args
    shim = types.SimpleNamespace(**{k: getattr(argparse, k) for k in dir(argparse) if not k.startswith("__")})
    shim.ArgumentParser = lambda *args, **kwargs: parser

    def add_cli_args(target: Any) -> None:
        if target is not parser:
            real_add(target)

    module.argparse = shim
    server_args_cls.add_cli_args = staticmethod(add_cli_args)
    try:
        yield
    finally:
        module.argparse = argparse
        server_args_cls.add_cli_args = real_attr


def _asked(cell: Cell, field: str) -> Any:
    """What the cell asked for (SGLang's defaults where the matrix has no axis)."""
    return {"page_size": cell.page_size if cell.page_size is not None else 1,
            "kv_cache_dtype": cell.kv_dtype or "auto", "attention_backend": cell.backend}[field]
