"""vLLM's own platform classes, answering for the cell's device: CUDA, ROCm, CPU and XPU.

vLLM asks one object, ``vllm.platforms.current_platform``, what the machine
is; modules bind it when they load, and many decide things right then
(``_flashmla_C_AVAILABLE = current_platform.is_cuda() and ...``). So one
process fakes one platform, from before vLLM's modules load: the adapter of
the main process fakes CUDA, and the cells of another platform run in a child
process whose adapter was built for that platform
(``engines/common/platform_process.py``). The object installed as
``current_platform`` is an instance of a subclass of the class vLLM would pick
on that device (``NonNvmlCudaPlatform`` / ``CudaPlatform``, ``RocmPlatform``,
``CpuPlatform``, ``XPUPlatform``): every method the start-up calls
(``get_attn_backend_cls``, ``get_mla_prefill_backend_cls``,
``check_and_update_config``, ``update_block_size_for_backend``, ...) is vLLM's
own for that platform. The subclasses answer only what the device would:

* **CUDA** ``smNN``: the compute capability, per cell.
* **ROCm** ``gfxNNN``: ``vllm.platforms.rocm`` reads the GFX target once when
  it loads (``_GCN_ARCH``, from amdsmi or the HIP device; here ``gfx942``) and
  derives its ``_ON_*`` flags from it; per cell the adapter sets ``_GCN_ARCH``
  and re-runs the module's own ``_ON_* = ...`` assignments, and every vLLM
  module that copied a flag (``from vllm.platforms.rocm import _ON_GFX950``)
  gets the new value. The capability is vLLM's ``_capability_from_gcn_arch``
  of it (gfx942 → 9.4, gfx950 → 9.5). AMD's kernel library ``aiter`` and the
  ROCm build of ``flash_attn`` are stubs from before vLLM loads
  (``PLATFORM_LIBRARY_STUBS``): vLLM finds them, imports their names and
  decides what a ROCm host with them installed decides (its MLA prefill with
  FlashAttention, AITER's MLA); the first *use* of one of their names
  (a call, a truth test) is where vLLM's code can go no further here
  (``UnreachableError``, naming it). ``VLLM_ROCM_USE_AITER`` keeps its
  default (off).
* **CPU** ``cpu`` / ``cpu_amx``: an x86-64 CPU with AVX-512, without / with
  AMX tiles (``torch.cpu._is_amx_tile_supported``, which vLLM reads to choose
  between ``CPU_MLA`` and ``AMX_MLA``; ``_is_avx512_supported``), per cell.
* **XPU** ``xpu``: Intel's ``vllm_xpu_kernels`` (which ``vllm.platforms.xpu``
  imports when it loads) is such a stub too.

Module-level values a module derives from the platform when it loads are
those of the process's platform; within ROCm, those computed from the GFX
target (other than copies of ``_ON_*``) are gfx942's.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import pkgutil
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

from ...core.cells import arch_number, platform_of
from ..common.sources import source_of

#: Platform → (module, class names tried in order) of the vLLM class a device of it gets.
PLATFORM_CLASSES = {
    "cuda": ("vllm.platforms.cuda", ("NonNvmlCudaPlatform", "CudaPlatform")),
    "rocm": ("vllm.platforms.rocm", ("RocmPlatform",)),
    "cpu": ("vllm.platforms.cpu", ("CpuPlatform",)),
    "xpu": ("vllm.platforms.xpu", ("XPUPlatform",)),
}
PLATFORM_LABELS = {"cuda": "CUDA", "rocm": "ROCm", "cpu": "CPU", "xpu": "XPU"}
#: Kernel libraries that exist only for a platform, stubbed in that platform's process from
#: before vLLM loads: imports and ``find_spec`` succeed, every name is a placeholder whose first
#: use stops the start-up (``common.gpu_steps.KernelLibraryStub``) and makes the cell unreachable.
PLATFORM_LIBRARY_STUBS = {"rocm": ("aiter", "flash_attn"), "xpu": ("vllm_xpu_kernels",)}
#: The GFX target ``vllm.platforms.rocm`` sees when it loads (before any cell); per cell it is
#: the cell's.
IMPORT_GCN_ARCH = "gfx942"
#: GPUs the faked node has (``ParallelConfig`` refuses a world size above it).
GPUS_PER_NODE = 8
#: Compute units the faked GPUs report (CUTLASS MLA's import-time workspace sizing, split counts).
COMPUTE_UNITS = 132
#: Device libraries that exist only for another platform: code of vLLM that imports one cannot run
#: on this host, so the checks after that import are out of reach (``Unreachable``). name → what.
PLATFORM_LIBRARIES = {
    "aiter": "AMD's AI Tensor Engine for ROCm",
    "flash_attn": "FlashAttention's ROCm build",
    "cutlass": "NVIDIA's CUTLASS DSL",
    "vllm_xpu_kernels": "vLLM's Intel XPU kernels",
    "intel_extension_for_pytorch": "Intel's PyTorch extension for XPU",
}
_ROCM_FLAG = re.compile(r"^_ON_[A-Z0-9_]+$")
#: A complete GFX target (``gfx942``, ``gfx90a``, ``gfx1201``), not a family prefix (``gfx12``, ``gfx115``).
_GFX_TARGET = re.compile(r"^gfx(9[0-9][0-9a-f]|1[0-9]{2}[0-9a-f])$")


class FakePlatforms:
    """The fake platform of this process (``platform``) and the one ``current_platform`` instance of it."""

    def __init__(self, platforms_module: Any, capability_cls: type, fail: Callable[[str, str], Exception],
                 find: Callable[[str, str, tuple[str, ...]], Any], platform: str = "cuda") -> None:
        if platform not in PLATFORM_CLASSES:
            raise fail("platform", f"the vLLM adapter fakes {', '.join(PLATFORM_CLASSES)}, not {platform!r}")
        self.platform = platform
        self._fail = fail
        self._capability = capability_cls
        self.cuda_capability = capability_cls(8, 0)
        self._rocm: Any = None
        self._rocm_flag_code: Any = None
        self._rocm_copies: list[tuple[types.ModuleType, str]] = []
        self._rocm_copies_at = -1
        self._last_arch: str | None = None
        self._cached: list[Any] = []
        self._cached_at = -1
        if platform == "rocm":  # for the life of this process: it fakes a HIP device
            _answer_hip_device_properties(lambda: getattr(self._rocm, "_GCN_ARCH", IMPORT_GCN_ARCH))
        module_name, names = PLATFORM_CLASSES[platform]
        with _import_answers(platform):
            base = find("platform", f"vLLM's {PLATFORM_LABELS[platform]} platform class",
                        tuple(f"{module_name}:{name}" for name in names))
        module = sys.modules[module_name]
        for method in ("get_device_capability", "get_attn_backend_cls"):
            if not hasattr(base, method):
                raise fail("platform", f"{base.__qualname__} has no {method}()")
        if platform == "rocm":
            self._rocm = module
            self._rocm_flag_code = _flag_assignments(module)
        self.cls = getattr(self, f"_fake_{platform}")(base)
        platforms_module.current_platform = self.instance = self.cls()  # before anything binds it

    # -- modules that record the platform when they load -----------------------------------------
    def preload(self, packages: tuple[str, ...]) -> dict[str, str]:
        """Import every module of ``packages`` now, on the import-time CUDA platform.

        Many vLLM modules decide things once, when they load, from
        ``current_platform`` (``_flashmla_C_AVAILABLE = current_platform.is_cuda()
        and ...``). Loaded lazily inside a cell, such a module would keep that
        cell's platform for the rest of the run, and the answers would depend
        on the order cells run in. Loaded here, every module sees the same
        platform on every xdist worker. Returns the modules that failed to load
        (another platform's, a kernel this host lacks): their backends report it
        when a cell reaches them.
        """
        failed = {}
        with contextlib.ExitStack() as stack:
            if self.platform == "cuda":  # modules that load vllm.platforms.rocm ask the device its GFX target
                stack.enter_context(_cuda_device_properties())
            self._preload(packages, failed)
        return failed

    def _preload(self, packages: tuple[str, ...], failed: dict[str, str]) -> None:
        for package_name in packages:
            try:
                package = importlib.import_module(package_name)
            except Exception as exc:  # noqa: BLE001 - recorded; cells reaching it will say
                failed[package_name] = f"{type(exc).__name__}: {exc}"
                continue
            for info in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=package_name + "."):
                if info.name in sys.modules:
                    continue
                try:
                    importlib.import_module(info.name)
                except BaseException as exc:  # noqa: BLE001 - as above (some assert a GPU at import)
                    failed[info.name] = f"{type(exc).__name__}: {exc}"

    def _fake_cuda(self, base: type) -> type:
        owner = self

        class FakeCudaPlatform(base):  # type: ignore[misc, valid-type]
            """vLLM's CUDA platform answering the cell's compute capability."""

            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                return owner.cuda_capability

            @classmethod
            def num_compute_units(cls, device_id: int = 0) -> int:
                return COMPUTE_UNITS

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                cap = owner.cuda_capability
                return f"fake sm{cap.major}{cap.minor}"

            @classmethod
            def device_count(cls) -> int:
                return GPUS_PER_NODE

        return FakeCudaPlatform

    def _fake_rocm(self, base: type) -> type:
        owner = self

        class FakeRocmPlatform(base):  # type: ignore[misc, valid-type]
            """vLLM's ROCm platform; the GFX target is ``vllm.platforms.rocm._GCN_ARCH`` (set per cell)."""

            @classmethod
            def get_device_capability(cls, device_id: int = 0) -> Any:
                cap = owner._rocm._capability_from_gcn_arch(owner._rocm._GCN_ARCH)  # vLLM's own derivation
                return owner._capability(*cap) if cap is not None else None

            @classmethod
            def num_compute_units(cls, device_id: int = 0) -> int:
                return COMPUTE_UNITS

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                return f"fake {owner._rocm._GCN_ARCH}"

            @classmethod
            def device_count(cls) -> int:
                return GPUS_PER_NODE

        return FakeRocmPlatform

    def _fake_cpu(self, base: type) -> type:
        class FakeCpuPlatform(base):  # type: ignore[misc, valid-type]
            """vLLM's CPU platform (its own answers; AMX is set per cell)."""

            @classmethod
            def device_count(cls) -> int:
                return GPUS_PER_NODE

        return FakeCpuPlatform

    def _fake_xpu(self, base: type) -> type:
        class FakeXpuPlatform(base):  # type: ignore[misc, valid-type]
            """vLLM's XPU platform; the device queries ``torch.xpu`` cannot answer here are answered."""

            @classmethod
            def get_device_name(cls, device_id: int = 0) -> str:
                return "fake xpu"

            @classmethod
            def num_compute_units(cls, device_id: int = 0) -> int:
                return COMPUTE_UNITS

            @classmethod
            def device_count(cls) -> int:
                return GPUS_PER_NODE

        return FakeXpuPlatform

    # -- per cell -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def on(self, arch: str) -> Iterator[None]:
        """``current_platform`` answers for ``arch`` (a device of this process's platform) for the duration."""
        if platform_of(arch) != self.platform:
            raise self._fail("platform", f"this process fakes {self.platform}; arch {arch!r} is not of it")
        if arch != self._last_arch:  # answers a process cached on one device do not hold on another
            self.clear_caches()
            self._last_arch = arch
        with contextlib.ExitStack() as stack:
            if self.platform == "cuda":
                sm = arch_number(arch) or 0
                self.cuda_capability = self._capability(*divmod(sm, 10))
            elif self.platform == "rocm":
                stack.enter_context(self._gcn_arch(arch))
            elif self.platform == "cpu":
                stack.enter_context(_amx_tiles(arch == "cpu_amx"))
            yield

    @contextlib.contextmanager
    def visiting(self, arch: str) -> Iterator[None]:
        """``on(arch)`` for the duration, then the device answered for before (its capability, and the caches
        vLLM filled on ``arch`` emptied): a question asked between cells (``VLLMEngine.metadata``) leaves the
        next cell's platform as it found it."""
        saved = (self.cuda_capability, self._last_arch)
        try:
            with self.on(arch):
                yield
        finally:
            if self._last_arch != saved[1]:
                self.clear_caches()
                self.cuda_capability, self._last_arch = saved

    def clear_caches(self) -> None:
        """Empty every ``functools`` cache of vLLM's modules and classes.

        On a server the device never changes, so vLLM caches answers that
        depend on it (``is_flashmla_dense_supported``, the platform's
        ``get_device_capability``, the backend priorities) for the life of the
        process; here the device changes between cells.
        """
        if self._cached_at != len(sys.modules):
            found: dict[int, Any] = {}
            for name, module in list(sys.modules.items()):
                if module is None or not (name == "vllm" or name.startswith("vllm.")):
                    continue
                for value in list(vars(module).values()):
                    _collect_cached(value, found)
                    if inspect.isclass(value) and value.__module__ == name:
                        for member in list(vars(value).values()):
                            _collect_cached(member, found)
            self._cached, self._cached_at = list(found.values()), len(sys.modules)
        for function in self._cached:
            function.cache_clear()

    @contextlib.contextmanager
    def _gcn_arch(self, arch: str) -> Iterator[None]:
        """``vllm.platforms.rocm`` on ``arch``: ``_GCN_ARCH``, its ``_ON_*`` flags (its own code) and their copies."""
        rocm = self._rocm
        names = [n for n in vars(rocm) if _ROCM_FLAG.match(n)] + ["_GCN_ARCH"]
        saved = {n: vars(rocm)[n] for n in names}
        copies = self._flag_copies()
        saved_copies = [(module, name, vars(module)[name]) for module, name in copies]
        rocm._GCN_ARCH = arch
        exec(self._rocm_flag_code, vars(rocm))  # vLLM's own `_ON_X = "gfx.." in _GCN_ARCH` lines
        for module, name in copies:
            setattr(module, name, vars(rocm)[name])
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(rocm, name, value)
            for module, name, value in saved_copies:
                setattr(module, name, value)

    def _flag_copies(self) -> list[tuple[types.ModuleType, str]]:
        """Every ``(vllm module, name)`` holding a copy of one of ``vllm.platforms.rocm``'s ``_ON_*`` flags."""
        if self._rocm_copies_at == len(sys.modules):
            return self._rocm_copies
        flags = {n for n in vars(self._rocm) if _ROCM_FLAG.match(n)}
        copies = []
        for name, module in list(sys.modules.items()):
            if module is None or module is self._rocm or not name.startswith("vllm."):
                continue
            for flag in flags & set(vars(module)):
                copies.append((module, flag))
        self._rocm_copies, self._rocm_copies_at = copies, len(sys.modules)
        return copies


def _collect_cached(value: Any, found: dict[int, Any]) -> None:
    """``value`` (or the function of a classmethod / staticmethod) if it is a ``functools`` cache."""
    function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
    if isinstance(function, functools._lru_cache_wrapper):
        found[id(function)] = function


def known_archs() -> tuple[str, ...]:
    """The arch values the installed vLLM has a platform for, read from its sources (nothing imported).

    ``smNN`` (CUDA), the complete GFX targets ``vllm.platforms.rocm`` names in
    its ``_ON_*`` flags, ``cpu`` and ``cpu_amx`` (``vllm.platforms.cpu``),
    ``xpu`` (``vllm.platforms.xpu``).
    """
    known = ["smNN"]
    rocm = source_of("vllm.platforms.rocm")
    if rocm is not None:
        known += sorted(_gfx_targets(rocm), key=lambda g: (len(g), g))
    if source_of("vllm.platforms.cpu") is not None:
        known += ["cpu", "cpu_amx"]
    if source_of("vllm.platforms.xpu") is not None:
        known.append("xpu")
    return tuple(known)


@contextlib.contextmanager
def _import_answers(platform: str) -> Iterator[None]:
    """What a platform module asks the device when it loads, answered for a device of that platform."""
    if platform != "rocm":
        yield
        return
    import torch

    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(gcnArchName=IMPORT_GCN_ARCH)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


def _properties(gcn_arch: str, name: str, major: int, minor: int) -> Any:
    return types.SimpleNamespace(gcnArchName=gcn_arch, name=name, major=major, minor=minor,
                                 multi_processor_count=COMPUTE_UNITS, total_memory=192 * 1024 ** 3,
                                 L2_cache_size=4 * 1024 ** 2, warp_size=64 if gcn_arch else 32)


def _answer_hip_device_properties(arch_now: Callable[[], str]) -> None:
    """``torch.cuda.get_device_properties(i)`` answers a HIP device of the current GFX target.

    vLLM asks it where a ROCm host's torch would answer from the device
    (``vllm.platforms.rocm`` for ``gcnArchName`` when amdsmi is absent, the
    AITER MLA builder for its compute-unit count).
    """
    import torch

    def properties(*args: Any, **kwargs: Any) -> Any:
        arch = arch_now() or IMPORT_GCN_ARCH
        digits = arch[3:]
        major, minor = (int(digits[0]), int(digits[1])) if len(digits) == 3 else (int(digits[:2]), int(digits[2]))
        return _properties(arch, f"fake {arch}", major, minor)

    torch.cuda.get_device_properties = properties


@contextlib.contextmanager
def _cuda_device_properties() -> Iterator[None]:
    """While modules load in the CUDA process: a CUDA device's properties (no GFX target)."""
    import torch

    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *a, **k: _properties("", "fake sm80", 8, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


@contextlib.contextmanager
def _amx_tiles(present: bool) -> Iterator[None]:
    """An x86-64 CPU with AVX-512, with AMX tiles or without: what vLLM's CPU platform asks torch per call.

    ``torch.cpu._is_amx_tile_supported()`` (``CPU_MLA`` or ``AMX_MLA``) answers
    ``present``; ``torch.cpu._is_avx512_supported()`` (FP8 KV for ``CPU_ATTN``)
    answers True (every AMX CPU has AVX-512; ``cpu`` is such a CPU without AMX).
    """
    import torch

    saved = {name: getattr(torch.cpu, name) for name in ("_is_amx_tile_supported", "_is_avx512_supported")}
    torch.cpu._is_amx_tile_supported = lambda: present
    torch.cpu._is_avx512_supported = lambda: True
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(torch.cpu, name, real)


def _flag_assignments(rocm: types.ModuleType) -> Any:
    """The module-level ``_ON_* = ...`` statements of ``vllm.platforms.rocm``, compiled, in file order."""
    source = Path(inspect.getsourcefile(rocm) or "").read_text()
    tree = ast.parse(source)
    body = [node for node in tree.body
            if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and _ROCM_FLAG.match(t.id)
                                                    for t in node.targets)]
    return compile(ast.Module(body=body, type_ignores=[]), inspect.getsourcefile(rocm) or "rocm.py", "exec")


def _gfx_targets(source: str) -> set[str]:
    """The complete GFX targets (``gfx942``) named in ``vllm.platforms.rocm``'s ``_ON_*`` assignments."""
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and _ROCM_FLAG.match(t.id)
                                                for t in node.targets):
            for const in ast.walk(node.value):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) and _GFX_TARGET.match(const.value):
                    found.add(const.value)
    return found
