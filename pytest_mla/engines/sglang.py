"""The real SGLang engine: its own argument resolution and attention-backend factories.

For a cell the adapter builds SGLang's real server arguments (the same argv
``sglang serve`` parses; for a backend name outside the parser's ``choices``,
which argparse would reject with ``SystemExit`` before SGLang checks anything,
``ServerArgs(**kwargs)`` as SGLang's programmatic ``Engine(**kwargs)`` builds
it, so the model runner's registry lookup answers for the name), resolves them with SGLang's resolution pipeline
(``ServerArgs.resolve_once``: the ``arg_groups`` hooks that refuse
arch / KV-dtype / page-size combinations and rewrite some settings), publishes
them as the scheduler process does, and runs the model runner's backend
builder (``_build_resolved_backend``: decode before prefill, a hybrid wrapper
when they differ) through SGLang's ``ATTENTION_BACKENDS`` factories. Whatever
SGLang raises propagates unchanged; an accepted cell reports the backend
classes the factories would have built.

How it runs on a CPU-only machine (see docs/engines.md):

* **The GPU arch is faked with SGLang's own switch**,
  ``sglang.srt.runtime_context.override_platform(...)``: every platform fact
  (``is_cuda``, ``is_sm90``, ``is_sm100``, ``is_blackwell``, ``device_sm``,
  ``device_capability``, ...) is set from the cell's arch for the duration of
  one cell. ``has_flashinfer`` is set true (a GPU host with the kernel
  libraries installed). The ``fa3`` factory calls ``get_device_capability()``
  directly (imported into ``attention_registry``), so that name is patched to
  the cell's capability as well.
* **No backend is constructed.** While the factories run, the modules they
  import their backend classes from (read from the factories' own source)
  are swapped for probe modules: ``SomeBackend(runner)`` records
  ``"SomeBackend"`` instead of allocating GPU workspaces. Every check a
  factory makes *before* it constructs still runs; checks inside a backend's
  ``__init__`` are out of reach (they need a GPU model runner).
  ``torch.cuda.Stream()`` (created by the ``flashinfer`` factory under EAGLE,
  after its checks) is likewise replaced by a placeholder for the factory
  call, so ``RuntimeError: torch.cuda.Stream requires CUDA support`` -- a
  machine artifact -- never reaches a verdict; the cell carries a note.
* **Import stubs**: ``torchvision`` (a CUDA-linked wheel that transformers and
  SGLang's multimodal configs import for names only) is an inert stub, listed
  in ``metadata()["stubs"]``.
* **Models** are weightless ``config.json`` files shipped in
  ``pytest_mla/engines/model_configs/<model>/`` (no quantization config).

``tp`` defaults to the cell's DCP size (DCP shards inside a TP group) when the
matrix has no ``tp`` axis. Speculative cells pass ``--speculative-algorithm
EAGLE`` with topk, steps and ``num_draft_tokens`` from the spec setting; the
draft model path is the model's own config.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..core.cells import Cell, arch_number
from ..core.models import ModelConfig
from ..core.spec import parse_spec
from . import _quiet
from .protocol import Configured

if importlib.util.find_spec("sglang") is None:  # the registry turns this into "unavailable"
    raise ImportError("sglang is not installed in this environment", name="sglang")

#: Weightless model configs, one folder per catalogue model.
MODEL_CONFIGS = Path(__file__).with_name("model_configs")

#: CUDA-linked modules replaced by import stubs (imported for names only).
STUBS = {"torchvision": {"torchvision": {"__version__": "0.28.0"}}}

_FACTORY_IMPORT = re.compile(r"from\s+(sglang\.srt\.[\w.]+)\s+import")
_HYBRID_MODULE = "sglang.srt.layers.attention.hybrid_attn_backend"

#: Note recorded when the flashinfer factory's CUDA stream was not created.
STREAM_NOTE = "torch.cuda.Stream() not created (no GPU here): the factory's checks had all passed"


def platform_facts(arch: str) -> dict[str, Any]:
    """SGLang's platform facts for an NVIDIA arch such as ``sm90``, as its probes would answer."""
    sm = arch_number(arch)
    if sm is None:
        raise ValueError(f"sglang adapter: only NVIDIA archs (smNN) can be faked, got {arch!r}")
    major, minor = divmod(sm, 10)
    return {
        "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
        "is_sm90": major == 9,
        "is_sm100": major == 10,
        "is_sm100_or_sm110": major in (10, 11),
        "is_sm110": major == 11,
        "is_sm120": major == 12,
        "is_blackwell": major in (10, 11, 12),
        "is_hopper_with_cuda_12_3": major == 9,
        "has_amx": False,
        "has_flashinfer": True,
        "device_sm": sm,
        "device_capability": (major, minor),
    }


def server_kwargs(cell: Cell, model: ModelConfig, model_path: str) -> dict[str, Any]:
    """The ``ServerArgs`` fields a cell sets (``Engine(**kwargs)`` keywords), in argv order.

    A backend value ``P+D`` means ``prefill_attention_backend=P,
    decode_attention_backend=D`` (``attention_backend`` left to SGLang).
    """
    spec = parse_spec(cell.spec)
    tp = cell.tp if cell.tp is not None else max(cell.dcp, 1)
    prefill, plus, decode = cell.backend.partition("+")
    kwargs: dict[str, Any] = {"model_path": model_path, "device": "cuda"}
    if plus:  # "P+D": separate prefill and decode backends, attention_backend left to SGLang
        kwargs.update(prefill_attention_backend=prefill, decode_attention_backend=decode)
    else:
        kwargs["attention_backend"] = cell.backend
    kwargs.update(tp_size=tp, dcp_size=cell.dcp)
    if spec.enabled:
        algorithm = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "nextn": "NEXTN"}[spec.algorithm or ""]
        kwargs.update(
            speculative_algorithm=algorithm,
            speculative_eagle_topk=spec.topk,
            speculative_num_steps=spec.steps,
            speculative_num_draft_tokens=spec.num_draft_tokens,
        )
        if not model.mla:  # DeepSeek-style models draft with their own MTP layer
            kwargs["speculative_draft_model_path"] = model_path
    if cell.kv_dtype is not None:
        kwargs["kv_cache_dtype"] = cell.kv_dtype
    if cell.page_size is not None:
        kwargs["page_size"] = cell.page_size
    return kwargs


def argv_of(kwargs: Mapping[str, Any]) -> list[str]:
    """``--field-name value`` for each ``ServerArgs`` field (every one used here is its own flag)."""
    return [part for field, value in kwargs.items() for part in ("--" + field.replace("_", "-"), str(value))]


def server_argv(cell: Cell, model: ModelConfig, model_path: str) -> list[str]:
    """The ``sglang serve`` arguments of a cell."""
    return argv_of(server_kwargs(cell, model, model_path))


#: The argparse options whose ``choices`` decide whether a cell goes through argv.
_BACKEND_OPTIONS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


class _Built:
    """What a probed backend constructor returns: the class name it would have built."""

    def __init__(self, name: str, kwargs: Mapping[str, Any]) -> None:
        self.name = name
        self.kwargs = dict(kwargs)

    def __repr__(self) -> str:
        return f"<not constructed: {self.name}>"


def _probe_class(name: str) -> type:
    def construct(cls: type, *args: Any, **kwargs: Any) -> _Built:
        return _Built(name, kwargs)

    return type(name, (), {"__new__": construct})


class _ProbeModule(types.ModuleType):
    """Stands in for a backend module while a factory runs: its classes record, never build."""

    def __init__(self, name: str, real: types.ModuleType | None) -> None:
        super().__init__(name)
        self._real = real

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        real = self._real
        value = getattr(real, attr, None) if real is not None else None
        if value is None or inspect.isclass(value):
            return _probe_class(attr)
        return value  # helper functions and constants of a loaded module stay real


class _StreamPlaceholder:
    created: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _StreamPlaceholder.created.append("stream")


class SGLangEngine:
    """Adapter for an installed ``sglang`` (``[engine] name = "sglang"``)."""

    name = "sglang"
    #: SGLang refuses with ``ValueError`` (factories, resolution hooks) and ``AssertionError``
    #: (``assert`` checks in fa3/triton factories and the CuteDSL prefill check).
    refusal_errors: tuple[type[BaseException], ...] = (ValueError, AssertionError)

    def __init__(self) -> None:
        from ..kernels._mode import ensure_triton_mode
        from ._import_stubs import install_stubs

        # SGLang's modules decorate @triton.jit kernels on import: decide the mode first.
        self._kernel_target = ensure_triton_mode()

        self.stubs: list[str] = []
        for root, attrs in STUBS.items():
            self.stubs += install_stubs([root], attrs)
        logging.getLogger("sglang").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt import runtime_context
            from sglang.srt.arg_groups import overrides
            from sglang.srt.configs.model_config import AttentionArch
            from sglang.srt.layers.attention import attention_registry
            from sglang.srt.mem_cache import kv_cache_dtype
            from sglang.srt.model_executor.model_runner_components import attention_backend_setup
            from sglang.srt.server_args import ServerArgs, prepare_server_args
        self._rc = runtime_context
        self._overrides = overrides
        self._mla_arch = AttentionArch.MLA
        self._registry = attention_registry
        self._kv_cache_dtype = kv_cache_dtype
        self._setup = attention_backend_setup
        self._prepare = prepare_server_args
        self._server_args_cls = ServerArgs
        self._cli_choices = _cli_choices(ServerArgs)
        self.version = importlib.metadata.version("sglang")
        self._probe_modules = self._factory_modules()

    # -- Engine protocol -------------------------------------------------------------
    def configure(self, cell: Cell, model: ModelConfig) -> Configured:
        path = MODEL_CONFIGS / cell.model
        if not (path / "config.json").is_file():
            raise LookupError(f"sglang adapter: no weightless config.json for model {cell.model!r} under {MODEL_CONFIGS}")
        kwargs = server_kwargs(cell, model, os.fspath(path))
        facts = platform_facts(cell.arch)
        with _quiet.quiet(), self._rc.override_platform(**facts), self._capability(facts["device_capability"]):
            server_args = self._server_args(kwargs)
            server_args.resolve_once()  # SGLang's resolution pipeline: raises its own errors
            self._rc.publish(server_args, role="test")
            runner = self._runner(server_args)
            built, notes = self._build(runner)
        resolved = self._overrides.resolution_result
        for field, label in (("page_size", "page size"), ("kv_cache_dtype", "kv-cache-dtype"),
                             ("attention_backend", "attention backend")):
            if field == "attention_backend" and "+" in cell.backend:
                continue
            asked = _asked(cell, field)
            got = resolved(server_args, field)
            if asked is not None and str(got) != str(asked):
                notes.append(f"{label} {asked} resolved to {got}")
        from .sglang_backend import kernel_from

        kernel, kernel_reason = kernel_from(cell, model, server_args, runner, self._kernel_target)
        return Configured(backends=built, kernel=kernel, kernel_reason=kernel_reason, notes=tuple(notes))

    def metadata(self) -> Mapping[str, Any]:
        return {
            "engine": "sglang",
            "version": self.version,
            "stubs": list(self.stubs),
            "faked": "runtime_context.override_platform + attention_registry.get_device_capability",
            "not_constructed": sorted(self._probe_modules),
        }

    # -- pieces ------------------------------------------------------------------------
    def _server_args(self, kwargs: Mapping[str, Any]) -> Any:
        """``ServerArgs`` as ``sglang serve`` builds them, or as ``Engine(**kwargs)`` does.

        A backend name outside the CLI's ``choices`` never gets past argparse
        (``SystemExit``), so such a cell builds the record the way SGLang's
        programmatic entry point does (``Engine.__init__``:
        ``ServerArgs(**kwargs)``, ``log_level="error"`` when absent); the
        engine's own registry lookup then answers for the name.
        """
        if all(kwargs.get(f) is None or kwargs[f] in self._cli_choices.get(f, (kwargs[f],)) for f in _BACKEND_OPTIONS):
            return self._prepare(argv_of(kwargs))  # `sglang serve ...`
        return self._server_args_cls(**{"log_level": "error", **kwargs})

    def _factory_modules(self) -> set[str]:
        """Modules SGLang's factories import backend classes from (read from their source)."""
        modules = {_HYBRID_MODULE}
        for factory in set(self._registry.ATTENTION_BACKENDS.values()):
            try:
                source = inspect.getsource(factory)
            except (OSError, TypeError):
                continue
            modules.update(m.group(1) for m in _FACTORY_IMPORT.finditer(source))
        return modules

    def _runner(self, server_args: Any) -> Any:
        """The attributes of a model runner that the backend builder and factories read."""
        model_config = self._overrides.model_config_of(server_args)
        prefill, decode = self._rc.attention_backends()
        _, kv_dtype = self._kv_cache_dtype.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=self._rc.get_model().kv_cache_dtype,
            model=None,
            model_dtype=__import__("torch").bfloat16,
            is_draft_worker=False,
            is_dflash=False,
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=self._rc.get_spec().speculative_draft_kv_cache_dtype,
        )
        return types.SimpleNamespace(
            server_args=server_args,
            model_config=model_config,
            use_mla_backend=model_config.attention_arch == self._mla_arch,
            kv_cache_dtype=kv_dtype,
            prefill_attention_backend_str=prefill,
            decode_attention_backend_str=decode,
            is_draft_worker=False,
            draft_attention_backend=None,
            init_new_workspace=False,
            device="cuda",
            page_size=self._rc.get_schedule().page_size,
        )

    def _build(self, runner: Any) -> tuple[dict[str, str], list[str]]:
        """Run SGLang's backend builder with probe modules; map roles to backend classes."""
        resolved = self._setup.ResolvedAttentionBackendStr(
            prefill=runner.prefill_attention_backend_str, decode=runner.decode_attention_backend_str)
        _StreamPlaceholder.created = []
        with self._probes():
            built = self._setup._build_resolved_backend(model_runner=runner, resolved=resolved,
                                                        init_new_workspace=False)
        notes = [STREAM_NOTE] if _StreamPlaceholder.created else []
        if isinstance(built, _Built) and "decode_backend" in built.kwargs:
            decode, prefill = built.kwargs["decode_backend"], built.kwargs["prefill_backend"]
            return {"decode": _label(decode), "prefill": _label(prefill)}, notes
        return {"decode": _label(built), "prefill": _label(built)}, notes

    @contextlib.contextmanager
    def _probes(self) -> Iterator[None]:
        import torch

        saved = {name: sys.modules.get(name) for name in self._probe_modules}
        stream = torch.cuda.Stream
        try:
            for name, real in saved.items():
                sys.modules[name] = _ProbeModule(name, real)
            torch.cuda.Stream = _StreamPlaceholder  # type: ignore[misc,assignment]
            yield
        finally:
            torch.cuda.Stream = stream  # type: ignore[misc]
            for name, real in saved.items():
                if real is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = real

    @contextlib.contextmanager
    def _capability(self, capability: tuple[int, int]) -> Iterator[None]:
        registry = self._registry
        real = registry.get_device_capability
        registry.get_device_capability = lambda device_id=0: capability
        try:
            yield
        finally:
            registry.get_device_capability = real



def _cli_choices(server_args_cls: Any) -> dict[str, tuple[str, ...]]:
    """The ``choices`` of SGLang's own parser for the backend options (read from ``add_cli_args``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args_cls.add_cli_args(parser)
    return {a.dest: tuple(a.choices) for a in parser._actions if a.dest in _BACKEND_OPTIONS and a.choices}


def _asked(cell: Cell, field: str) -> Any:
    """What the cell asked for (SGLang's defaults where the matrix has no axis)."""
    return {"page_size": cell.page_size if cell.page_size is not None else 1,
            "kv_cache_dtype": cell.kv_dtype or "auto", "attention_backend": cell.backend}[field]


def _label(built: Any) -> str:
    return built.name if isinstance(built, _Built) else type(built).__name__
