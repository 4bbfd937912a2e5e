"""The kernel check of another platform's cell, run in that platform's child process.

SGLang's ``triton`` and ``torch_native`` backends run their CUDA code on ROCm,
CPU and XPU too, with that platform's branches (``_is_hip``, ``_is_xpu``,
``_is_cpu`` and the per-arch probes). The child of the cell's platform
(``engines/common/platform_process.py``) imported SGLang on it, so those
branches are the platform's; ``scope`` states the cell's arch for the
duration of a check, as ``SGLangEngine.cell_context`` does for start-up
validation, and more: every SGLang module-level constant that was derived
from an arch probe when its module loaded (``extend_attention._is_gfx95 =
_is_hip and is_gfx95_supported()``, ``memory_pool._cpu_has_amx_support``) is
derived again from SGLang's own statement for the cell's arch, and put back
afterwards. Without that a gfx950 cell would run the gfx942 branches of
``extend_attention`` (the arch the child loaded on).

Triton's kernels run under its interpreter, as the CUDA cells' do: no Triton
compiler for these platforms exists here (and none for the CPU platform at
all: Triton compiles for GPUs). torch_native's decode is plain torch, run on
this host's CPU. A path that reaches a compiled call of the platform's own
kernel libraries (``sgl_kernel``'s CPU / XPU build, AMD's ``aiter``: import
stubs in the child) stops the check as not-run naming that call, unless
``kernels.emulated`` has that call's emulation (``emulations``): then the
backend's own code runs around it. ``intel_amx`` (CPU) and ``intel_xpu``
(XPU) run so: SGLang's ``IntelAMXAttnBackend`` around sgl-kernel's CPU
attention ops (``kernels/emulated/sgl_kernel_cpu_attention.py``), its
``XPUAttentionBackend`` around sgl-kernel-xpu's MLA ops and, without MLA, its
``flash_attn_with_kvcache`` (``sgl_kernel_xpu_attention.py``,
``sgl_kernel_xpu_flash_attn.py``), on this host's CPU.
"""

from __future__ import annotations

import ast
import contextlib
import sys
import types
from typing import Any, Iterator, Mapping

from ...core.cells import platform_of
from ..common.shared_scope import SharedScope
from ..common.sources import source_of
from .backends import backend

__all__ = ["FP8_PROBES", "PLATFORM_LABELS", "derived_constants", "emulations", "notes", "scope"]

# Which decode backends' checks run in a platform's child is each backend's ``checked_on`` (``backends``): at
# level ``backend``, or ``emulated`` where the path calls compiled ops of the platform's own library this host
# lacks (``checks.platform_emulations``: ``intel_amx``'s sgl-kernel CPU attention ops and ``intel_xpu``'s MLA ops
# always, a GQA pool's ``store_cache_*``).
PLATFORM_LABELS = {"rocm": "ROCm", "cpu": "CPU", "xpu": "XPU", "npu": "NPU"}

#: The modules of the check's path (attention kernels and backends, pools, DCP, the DeepSeek attention).
_CHECK_PATH = ("sglang.kernels.ops.attention.", "sglang.srt.layers.attention.", "sglang.srt.mem_cache.",
               "sglang.srt.layers.dcp.", "sglang.srt.layers.radix_attention.", "sglang.srt.models.deepseek_common.")
_shared = SharedScope("sglang platform checks")
_emulated_ops = SharedScope("sglang platform ops emulated")


def emulations(names: tuple[str, ...], platform: str | None = None) -> contextlib.AbstractContextManager[Any]:
    """The platform ops ``names`` emulated for one check on ``platform``, shared by its in-process DCP ranks
    (yields the installation's ``CallLog``; None when there are none)."""
    if not names:
        return contextlib.nullcontext(None)
    return _emulated_ops.enter(tuple(names), lambda: _installed(tuple(names), platform))


@contextlib.contextmanager
def _installed(names: tuple[str, ...], platform: str | None = None) -> Iterator[Any]:
    """``emulations_installed(names)`` from the platform's registry (``emulated.platform_registry``: on XPU
    ``sgl_kernel.flash_attn.flash_attn_with_kvcache`` is sgl-kernel-xpu's, not FA3's), and every SGLang binding
    of one of them to the child's kernel-library stub (``from sgl_kernel import store_cache_xpu`` when the module
    loaded) pointed at the emulation.

    Only the emulated names: ``emulation._validation_stubs_replaced`` (the CUDA emulated checks') resolves
    every stub, and in a platform child the other stubbed libraries (``flash_mla``) do not import."""
    import importlib

    from ...kernels.emulated import NOT_IN_LIBRARY, platform_registry
    from ...kernels.emulated.install import emulations_installed
    from ..common.gpu_steps import _KernelName

    with emulations_installed(names, platform_registry(platform), absent=NOT_IN_LIBRARY) as log:
        wanted = {}
        for name in names:
            path, _, attr = name.partition(":")
            if not path.startswith("torch.ops."):
                wanted[f"{path}.{attr}"] = getattr(importlib.import_module(path), attr)
        saved: list[tuple[types.ModuleType, str, Any]] = []
        try:
            for module_name, module in list(sys.modules.items()):
                if module is None or not (module_name == "sglang" or module_name.startswith("sglang.")):
                    continue
                for key, value in list(vars(module).items()):
                    if isinstance(value, _KernelName) and object.__getattribute__(value, "_mla_path") in wanted:
                        saved.append((module, key, value))
                        setattr(module, key, wanted[object.__getattribute__(value, "_mla_path")])
            yield log
        finally:
            for module, key, value in reversed(saved):
                setattr(module, key, value)


def notes(options: Mapping[str, Any], changed: list[str]) -> tuple[str, ...]:
    """Where a platform check ran, which load-time constants answered its arch, what stood in for the device."""
    platform = options["platform"]
    label = PLATFORM_LABELS.get(platform, platform)
    said = [f"ran in a process that imported SGLang on its {label} platform, answering for {options['arch']}"]
    on_path = sorted(name for name in changed if name.startswith(_CHECK_PATH))
    if changed:
        others = len(changed) - len(on_path)
        said.append(f"SGLang constants derived from the arch probes when their modules loaded, derived again for "
                    f"{options['arch']}: " + ", ".join(on_path or ["none on the attention path"])
                    + (f" (and {others} in other modules)" if others else ""))
    said.append(backend(options["backend"]).platform_note(platform, label))
    return tuple(said)


@contextlib.contextmanager
def scope(adapter_rc: Any, arch: str) -> Iterator[list[str]]:
    """The cell's arch for one check, shared by its in-process DCP ranks (entered by the first, left by the last).

    Yields the SGLang constants derived again for the arch (``module.NAME``).
    """
    with _shared.enter(None, lambda: _stated(adapter_rc, arch)) as changed:
        yield changed


@contextlib.contextmanager
def _stated(rc: Any, arch: str) -> Iterator[list[str]]:
    import torch

    from .platforms import ARCH_PROBES, arch_probes, capability_of, platform_fact_names, platform_facts

    facts = platform_facts(arch)
    known = platform_fact_names(rc, None)
    capability = capability_of(arch)
    probes = arch_probes()
    saved_capability = torch.cuda.get_device_capability
    with rc.override_platform(**{k: v for k, v in facts.items() if k in known}), probes.on(arch):
        if platform_of(arch) == "rocm":  # torch.cuda answers on a HIP device
            torch.cuda.get_device_capability = lambda device=None: capability  # type: ignore[assignment]
        try:
            with derived_constants(ARCH_PROBES + FP8_PROBES) as changed:
                yield changed
        finally:
            torch.cuda.get_device_capability = saved_capability  # type: ignore[assignment]


#: SGLang's fp8-format probe (``kernels/ops/quantization/fp8_kernel.py``: ``"gfx94" in gcnArchName`` on
#: ROCm, behind an ``lru_cache``) and the module that defines the platform fp8 type from it at load.
FP8_PROBES = ("is_fp8_fnuz",)


@contextlib.contextmanager
def derived_constants(probes: tuple[str, ...]) -> Iterator[list[str]]:
    """Every loaded SGLang module's top-level ``NAME = <expr>`` whose expression calls one of ``probes``
    (or reads a name derived so), evaluated again now (the probes answer the active arch); put back after.

    A top-level ``if <derived>: NAME = ... else: NAME = ...`` of plain assignments is run again the
    same way (``fp8_kernel.py``: ``if is_fp8_fnuz(): fp8_dtype = torch.float8_e4m3fnuz``), and a
    changed torch dtype or float is rebound wherever another module imported it under its name
    (``from ...fp8_kernel import fp8_dtype``: ``mem_cache/kv_cache_dtype.py``). ``is_fp8_fnuz``'s
    cache (any probe's ``lru_cache``) is emptied on entry and on exit, so that it answers the active arch.

    Yields ``module.NAME`` of each constant that changed.
    """
    import torch

    saved: list[tuple[types.ModuleType, str, Any]] = []
    changed: list[str] = []
    _forget_cached_probes(probes)
    try:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "sglang" or name.startswith("sglang.")):
                continue
            for targets, code, block in _derived_statements(name, probes):
                try:
                    scope = dict(vars(module))
                    exec(code, scope)  # noqa: S102 - SGLang's own module-level statement, re-run
                except Exception as exc:  # noqa: BLE001 - a statement that needs what only its load had
                    if block:
                        # an if-block picking objects for the arch (rotary_embedding/utils.py binds
                        # torch.ops.sgl_kernel.apply_rotary_pos_emb_cpu under cpu_amx, an op this host
                        # lacks): never a plain value, left as it loaded
                        continue
                    from .support import adapter_error

                    raise adapter_error("kernel check", f"cannot derive {name}.{', '.join(targets)} again for the "
                                                        f"cell's arch: {type(exc).__name__}: {exc}") from None
                for target in targets:
                    if target not in scope:
                        continue
                    value, old = scope[target], vars(module).get(target)
                    if not isinstance(value, (*_PLAIN, torch.dtype)) or type(value) is type(old) and value == old:
                        continue  # an object (a kernel, a table) or the same answer: left as it loaded
                    saved.append((module, target, old))
                    setattr(module, target, value)
                    changed.append(f"{name}.{target}")
                    if isinstance(old, (torch.dtype, float)):
                        changed += _rebind_imported(target, old, value, module, saved)
        yield changed
    finally:
        for module, target, old in reversed(saved):
            setattr(module, target, old)
        _forget_cached_probes(probes)


def _rebind_imported(target: str, old: Any, value: Any, home: types.ModuleType,
                     saved: list[tuple[types.ModuleType, str, Any]]) -> list[str]:
    """Rebind ``target`` in every other SGLang module that holds ``home``'s old object under that name."""
    rebound = []
    for name, module in list(sys.modules.items()):
        if module is None or module is home or not (name == "sglang" or name.startswith("sglang.")):
            continue
        if vars(module).get(target) is old:
            saved.append((module, target, old))
            setattr(module, target, value)
            rebound.append(f"{name}.{target}")
    return rebound


def _forget_cached_probes(probes: tuple[str, ...]) -> None:
    """Empty the ``lru_cache`` of each probe that has one (``is_fp8_fnuz``), wherever SGLang defines it."""
    cleared: set[int] = set()
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "sglang" or name.startswith("sglang.")):
            continue
        for probe in probes:
            clear = getattr(vars(module).get(probe), "cache_clear", None)
            if clear is not None and id(clear) not in cleared:
                cleared.add(id(clear))
                clear()


_PLAIN = (bool, int, float, str, type(None))
_statements: dict[tuple[str, tuple[str, ...]], list[tuple[tuple[str, ...], Any, bool]]] = {}


def _derived_statements(module_name: str, probes: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any, bool]]:
    """``(names, compiled statement, is an if-block)`` of a module's top-level assignments derived from
    ``probes`` (cached): ``NAME = <expr>``, and ``if``/``else`` blocks of such assignments whose test reads
    a derived name."""
    key = (module_name, probes)
    found = _statements.get(key)
    if found is not None:
        return found
    found = []
    source = source_of(module_name) if _has_probe_text(module_name, probes) else None
    if source is not None:
        derived = set(probes)
        for node in ast.parse(source).body:
            if _plain_assign(node):
                used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                targets = (node.targets[0].id,)
            elif isinstance(node, ast.If) and _plain_block(node):
                used = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                targets = tuple(dict.fromkeys(_assigned(node)))
            else:
                continue
            if used & derived:
                derived.update(targets)
                found.append((targets, compile(ast.Module([node], type_ignores=[]), module_name, "exec"),
                              isinstance(node, ast.If)))
    _statements[key] = found
    return found


def _plain_assign(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)


def _plain_block(node: ast.If) -> bool:
    """An ``if`` whose branches only assign names (nested ``if`` of the same kind allowed)."""
    return all(_plain_assign(n) or isinstance(n, ast.If) and _plain_block(n) for n in (*node.body, *node.orelse))


def _assigned(node: ast.If) -> list[str]:
    names = []
    for n in (*node.body, *node.orelse):
        names += _assigned(n) if isinstance(n, ast.If) else [n.targets[0].id]
    return names


def _has_probe_text(module_name: str, probes: tuple[str, ...]) -> bool:
    module = sys.modules.get(module_name)
    return module is not None and any(p in vars(module) for p in probes)
