"""SGLang's platforms, answering for the cell's device: CUDA, ROCm, CPU, XPU and NPU.

SGLang asks the machine what it is through the probes of
``sglang.srt.utils.common`` (``is_cuda``, ``is_hip``, ``is_npu``, ``is_xpu``,
``is_cpu``, ``cpu_has_amx_support``, ``is_gfx95_supported``, ...): many
modules call them once, when they load (``_is_hip = is_hip()``), and branch on
that for the rest of the process; its resolution hooks read the same facts
through ``runtime_context.get_platform()`` (``override_platform`` sets them),
and ``sglang.srt.platforms.current_platform`` is the ``SRTPlatform`` of the
device. So one process fakes one platform from before SGLang's modules load:
the adapter of the main process fakes CUDA, and the cells of another platform
run in a child process whose adapter was built for it
(``engines/common/platform_process.py``). In such a child, before SGLang
loads:

* SGLang's own switch where it has one: ``SGLANG_USE_CPU_ENGINE=1`` (its
  ``is_cpu()`` and its CPU ``SRTPlatform``) for ``cpu`` / ``cpu_amx``;
* otherwise the device probes of ``utils.common`` answer for the platform
  (``PLATFORM_PROBES``), in every SGLang module loaded so far (the rest binds
  them when they load), and ``current_platform`` is SGLang's own
  ``RocmSRTPlatform`` / ``XpuSRTPlatform`` / ``NPUSRTPlatform`` /
  ``CpuSRTPlatform``;
* per cell, the facts that differ between archs of one platform answer the
  cell's arch wherever SGLang bound them: ``is_gfx95_supported`` /
  ``is_gfx942_supported`` (a module that derived a constant from them when it
  loaded keeps gfx942's, the arch the child loads on) and
  ``cpu_has_amx_support``.

The device SGLang is told (``--device``) is the platform's: ``cuda`` for CUDA
and ROCm (HIP devices are ``cuda`` devices in torch), ``cpu``, ``xpu``,
``npu``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import sys
import types
from typing import Any, Callable, Iterator, Mapping

from ...core.cells import arch_number, platform_of
from ..common.sources import source_of
from .support import sglang_bindings

#: ``--device`` of each platform.
DEVICES = {"cuda": "cuda", "rocm": "cuda", "cpu": "cpu", "xpu": "xpu", "npu": "npu"}
#: What SGLang's device probes answer on each platform other than CUDA (``utils.common`` names).
PLATFORM_PROBES = {
    "rocm": {"is_cuda": False, "is_hip": True, "is_cuda_alike": True, "is_npu": False, "is_xpu": False,
             "is_musa": False, "is_mps": False, "is_cpu": False, "is_flashinfer_available": False},
    "cpu": {"is_cuda": False, "is_hip": False, "is_cuda_alike": False, "is_npu": False, "is_xpu": False,
            "is_musa": False, "is_mps": False, "is_flashinfer_available": False},
    # an Intel GPU with XMX units (what SGLang's intel_xpu backend is for: xpu_has_xmx_support)
    "xpu": {"is_cuda": False, "is_hip": False, "is_cuda_alike": False, "is_npu": False, "is_xpu": True,
            "is_musa": False, "is_mps": False, "is_cpu": False, "is_flashinfer_available": False,
            "xpu_has_xmx_support": True},
    "npu": {"is_cuda": False, "is_hip": False, "is_cuda_alike": False, "is_npu": True, "is_xpu": False,
            "is_musa": False, "is_mps": False, "is_cpu": False, "is_flashinfer_available": False},
}
#: SGLang's own ``SRTPlatform`` class of each platform (``sglang.srt.platforms.<module>``).
SRT_PLATFORMS = {"rocm": ("rocm", "RocmSRTPlatform"), "cpu": ("cpu", "CpuSRTPlatform"),
                 "xpu": ("xpu", "XpuSRTPlatform"), "npu": ("npu", "NPUSRTPlatform")}
#: The GFX target a ROCm child loads on.
IMPORT_GCN_ARCH = "gfx942"
#: AMD GPU targets the adapter can name (SGLang knows those its ``is_gfx*_supported`` probes match).
ROCM_TARGETS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1200", "gfx1201", "gfx1250")
#: Per-cell probes: the ROCm target probes answer the cell's GFX target (their string lists, read
#: from ``utils.common``), ``cpu_has_amx_support`` whether the cell's CPU has AMX tiles.
ARCH_PROBES = ("is_gfx95_supported", "is_gfx942_supported", "is_gfx1250_supported", "cpu_has_amx_support")

#: Modules a platform's child loads at start, under the platform's plain arch, before any cell: a
#: module some cells import lazily and whose load binds an op this host lacks under another of the
#: platform's archs would otherwise load as the first cell that reaches it says. SGLang's
#: ``layers/rotary_embedding/utils.py`` binds ``torch.ops.sgl_kernel.apply_rotary_pos_emb_cpu`` at
#: load when the CPU has AMX (an op of sgl-kernel's CPU build, absent here); the EAGLE path imports
#: it, so a run whose first such cell was ``cpu_amx`` crashed 4 EAGLE cells that a full run (a
#: ``cpu`` cell first) accepts. Loaded as on a plain CPU, every cell sees one binding (the MLA checks
#: never call it; per cell, ``platform_check`` leaves that if-block as it loaded).
PLAIN_LOADS = {"cpu": ("cpu", ("sglang.srt.layers.rotary_embedding",))}
#: Libraries that exist only for another platform: SGLang code that imports one cannot run on this
#: host (``UnreachableError``); name -> what it is. (AMD's ``aiter`` is a kernel library the
#: backends' constructors use after their checks: a GPU step like ``sgl_kernel``, see startup.py.)
PLATFORM_LIBRARIES = {
    "torch_npu": "Ascend's PyTorch adapter for NPUs",
    "sgl_kernel_npu": "SGLang's Ascend NPU kernels",
    "wave_lang": "AMD's Wave kernel language",
}


def device_of(arch: str) -> str:
    return DEVICES[platform_of(arch) or "cuda"]


def capability_of(arch: str) -> tuple[int | None, int | None]:
    """What ``torch.cuda.get_device_capability()`` answers on the arch's device (HIP: the GFX major/minor)."""
    sm = arch_number(arch)
    if sm is not None:
        return divmod(sm, 10)  # type: ignore[return-value]
    if platform_of(arch) == "rocm":  # gfxMms / gfxMMms: gfx942 -> (9, 4), gfx90a -> (9, 0), gfx1100 -> (11, 0)
        digits = arch[3:]
        return (int(digits[0]), int(digits[1])) if len(digits) == 3 else (int(digits[:2]), int(digits[2]))
    return None, None


def platform_facts(arch: str) -> dict[str, Any]:
    """Every SGLang platform fact the adapter can derive for an arch (``sm90``, ``gfx942``, ``cpu_amx``, ...).

    A release may know fewer (0.5.20/0.5.21 have no ``is_mps``/``is_sm110``):
    the engine passes only those the installed release knows.
    """
    platform = platform_of(arch)
    if platform is None:
        raise ValueError(f"sglang adapter: unknown arch {arch!r}")
    major, minor = capability_of(arch)
    cuda = platform == "cuda"
    sm = arch_number(arch) or 0
    return {
        "is_cuda": cuda, "is_hip": platform == "rocm", "is_npu": platform == "npu", "is_xpu": platform == "xpu",
        "is_musa": False, "is_mps": False,
        "is_sm90": cuda and major == 9,
        "is_sm100": cuda and major == 10,
        "is_sm100_or_sm110": cuda and major in (10, 11),
        "is_sm110": cuda and major == 11,
        "is_sm120": cuda and major == 12,
        "is_blackwell": cuda and major in (10, 11, 12),
        "is_hopper_with_cuda_12_3": cuda and major == 9,
        "has_amx": arch == "cpu_amx",
        "has_flashinfer": cuda,
        # get_device_sm(): the torch.cuda capability where torch.cuda is there (CUDA, HIP), else 0
        "device_sm": sm if cuda else (major * 10 + minor if platform == "rocm" else 0),
        "device_capability": (major, minor),
    }


#: Kernel libraries SGLang's modules import when they load on a platform (``sgl_kernel``'s CPU /
#: XPU builds, AMD's ``aiter``), not installed here: stubs for the life of that platform's child,
#: every name a GPU step when used (``common.gpu_steps.KernelLibraryStub``), as ``sgl_kernel`` is
#: while the CUDA process's constructors run.
PLATFORM_KERNEL_LIBRARIES = {"rocm": ("sgl_kernel", "aiter"), "cpu": ("sgl_kernel",), "xpu": ("sgl_kernel",),
                             "npu": ("sgl_kernel",)}


def fake_import_platform(platform: str, lifetime: contextlib.ExitStack) -> list[str]:
    """Before SGLang loads in a child for ``platform``: its probes and ``current_platform`` answer for it.

    Returns the kernel libraries stubbed for the child's life (``lifetime`` holds them).
    """
    from ..common.gpu_steps import kernel_library_stubs, missing_libraries

    stubbed = missing_libraries(PLATFORM_KERNEL_LIBRARIES.get(platform, ()))
    if stubbed:
        lifetime.enter_context(kernel_library_stubs(stubbed))
    if platform == "cpu":
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's own switch (utils.common.is_cpu, platforms)
    if platform == "rocm":
        lifetime.enter_context(_hip_device_properties())
        lifetime.enter_context(_triton_hip_target())
    common = importlib.import_module("sglang.srt.utils.common")
    answers: dict[str, Callable[..., Any]] = {name: functools.partial(_constant, value)
                                              for name, value in PLATFORM_PROBES[platform].items()}
    if platform == "rocm":  # torch.cuda answers these on a HIP device; here it has no device
        answers["get_device_capability"] = lambda *a, **k: capability_of(_HIP_ARCH["arch"])
        answers["get_device_sm"] = lambda *a, **k: _sm_of(capability_of(_HIP_ARCH["arch"]))
    if platform in ("rocm", "xpu", "npu"):
        # GPU memory is not known here, as in the CUDA process (SGLang's own answer there: None)
        answers["get_device_memory_capacity"] = functools.partial(_constant, None)
    for name, fake in answers.items():
        real = getattr(common, name, None)
        if real is None:
            continue
        for module, key in sglang_bindings(real):
            setattr(module, key, fake)
    srt_platforms = importlib.import_module("sglang.srt.platforms")
    module_name, class_name = SRT_PLATFORMS[platform]
    srt_class = getattr(importlib.import_module(f"sglang.srt.platforms.{module_name}"), class_name)
    srt_platforms._current_platform = srt_class()
    _FAKED[0] = platform
    return stubbed


#: The platform this process loaded SGLang on (``fake_import_platform``; "cuda" otherwise).
_FAKED = ["cuda"]


def loaded_platform() -> str:
    """The platform SGLang's modules were loaded on in this process."""
    return _FAKED[0]


#: The GFX target ``torch.cuda.get_device_properties`` reports in a ROCm child (set per cell).
_HIP_ARCH = {"arch": IMPORT_GCN_ARCH}


@contextlib.contextmanager
def _hip_device_properties() -> Iterator[None]:
    """``torch.cuda.get_device_properties(i)`` answers a HIP device of the current GFX target (``gcnArchName``).

    SGLang's modules ask it when they load (``is_fp8_fnuz``: ``"gfx94" in
    gcnArchName``) and its ``is_gfx*_supported`` probes ask it.
    """
    import torch

    def properties(*args: Any, **kwargs: Any) -> Any:
        arch = _HIP_ARCH["arch"]
        major, minor = capability_of(arch)
        return types.SimpleNamespace(gcnArchName=f"{arch}:sramecc+:xnack-", name=f"fake {arch}", major=major,
                                     minor=minor, multi_processor_count=304, total_memory=192 * 1024 ** 3)

    real = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = properties
    try:
        yield
    finally:
        torch.cuda.get_device_properties = real


class _HipTritonDriver:
    """Triton's active driver on a HIP device, as far as SGLang asks it without a kernel.

    SGLang's ROCm kernel modules ask ``triton.runtime.driver.active.get_current_target()``
    when they load (``kernels/ops/attention/rocm_mla_decode_rope.py``: ``backend == "hip"``);
    on a ROCm host Triton's HIP driver answers, here Triton has no active driver at all.
    Anything else asked of it (a launch, a device) is a GPU step.
    """

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("hip", _HIP_ARCH["arch"], 64)

    def __getattr__(self, name: str) -> Any:
        from ..common.gpu_steps import GpuStep

        raise GpuStep(f"triton.runtime.driver.active.{name}")


@contextlib.contextmanager
def _triton_hip_target() -> Iterator[None]:
    try:
        from triton.runtime import driver
    except ImportError:  # no Triton: nothing asks it
        yield
        return
    driver.set_active(_HipTritonDriver())
    try:
        yield
    finally:
        driver._active = None  # back to Triton's own (lazy) default


class ArchProbes:
    """``ARCH_PROBES`` answer the active cell's arch, wherever SGLang bound them (set up once per process)."""

    def __init__(self) -> None:
        common = importlib.import_module("sglang.srt.utils.common")
        self.arch: str | None = None
        self._real: dict[str, Any] = {}
        self._dispatch: dict[str, Any] = {}
        self._prefixes = _gfx_probe_prefixes(common)
        for name in ARCH_PROBES:
            real = getattr(common, name, None)
            if real is None:
                continue
            self._real[name] = real
            self._dispatch[name] = functools.wraps(real)(functools.partial(self._answer, name))
        self._bound_at = -1
        self.rebind()

    def _answer(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.arch is None:  # outside a cell: the host's own answer
            return self._real[name](*args, **kwargs)
        if name == "cpu_has_amx_support":
            return self.arch == "cpu_amx"
        prefixes = self._prefixes.get(name, ())
        return platform_of(self.arch) == "rocm" and any(self.arch.startswith(p) for p in prefixes)

    def rebind(self) -> None:
        """Point SGLang modules loaded since the last call at the dispatchers."""
        if self._bound_at == len(sys.modules):
            return
        self._bound_at = len(sys.modules)
        for name, real in self._real.items():
            for module, key in sglang_bindings(real):
                setattr(module, key, self._dispatch[name])

    @contextlib.contextmanager
    def on(self, arch: str) -> Iterator[None]:
        self.rebind()
        saved, self.arch = self.arch, arch
        saved_hip = _HIP_ARCH["arch"]
        if platform_of(arch) == "rocm":
            _HIP_ARCH["arch"] = arch
        try:
            yield
        finally:
            self.arch = saved
            _HIP_ARCH["arch"] = saved_hip


_arch_probes: list[ArchProbes] = []


def arch_probes() -> ArchProbes:
    """This process's ``ArchProbes`` (built once, after SGLang's ``utils.common`` loaded)."""
    if not _arch_probes:
        _arch_probes.append(ArchProbes())
    return _arch_probes[0]


def known_archs() -> tuple[str, ...]:
    """The arch values the installed SGLang has a platform for, read from its sources (nothing imported).

    ``smNN``; the AMD targets its ``is_gfx*_supported`` probes distinguish
    (``utils/common.py``); ``cpu`` and ``cpu_amx``, ``xpu``, ``npu`` where
    ``sglang.srt.platforms`` has that platform's module.
    """
    known = ["smNN"]
    common = source_of("sglang.srt.utils.common")
    if common is not None and source_of("sglang.srt.platforms.rocm") is not None:
        prefixes = {p for values in _gfx_probe_prefixes_of(common).values() for p in values}
        known += [t for t in ROCM_TARGETS if any(t.startswith(p) for p in prefixes)]
    if source_of("sglang.srt.platforms.cpu") is not None:
        known += ["cpu", "cpu_amx"]
    for platform in ("xpu", "npu"):
        if source_of(f"sglang.srt.platforms.{platform}") is not None:
            known.append(platform)
    return tuple(known)


def _constant(value: Any, *args: Any, **kwargs: Any) -> Any:
    return value


def _sm_of(capability: tuple[int | None, int | None]) -> int:
    major, minor = capability
    return (major or 0) * 10 + (minor or 0)


def _gfx_probe_prefixes(common: types.ModuleType) -> dict[str, tuple[str, ...]]:
    source = source_of(common.__name__)
    return _gfx_probe_prefixes_of(source) if source is not None else {}


def _gfx_probe_prefixes_of(source: str) -> dict[str, tuple[str, ...]]:
    """``is_gfx*_supported`` → the ``gfx`` strings its body matches the device's arch against."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("is_gfx") and node.name.endswith("_supported"):
            found[node.name] = tuple(c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                                     and isinstance(c.value, str) and c.value.startswith("gfx"))
    return found


def _known_platform_facts(rc: Any) -> set[str] | None:
    """The platform facts the installed ``override_platform`` accepts (its own tables), or None if unreadable."""
    probes = getattr(rc, "_PLATFORM_PROBES", None)
    values = getattr(rc, "_PLATFORM_VALUES", None)
    if isinstance(probes, Mapping) and isinstance(values, Mapping):
        return set(probes) | set(values)
    return None


def platform_fact_names(rc: Any, version: str | None) -> set[str]:
    """The facts to set: every one the release knows; AdapterError for one the adapter cannot derive."""
    derivable = platform_facts("sm90")
    known = _known_platform_facts(rc)
    if known is None:  # no tables to read: ask override_platform about each fact it might take
        return {name for name, value in derivable.items() if _accepts_fact(rc, name, value)}
    unknown = sorted(known - set(derivable))
    if unknown:
        from .support import adapter_error

        raise adapter_error("platform", f"SGLang knows platform fact(s) {unknown} that the adapter cannot "
                           "derive from a GPU arch")
    return known


def _accepts_fact(rc: Any, name: str, value: Any) -> bool:
    """Whether ``override_platform`` accepts one fact (SGLang raises ``ValueError: unknown platform fact(s)``)."""
    try:
        with rc.override_platform(**{name: value}):
            return True
    except ValueError as exc:
        if "unknown platform fact" in str(exc):
            return False
        raise


__all__ = ["ArchProbes", "DEVICES", "arch_probes", "PLATFORM_LIBRARIES", "capability_of", "device_of", "fake_import_platform",
           "known_archs", "loaded_platform", "platform_fact_names", "platform_facts"]
