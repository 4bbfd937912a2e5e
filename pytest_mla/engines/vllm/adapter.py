"""The vLLM adapter: ``VLLMEngine``, the ``Engine`` the plugin drives for ``[engine] name = "vllm"``.

It owns the process's vLLM, imported on a faked platform and started per
cell (``startup``), sends the cells and checks of other platforms to a child
process each (``engines/common/platform_process.py``), and turns a cell vLLM
accepted into its kernel check (``checks``). ``run_mla`` / ``run_attn`` are
the checks' runner targets: they live here so that a process running one
(a DCP rank, a platform child) makes its engine before vLLM is imported.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Any, Mapping

from ...core.cells import Cell, platform_of
from ...core.errors import AdapterError
from ...core.models import ModelConfig
from ..common import quiet as _quiet
from ..common.platform_process import PLATFORM_ENV, PlatformProcess
from ..protocol import Configured, Engine
from . import backends, checks, rank
from .platforms import PLATFORM_CLASSES, known_archs
from .startup import CUDA_AT_IMPORT, Startup, VLLMStartup
from .support import DEFAULT_CAPABILITY, adopt, adopt_factory, prepare_environment

#: The arch the process's platform answers for while ``backend_facts`` reads the classes (a CUDA process: the
#: capability every TRITON_MLA configuration of the matrices constructs on, ``support.DEFAULT_CAPABILITY``).
FACTS_ARCH = {"cuda": "sm" + DEFAULT_CAPABILITY.replace(".", "")}

if importlib.util.find_spec("vllm") is None:  # the registry turns this into "unavailable"
    raise ImportError("vllm is not installed in this environment", name="vllm")


class VLLMEngine(Engine):
    """Adapter for an installed ``vllm`` (``[engine] name = "vllm"``)."""

    name = "vllm"
    #: vLLM refuses with ``ValueError`` (selector, config layer, prefill selection, impls),
    #: asserts (KV dtypes, DCP LSE, impl requirements) and ``NotImplementedError`` (impls).
    refusal_errors: tuple[type[BaseException], ...] = (ValueError, AssertionError, NotImplementedError)

    def __init__(self, platform: str | None = None) -> None:
        try:
            self.version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            self.version = "unknown"
        #: The platform this process fakes (``cuda`` unless it is a child for another one: the cells
        #: of other platforms go to a child each, see ``engines/common/platform_process.py``).
        self.platform = platform or os.environ.get(PLATFORM_ENV) or "cuda"
        self._children: dict[str, PlatformProcess] = {}
        if self.platform == "rocm" and "HIP_VISIBLE_DEVICES" not in os.environ:
            # vllm.triton_utils keeps Triton without an active GPU driver only when the platform's
            # visible-devices variable is set and empty (HIP_VISIBLE_DEVICES on ROCm); see
            # support.prepare_environment for CUDA_VISIBLE_DEVICES.
            os.environ["HIP_VISIBLE_DEVICES"] = ""
        self.vllm = VLLMStartup(self.platform, self.version)
        self._setup_error: AdapterError | None = None
        prepare_environment()  # before vLLM is imported: keeps its Triton kernels on a CPU host
        try:
            self.vllm.setup()
        except AdapterError as exc:  # every cell reports it (verdict error)
            self._setup_error = exc
        except Exception as exc:  # whatever else breaks the setup is the adapter's too
            self._setup_error = self.vllm.fail("setup", f"{type(exc).__name__}: {exc}")
        adopt(self)  # the engine checks of this process run on this engine's faked platform

    @property
    def stubs(self) -> list[str]:
        """The modules stubbed in this process (the report's metadata)."""
        return self.vllm.stubs

    # -- per cell ---------------------------------------------------------------------------
    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        platform = platform_of(cell.arch)
        if platform != self.platform and platform is not None:
            return self._child(platform).configure(cell, model)
        startup = self.startup(cell, model)
        return self._configured(cell, model, startup)

    def startup(self, cell: Cell, model: ModelConfig) -> Startup:
        """vLLM's start-up for the cell, in its order; raises the engine's own error to refuse."""
        if self._setup_error is not None:
            raise self._setup_error
        return self.vllm.startup(cell, model)

    def run_check(self, case: Any, spec: Any, *, where: str, dcp_mode: str, timeout_s: float) -> Any:
        """A check declared by another platform's child runs in that child (None: in this process)."""
        platform = spec.option_map.get("platform") if spec.protocol == "engine" else None
        if platform is None or platform == self.platform:
            return None
        return self._child(platform).run_check(case, spec, where=where, dcp_mode=dcp_mode, timeout_s=timeout_s)

    def _child(self, platform: str) -> PlatformProcess:
        """The adapter of this release built for ``platform``, in its own process (started once)."""
        if self._setup_error is not None:
            raise self._setup_error
        if platform not in known_platforms():
            raise self.vllm.fail("platform", f"vLLM {self.version} has no platform class for {platform!r}")
        child = self._children.get(platform)
        if child is None:
            child = self._children[platform] = PlatformProcess(f"{__name__}:VLLMEngine", platform, engine="vllm",
                                                               version=self.version)
        return child

    def _configured(self, cell: Cell, model: ModelConfig, startup: Startup) -> Configured:
        """The accepted cell's record, with the check of vLLM's own backend (``checks``)."""
        label = startup.backend_name
        cls = startup.backend_cls
        tp = cell.tp if cell.tp is not None else max(cell.dcp, 1)
        kernel, kernel_reason = checks.kernel_for(self, cell, model, f"{cls.__module__}.{cls.__qualname__}", tp,
                                                  startup)
        return Configured(backends={"decode": label, "prefill": label}, kernel=kernel, kernel_reason=kernel_reason,
                          notes=startup.notes)

    # -- coverage and metadata ------------------------------------------------------------------
    def registered_backends(self) -> dict[str, bool]:
        """Every member of vLLM's ``AttentionBackendEnum`` → whether it serves MLA models.

        The answer is the backend class's own ``is_mla()``. A member whose class
        does not import here (CUDA ops at import, a module the wheel lacks) is
        read from its source instead: the class's ``is_mla`` (or an ancestor's,
        followed through the module's imports) returning ``True``. A member
        with no class (``TORCH_SDPA``, ``CUSTOM`` until registered) is False.
        """
        if self._setup_error is not None:
            raise self._setup_error
        result: dict[str, bool] = {}
        with _quiet.quiet():
            for member in self.vllm.enum:
                try:
                    path = member.get_path()
                except (ValueError, AttributeError):  # a placeholder without a class
                    result[member.name] = False
                    continue
                try:
                    result[member.name] = bool(backends.backend_class(member).is_mla())
                except Exception:  # does not import on this machine: read its source
                    result[member.name] = _source_is_mla(path)
        return result

    def known_archs(self) -> tuple[str, ...]:
        """The arch values this release has a platform for: CUDA, the GFX targets its ROCm platform names, CPU, XPU."""
        return known_archs()

    def metadata(self) -> Mapping[str, Any]:
        return {
            "engine": "vllm",
            "version": self.version,
            "stubs": list(self.stubs),
            "faked": "vllm.platforms.current_platform: per cell a subclass of vLLM's platform class for the arch "
                     "(NonNvmlCudaPlatform: capability; RocmPlatform: _GCN_ARCH and its _ON_* flags; CpuPlatform: AMX "
                     "tiles; XPUPlatform)",
            "platform": self.platform,
            "other_platforms": "each in a child process that imported vLLM on that platform",
            "cuda_at_import_on_meta": list(CUDA_AT_IMPORT),
            "start_up": ["ModelConfig.verify_with_parallel_config", "MLAAttention/Attention constructor",
                         "update_block_size_for_backend", "get_kv_cache_spec", "get_kv_cache_groups",
                         "init_attn_backend", "check_attention_cp_compatibility",
                         "drafter init_attn_backend (spec)"],
            "setup_error": str(self._setup_error) if self._setup_error else None,
            "backend_facts_arch": FACTS_ARCH.get(self.platform),
            "backend_facts": self.backend_facts(),
            **self.decisions(),
        }

    def backend_facts(self) -> dict[str, dict[str, Any]]:
        """What vLLM declares on each backend class of its ``AttentionBackendEnum``, read now from the classes
        (``backends.backend_facts``), on this process's platform answering for ``FACTS_ARCH`` (a few answers
        depend on the device: FlashAttention's version, FlashInfer's KV dtypes). Empty when the setup failed
        (``setup_error`` says why)."""
        if self._setup_error is not None:
            return {}
        arch = FACTS_ARCH.get(self.platform)
        platforms = self.vllm.platforms
        with _quiet.quiet(), (platforms.visiting(arch) if arch else contextlib.nullcontext()):
            return backends.backend_facts(self.vllm.enum, platforms._capability)

    def decisions(self) -> dict[str, Any]:
        """What vLLM's CUDA platform decides per device, read from its code on each of ``backends.FACT_ARCHS``:

        - ``backend_facts_by_arch``: arch → backend → the facts that differ there from ``backend_facts``;
        - ``backend_priorities``: arch → the orders it tries backends in when none is asked for
          (``backends.backend_priorities``);
        - ``prefill_facts``: what each MLA prefill backend class declares (``backends.prefill_facts``);
        - ``prefill_priorities``: arch → the order it tries MLA prefill backends in, per model dims.

        Empty on another platform (its process answers for no CUDA device) and when the setup failed; a read
        that raises is that entry's ``{"error": ...}``.
        """
        if self._setup_error is not None or self.platform != "cuda":
            return {}
        platforms = self.vllm.platforms
        base = self.backend_facts()
        by_arch: dict[str, Any] = {}
        orders: dict[str, Any] = {}
        prefill_orders: dict[str, Any] = {}
        with _quiet.quiet():
            prefill = _prefill_modules()
            dims: list[tuple[int, int, int]] = []
            if isinstance(prefill, str):
                prefill_facts: dict[str, Any] = {"error": prefill}
            else:
                dims = backends.prefill_dims(prefill[0])
                prefill_facts = backends.prefill_facts(prefill[0], platforms._capability, dims, prefill[2])
            for arch in backends.FACT_ARCHS:
                with platforms.visiting(arch):
                    if arch != FACTS_ARCH["cuda"]:
                        by_arch[arch] = backends.facts_differing(
                            base, backends.backend_facts(self.vllm.enum, platforms._capability))
                    capability = platforms.instance.get_device_capability()
                    try:
                        from vllm.platforms.cuda import _get_backend_priorities  # type: ignore[import-not-found]
                    except Exception as exc:
                        orders[arch] = {"error": backends.error_text(exc)}
                    else:
                        orders[arch] = backends.backend_priorities(_get_backend_priorities, capability)
                    if isinstance(prefill, str):
                        prefill_orders[arch] = {"error": prefill}
                    else:
                        prefill_orders[arch] = backends.prefill_orders(platforms.instance, *prefill, dims)
        return {"backend_facts_by_arch": by_arch, "backend_priorities": orders,
                "prefill_facts": prefill_facts, "prefill_priorities": prefill_orders}


def _prefill_modules() -> tuple[Any, Any, type] | str:
    """vLLM's ``MLAPrefillBackendEnum``, ``MLAPrefillSelectorConfig`` and ``MLADimensions``, or why not (one line)."""
    try:
        from vllm.v1.attention.backends.mla.prefill.base import MLADimensions  # type: ignore[import-not-found]
        from vllm.v1.attention.backends.mla.prefill.registry import (  # type: ignore[import-not-found]
            MLAPrefillBackendEnum,
        )
        from vllm.v1.attention.backends.mla.prefill.selector import (  # type: ignore[import-not-found]
            MLAPrefillSelectorConfig,
        )
    except Exception as exc:  # a release without the prefill registry
        return backends.error_text(exc)
    return MLAPrefillBackendEnum, MLAPrefillSelectorConfig, MLADimensions


def _source_is_mla(path: str, depth: int = 0) -> bool:
    """Whether the class at ``module.Class`` returns True from ``is_mla``, read from its source (ast)."""
    module_name, _, class_name = path.rpartition(".")
    spec = importlib.util.find_spec(module_name) if module_name else None
    if spec is None or spec.origin is None or depth > 8:
        return False
    tree = ast.parse(Path(spec.origin).read_text())
    imports: dict[str, str] = {}
    classes: dict[str, ast.ClassDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
    node = classes.get(class_name)
    if node is None:
        return False
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "is_mla":
            returns = [n.value for n in ast.walk(item) if isinstance(n, ast.Return)]
            return any(isinstance(r, ast.Constant) and r.value is True for r in returns)
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if base_name is None:
            continue
        if base_name in classes:
            if _source_is_mla(f"{module_name}.{base_name}", depth + 1):
                return True
        elif base_name in imports and _source_is_mla(imports[base_name], depth + 1):
            return True
    return False


def known_platforms() -> tuple[str, ...]:
    """The platforms the vLLM adapter fakes (one per process)."""
    return tuple(PLATFORM_CLASSES)


def run_mla(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """``KernelSpec`` target: vLLM's own MLA layer on the cell's backend (``rank.run_mla``)."""
    adopt_factory(VLLMEngine)
    return rank.run_mla(inputs, ctx, options)


def run_attn(inputs: Any, ctx: Any, options: Mapping[str, Any]) -> Any:
    """``KernelSpec`` target: vLLM's own attention layer for a GQA model (``rank.run_attn``)."""
    adopt_factory(VLLMEngine)
    return rank.run_attn(inputs, ctx, options)
