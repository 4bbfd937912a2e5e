"""The SGLang adapter (``[engine] name = "sglang"``): what the runner asks of the engine, per cell.

``configure`` runs SGLang's own start-up for the cell (``startup``) and says
which kernel check the accepted cell runs (``checks``); a cell of another
platform than this process fakes goes to that platform's child process
(``engines/common/platform_process.py``), whose adapter is this class built
for it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import types
from typing import Any, Mapping

from ...core.cells import Cell, platform_of
from ...core.models import ModelConfig
from ..common.gpu_steps import GpuStep, cuda_absent, engine_frame
from ..common.platform_process import PLATFORM_ENV, PlatformProcess
from ..protocol import AdapterError, Configured, Engine, UnreachableError
from .platforms import PLATFORM_LIBRARIES, fake_import_platform, known_archs
from .backends import backend
from .startup import ENGINE, Resolution, RunnerAttributeError, Startup
from .support import STUBS

#: The catalogue models whose configs decide ``registered_backends``: a dense MLA model and a
#: sparse (DSA) one, so that the sparse MLA backends (``dsa``, its alias ``nsa``) count as MLA-capable.
MLA_PROBE_MODELS = ("deepseek-v3", "deepseek-v3.2")


class CudaQueryWithoutCuda(RuntimeError):
    """SGLang asked ``torch.cuda`` for a device on a platform without CUDA (CPU, XPU, NPU): a crash of the engine
    there (the real platform's torch answers the same), never a refusal."""


class SGLangEngine(Engine):
    """Adapter for an installed ``sglang`` (``[engine] name = "sglang"``)."""

    name = ENGINE
    #: SGLang refuses with ``ValueError`` (factories, resolution hooks, constructors) and
    #: ``AssertionError`` (``assert`` checks in fa3/triton factories and the CuteDSL prefill check).
    refusal_errors: tuple[type[BaseException], ...] = (ValueError, AssertionError)

    def __init__(self, platform: str | None = None) -> None:
        from ...kernels._mode import ensure_triton_mode
        from ..common.import_stubs import install_stubs

        # SGLang's modules decorate @triton.jit kernels on import: decide the mode first.
        self._kernel_target = ensure_triton_mode()
        self.version = importlib.metadata.version("sglang")
        #: The platform this process fakes (``cuda`` unless it is a child for another one: the cells
        #: of other platforms go to a child each, see ``engines/common/platform_process.py``).
        self.platform = platform or os.environ.get(PLATFORM_ENV) or "cuda"
        self._children: dict[str, PlatformProcess] = {}
        self.stubs: list[str] = []
        for root, attrs in STUBS.items():
            self.stubs += install_stubs([root], attrs)
        self._lifetime = contextlib.ExitStack()
        if self.platform != "cuda":  # before SGLang's modules load and ask
            self.stubs += fake_import_platform(self.platform, self._lifetime)
        logging.getLogger("sglang").setLevel(logging.ERROR)
        self._broken: AdapterError | None = None
        self._registered: dict[str, bool] | None = None
        try:
            self.startup = Startup(self.version, self.platform, self.refusal_errors)
        except AdapterError as exc:  # every cell reports it, naming the step (never a refusal)
            self._broken = exc

    # -- Engine protocol -------------------------------------------------------------
    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        platform = platform_of(cell.arch)
        if platform is not None and platform != self.platform:
            return self._child(platform).configure(cell, model)
        if self._broken is not None:
            raise self._broken
        try:
            return self._configure(cell, model)
        except (AssertionError, RuntimeError) as exc:
            if self.platform in ("cuda", "rocm") or not cuda_absent(exc):
                raise
            # SGLang asked torch.cuda on a platform without CUDA: that build's torch refuses as this
            # host's does. The engine's own failure there, never one of its refusals.
            where = engine_frame(exc.__traceback__, self.startup.sg.package_dir)
            at = f"{where[0]} ({where[1]})" if where else "SGLang"
            raise CudaQueryWithoutCuda(f"{at} asks torch.cuda on the {self.platform} platform, which has no CUDA: "
                                       f"{type(exc).__name__}: {exc}") from exc
        except ModuleNotFoundError as exc:
            library = (exc.name or "").split(".", 1)[0]
            if library not in PLATFORM_LIBRARIES:
                raise
            where = engine_frame(exc.__traceback__, self.startup.sg.package_dir)
            at = f"{where[0]} ({where[1]})" if where else "SGLang"
            raise UnreachableError("construct", f"{at} imports {exc.name!r} ({PLATFORM_LIBRARIES[library]}), which "
                                   "does not exist for this host: SGLang's checks after that import did not run",
                                   engine=ENGINE, version=self.version) from exc

    def _child(self, platform: str) -> PlatformProcess:
        """This release's adapter built for ``platform``, in its own process (started once)."""
        if self._broken is not None:
            raise self._broken
        child = self._children.get(platform)
        if child is None:
            child = self._children[platform] = PlatformProcess(f"{__name__}:SGLangEngine", platform, engine=ENGINE,
                                                               version=self.version)
        return child

    def known_archs(self) -> tuple[str, ...]:
        """The arch values this release has a platform for (read from its sources)."""
        return known_archs()

    def _configure(self, cell: Cell, model: ModelConfig) -> Configured:
        startup = self.startup
        with startup.cell_context(cell):
            resolution = startup.resolve(cell, model)
            try:
                draft_config = startup.draft_model_config(resolution) if startup.is_spec(resolution) else None
                target, stops = startup.construct_target(resolution)
                draft: dict[str, str] = {}
                if draft_config is not None:
                    draft, draft_stops = startup.construct_draft(resolution, draft_config)
                    stops += draft_stops
            except GpuStep as step:  # outside any construction phase: the adapter let one through
                raise AdapterError("construct", f"a GPU step escaped the construction phases: {step.what}",
                                   engine=ENGINE, version=self.version) from None
            except RunnerAttributeError as exc:
                raise AdapterError("construct", str(exc), engine=ENGINE, version=self.version) from None
        notes = resolution.notes + list(dict.fromkeys(stop.note() for stop in stops))
        kernel, kernel_reason = self.kernel_for(cell, model, resolution)
        return Configured(backends={**target, **draft}, kernel=kernel, kernel_reason=kernel_reason,
                          notes=tuple(notes))

    def kernel_for(self, cell: Cell, model: ModelConfig, resolution: Resolution) -> tuple[Any, str | None]:
        """The decode kernel to check for an accepted cell (``KernelSpec`` or None, and why not)."""
        from .checks import kernel_from

        decode = backend(resolution.decode_backend)
        if self.platform != "cuda" and self.platform not in decode.checked_on:
            return None, decode.other_platform_reason(cell.arch, self.platform)

        facts = types.SimpleNamespace(kv_cache_dtype=resolution.kv_cache_dtype, model_config=resolution.model_config,
                                      decode_attention_backend_str=resolution.decode_backend,
                                      page_size=resolution.page_size)
        return kernel_from(cell, model, resolution.server_args, facts, self._kernel_target,
                           platform=None if self.platform == "cuda" else self.platform)

    def run_check(self, case: Any, spec: Any, *, where: str, dcp_mode: str, timeout_s: float) -> Any:
        """A check of another platform's cell runs in that platform's child (None: in this process)."""
        platform = spec.option_map.get("platform") if spec.protocol == "engine" else None
        if platform is None or platform == self.platform:
            return None
        return self._child(platform).run_check(case, spec, where=where, dcp_mode=dcp_mode, timeout_s=timeout_s)

    def metadata(self) -> Mapping[str, Any]:
        data: dict[str, Any] = {
            "engine": ENGINE,
            "version": self.version,
            "stubs": list(self.stubs),
            "faked": "runtime_context.override_platform + get_device_capability",
            "constructors": "run until their first GPU step (see docs/engines.md)",
            "kernel_library_stubs": sorted(self.startup.kernel_stubs_made) if self._broken is None else [],
        }
        if self._broken is None:
            data["platform_facts"] = sorted(self.startup.fact_names)
            if self.startup.runner_misses:
                data["runner_attributes_probed_absent"] = sorted(self.startup.runner_misses)
        return data

    def registered_backends(self) -> dict[str, bool]:
        """Every name in SGLang's attention-backend registry, mapped to whether it can serve MLA models.

        Decided by SGLang's own code: each registered factory is called, as the
        model runner calls it, for DeepSeek-V3 (an MLA model) and DeepSeek-V3.2
        (sparse MLA) on sm80, sm90 and sm100, its constructor running to its
        first GPU step. A backend is
        MLA-capable when on at least one arch the factory and constructor do
        not refuse the MLA model with a ``ValueError``/``AssertionError``
        (e.g. ``trtllm_mha``: "can only be used with non-MLA models" on every
        arch → False; ``fa3`` refuses MLA on sm80/sm100 but not on sm90 →
        True). A factory that fails for another reason (a module of another
        platform that cannot import here) does not refuse the model: True.
        """
        if self._broken is not None:
            raise self._broken
        if self._registered is None:
            self._registered = {name: self._serves_mla(name) for name in sorted(self.startup.sg.backends)}
        return dict(self._registered)

    def _serves_mla(self, name: str) -> bool:
        """Whether SGLang's factory ``name`` (and its constructor's checks) accept an MLA model on some arch."""
        from ...core.models import BUILTIN_MODELS

        startup = self.startup
        for model_name in MLA_PROBE_MODELS:
            model = BUILTIN_MODELS[model_name]
            for arch in ("sm80", "sm90", "sm100"):
                cell = Cell(model=model_name, backend="triton", dcp=1, spec="none", arch=arch)
                with startup.cell_context(cell):
                    resolution = startup.resolve(cell, model)
                    runner = resolution.runner
                    runner.prefill_attention_backend_str = runner.decode_attention_backend_str = name
                    try:
                        with startup.constructing("registry") as log:
                            log.run(lambda: startup.sg.backends[name](runner), "registry")
                    except self.refusal_errors:
                        continue
                    except Exception:  # noqa: BLE001 - it failed for another reason: it did not refuse the model
                        return True
                    return True
        return False
