"""Faults injected at run time into the installed SGLang's own kernels and merge, and a driver that checks cells.

Run inside an SGLang venv (``tests/engines/test_sglang_checks.py`` does)::

    python tests/engines/sglang_faults.py SCENARIO [SCENARIO ...] [--dcp-mode distributed]

A scenario is ``FAULT:CASE`` (``none`` for no fault); the driver prints one
JSON line per scenario with the kernel record's status, message and errors.
Nothing in the venv is edited: each fault replaces an SGLang function in this
process (and, for ``--dcp-mode distributed``, in every rank process, which
runs ``run`` below as its engine runner) and is undone afterwards.

Faults (what a buggy release could ship):

* ``decode-drops-first-token``: ``decode_attention_fwd`` skips each request's
  first cached token (an off-by-one in the decode kernel's range).
* ``extend-drops-last-prefix-token``: ``extend_attention_fwd`` skips each
  request's last prefix token (an off-by-one in the verify kernel's prefix).
* ``merge-ignores-lse``: ``cp_lse_ag_out_rs_mha`` averages the ranks' partial
  outputs instead of weighting them by their LSE.
* ``decode-scale-x1.25`` / ``decode-scale-x1.05`` / ``extend-scale-x1.05``: the
  decode (verify) kernel multiplies its ``sm_scale`` by 1.25 or 1.05 (a wrong
  head dim, a YaRN factor applied twice or forgotten in part).
* ``decode-drops-last-token``: ``decode_attention_fwd`` reads one token short
  (each request's newest cached token).
* ``merge-lse-base2``: ``cp_lse_ag_out_rs_mha`` is handed each rank's LSE in
  base 2 (a kernel library's convention) and merges it as natural log.
* ``flashmla-scale-x1.05``: SGLang's ``FlashMLABackend.forward_decode`` hands
  its (emulated) FlashMLA kernel the layer's softmax scale times 1.05.
* ``fa4-scale-x1.05``: the same in ``FlashAttentionBackend.forward_decode`` for
  ``fa4`` (FlashAttention-4's emulated CuTe interface).
* ``fi-a2a-lse-base-swapped``: ``--dcp-comm-backend fi_a2a``'s reduce
  (``_dcp_fi_a2a_lse_reduce``) merges the partials it received through
  FlashInfer's all-to-all in the other LSE base than the backend's.
* ``fi-a2a-drops-last-rank``: the same reduce loses the last DCP rank's
  partial (its LSE sent as ``-inf``, so every receiver merges without it).
* ``trtllm-mha-bmm1-x1.05``: SGLang's ``TRTLLMHAAttnBackend._get_bmm_scales``
  hands FlashInfer's (emulated) decode a ``bmm1_scale`` 1.05 times too large.
* ``torch-native-scale-x1.05`` / ``flex-scale-x1.05``: TorchNativeAttnBackend's
  ``_run_sdpa_forward_decode`` / TorchFlexAttnBackend's ``_run_flex_forward_decode``
  hands SDPA / flex_attention the layer's scale times 1.05.
* ``intel-amx-scale-x1.05``: ``IntelAMXAttnBackend.forward_decode`` hands
  sgl-kernel's (emulated) ``decode_attention_cpu`` the layer's scale times 1.05.
* ``intel-xpu-scale-x1.05`` / ``intel-xpu-extend-scale-x1.05``: SGLang's
  ``XPUAttentionBackend.forward_decode`` / ``forward_extend`` hands its
  (emulated) ``flash_mla_decode`` / ``flash_mla_prefill`` (an MLA model) or
  sgl-kernel-xpu's ``flash_attn_with_kvcache`` (Llama) the layer's softmax
  scale times 1.05.
* ``trtllm-mha-xqa-mask-full``: its XQA verify mask (``_xqa_spec_dec_mask``,
  passed by ``_run_fixed_q_len_decode``) has every bit set: each draft token
  sees the later ones.

``requests-outgrow-topk`` is no fault: a DeepSeek-V3.2 case whose requests hold more tokens than a
(scaled-down) top-k, the reference attending only the selection.

A case is a Triton cell (checked under Triton's interpreter), or one naming a
CUDA backend, checked at level ``emulated`` (its kernel library calls emulated)
on the cell's arch: sm90 unless the case names another. A case on another
platform's arch (``gfx942``, ``cpu``, ...) is configured and checked as a
matrix run does it, in that platform's child process; its fault travels with
the check's spec and is put in inside the child.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[2]
#: Not a fault: a DSA cell's check with a top-k selection smaller than its long request
#: (``harness.SPARSE_CHECK_TOPK`` standing in for index_topk 2048), the reference attending only the
#: selection, as a request longer than the model's top-k would have it (platform cases only).
SPARSE_SCENARIO = "requests-outgrow-topk"
FAULT_ENV = "PYTEST_MLA_SGLANG_FAULT"

#: Cells the driver knows: id -> (model, spec, dcp, kv_dtype).
CASES = {
    "v2lite-decode": ("deepseek-v2-lite", "none", 1, "auto"),
    "v2lite-tree": ("deepseek-v2-lite", "eagle-4x3", 1, "auto"),
    "v2lite-chain": ("deepseek-v2-lite", "eagle-1x3", 1, "auto"),
    "v2lite-decode-fp8": ("deepseek-v2-lite", "none", 1, "fp8_e4m3"),
    "v3-decode": ("deepseek-v3", "none", 1, "auto"),
    "v3-chain-fp8": ("deepseek-v3", "eagle-1x3", 1, "fp8_e4m3"),
    "v2lite-decode-dcp4": ("deepseek-v2-lite", "none", 4, "auto"),
    "llama-decode-dcp4": ("llama-3.1-8b", "none", 4, "auto"),
    "llama-decode": ("llama-3.1-8b", "none", 1, "auto"),
    # SGLang's CUDA backends around emulated kernels (level emulated): (model, spec, dcp, kv, backend, page[, arch])
    "v2lite-decode-flashmla": ("deepseek-v2-lite", "none", 1, "auto", "flashmla", 64),
    "v3-decode-flashinfer": ("deepseek-v3", "none", 1, "auto", "flashinfer", 1),
    "v2lite-decode-dcp4-flashinfer": ("deepseek-v2-lite", "none", 4, "auto", "flashinfer", 1),
    # on sm100 SGLang's DCP exchange is --dcp-comm-backend fi_a2a (FlashInfer's DCP all-to-all, emulated)
    "v2lite-flashinfer-dcp4-sm100": ("deepseek-v2-lite", "none", 4, "auto", "flashinfer", 1, "sm100"),
    "v3-flashinfer-dcp4-sm100": ("deepseek-v3", "none", 4, "auto", "flashinfer", 1, "sm100"),
    # fa4 (FlashAttention-4's CuTe interface, emulated): MLA decode through the qv path on sm100
    "v2lite-decode-fa4-sm100": ("deepseek-v2-lite", "none", 1, "auto", "fa4", 1, "sm100"),
    # trtllm_mha (GQA): XQA on sm90, trtllm-gen on sm100 (FlashInfer's trtllm_batch_decode_with_kv_cache)
    "llama-decode-trtllm-mha-sm90": ("llama-3.1-8b", "none", 1, "auto", "trtllm_mha", 64, "sm90"),
    "llama-chain-trtllm-mha-sm90": ("llama-3.1-8b", "eagle-1x3", 1, "auto", "trtllm_mha", 64, "sm90"),
    "llama-decode-trtllm-mha-sm100": ("llama-3.1-8b", "none", 1, "auto", "trtllm_mha", 64, "sm100"),
    "llama-chain-trtllm-mha-sm100": ("llama-3.1-8b", "eagle-1x3", 1, "auto", "trtllm_mha", 64, "sm100"),
    "llama-chain-fp8-trtllm-mha-sm100": ("llama-3.1-8b", "eagle-1x3", 1, "fp8_e4m3", "trtllm_mha", 64, "sm100"),
    "v3-decode-flex": ("deepseek-v3", "none", 1, "auto", "flex_attention", 1),
    "v3-decode-qsa": ("deepseek-v3", "none", 1, "auto", "qsa", 1, "sm90"),
    "llama-decode-flex": ("llama-3.1-8b", "none", 1, "auto", "flex_attention", 1),
    "v32-decode-flex": ("deepseek-v3.2", "none", 1, "auto", "flex_attention", 64),
    "llama-decode-fp8-flex": ("llama-3.1-8b", "none", 1, "fp8_e4m3", "flex_attention", 1),
    # other platforms: configured and checked in the child process of the cell's platform (``platform_check``)
    "v3-decode-gfx942": ("deepseek-v3", "none", 1, "auto", "triton", 1, "gfx942"),
    "v3-decode-gfx950": ("deepseek-v3", "none", 1, "auto", "triton", 1, "gfx950"),
    "v3-decode-fp8-gfx942": ("deepseek-v3", "none", 1, "fp8_e4m3", "triton", 1, "gfx942"),
    "v3-decode-fp8-gfx950": ("deepseek-v3", "none", 1, "fp8_e4m3", "triton", 1, "gfx950"),
    "llama-decode-gfx950": ("llama-3.1-8b", "none", 1, "auto", "triton", 1, "gfx950"),
    "llama-chain-gfx942": ("llama-3.1-8b", "eagle-1x3", 1, "auto", "triton", 1, "gfx942"),
    "llama-chain-gfx950": ("llama-3.1-8b", "eagle-1x3", 1, "auto", "triton", 1, "gfx950"),
    "v3-decode-xpu": ("deepseek-v3", "none", 1, "auto", "triton", 1, "xpu"),
    "v3-decode-torch-native-cpu": ("deepseek-v3", "none", 1, "auto", "torch_native", 1, "cpu"),
    "llama-decode-torch-native-cpu": ("llama-3.1-8b", "none", 1, "auto", "torch_native", 1, "cpu"),
    "llama-decode-dcp4-torch-native-cpu": ("llama-3.1-8b", "none", 4, "auto", "torch_native", 1, "cpu"),
    # intel_amx: SGLang's IntelAMXAttnBackend around sgl-kernel's CPU attention ops, emulated (level emulated)
    "v3-decode-intel-amx": ("deepseek-v3", "none", 1, "auto", "intel_amx", 1, "cpu_amx"),
    "llama-decode-intel-amx": ("llama-3.1-8b", "none", 1, "auto", "intel_amx", 1, "cpu_amx"),
    # DeepSeek-V3.2 (DSA) on a dense backend: SGLang's DSA pool, its indexer's gate, the backend's dense decode
    "v32-decode-gfx942": ("deepseek-v3.2", "none", 1, "auto", "triton", 1, "gfx942"),
    "v32-chain-fp8-gfx950": ("deepseek-v3.2", "eagle-1x3", 1, "fp8_e4m3", "triton", 1, "gfx950"),
    "v32-decode-xpu": ("deepseek-v3.2", "none", 1, "auto", "triton", 1, "xpu"),
    "v3-decode-intel-xpu": ("deepseek-v3", "none", 1, "auto", "intel_xpu", 1, "xpu"),
    "v3-chain-intel-xpu": ("deepseek-v3", "eagle-1x3", 1, "auto", "intel_xpu", 1, "xpu"),
    "llama-decode-intel-xpu": ("llama-3.1-8b", "none", 1, "auto", "intel_xpu", 1, "xpu"),
    "llama-chain-intel-xpu": ("llama-3.1-8b", "eagle-1x3", 1, "auto", "intel_xpu", 1, "xpu"),
}


def _drop_tokens(indptr: Any, indices: Any, *, first: bool) -> tuple[Any, Any]:
    """``(indptr, indices)`` with each non-empty request's first (or last) token removed."""
    import torch

    keep = torch.ones(indices.shape[0], dtype=torch.bool, device=indices.device)
    for i in range(indptr.shape[0] - 1):
        start, end = int(indptr[i]), int(indptr[i + 1])
        if end > start:
            keep[start if first else end - 1] = False
    lens = indptr[1:] - indptr[:-1]
    lens = torch.where(lens > 0, lens - 1, lens)
    new_indptr = torch.zeros_like(indptr)
    new_indptr[1:] = torch.cumsum(lens, 0)
    return new_indptr, indices[: int(indptr[-1])][keep[: int(indptr[-1])]]


def _decode_fault(original: Any) -> Any:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, *args, **kwargs):
        kv_indptr, kv_indices = _drop_tokens(kv_indptr, kv_indices, first=True)
        return original(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, *args, **kwargs)

    return decode_attention_fwd


def _extend_fault(original: Any) -> Any:
    def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                             kv_indices, *args, **kwargs):
        kv_indptr, kv_indices = _drop_tokens(kv_indptr, kv_indices, first=False)
        return original(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
                        kv_indices, *args, **kwargs)

    return extend_attention_fwd


def _merge_fault(original: Any) -> Any:
    def cp_lse_ag_out_rs_mha(cp_attn_out, cp_attn_lse, cp_group, return_lse=False):
        if cp_group.world_size == 1:
            return original(cp_attn_out, cp_attn_lse, cp_group, return_lse=return_lse)
        out = cp_group.all_reduce(cp_attn_out.nan_to_num(0.0)) / cp_group.world_size  # the LSEs are ignored
        heads = out.shape[1] // cp_group.world_size
        out = out[:, heads * cp_group.rank_in_group: heads * (cp_group.rank_in_group + 1)].contiguous()
        return (out, cp_attn_lse[:, :heads]) if return_lse else out

    return cp_lse_ag_out_rs_mha


def _scaled(original: Any, factor: float) -> Any:
    import inspect

    signature = inspect.signature(original)

    def scaled(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("sm_scale") is None:
            raise RuntimeError("fault: the kernel was called without an sm_scale to scale")
        bound.arguments["sm_scale"] = bound.arguments["sm_scale"] * factor
        return original(*bound.args, **bound.kwargs)

    return scaled


def _decode_short_fault(original: Any) -> Any:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, *args, **kwargs):
        kv_indptr, kv_indices = _drop_tokens(kv_indptr, kv_indices, first=False)
        return original(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, *args, **kwargs)

    return decode_attention_fwd


def _merge_base2_fault(original: Any) -> Any:
    import math

    def cp_lse_ag_out_rs_mha(cp_attn_out, cp_attn_lse, cp_group, return_lse=False):
        return original(cp_attn_out, cp_attn_lse / math.log(2.0), cp_group, return_lse=return_lse)

    return cp_lse_ag_out_rs_mha


def _fi_a2a_base_fault(original: Any) -> Any:
    def _dcp_fi_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, is_lse_base_on_e=True):
        return original(cp_attn_out, cp_attn_lse, cp_group, not is_lse_base_on_e)

    return _dcp_fi_a2a_lse_reduce


def _fi_a2a_drop_fault(original: Any) -> Any:
    def _dcp_fi_a2a_lse_reduce(cp_attn_out, cp_attn_lse, cp_group, is_lse_base_on_e=True):
        if cp_group.rank_in_group == cp_group.world_size - 1:
            cp_attn_lse = cp_attn_lse.clone().fill_(float("-inf"))
        return original(cp_attn_out, cp_attn_lse, cp_group, is_lse_base_on_e)

    return _dcp_fi_a2a_lse_reduce


_DECODE = ("sglang.kernels.ops.attention.decode_attention", "decode_attention_fwd")
_FI_A2A = ("sglang.srt.layers.dcp.comm", "_dcp_fi_a2a_lse_reduce")
_EXTEND = ("sglang.kernels.ops.attention.extend_attention", "extend_attention_fwd")

FAULTS = {
    "decode-drops-first-token": ("sglang.kernels.ops.attention.decode_attention", "decode_attention_fwd", _decode_fault),
    "extend-drops-last-prefix-token": ("sglang.kernels.ops.attention.extend_attention", "extend_attention_fwd",
                                       _extend_fault),
    "merge-ignores-lse": ("sglang.srt.layers.dcp.comm", "cp_lse_ag_out_rs_mha", _merge_fault),
    "decode-scale-x1.25": (*_DECODE, lambda f: _scaled(f, 1.25)),
    "decode-scale-x1.05": (*_DECODE, lambda f: _scaled(f, 1.05)),
    "extend-scale-x1.05": (*_EXTEND, lambda f: _scaled(f, 1.05)),
    "decode-drops-last-token": (*_DECODE, _decode_short_fault),
    "merge-lse-base2": ("sglang.srt.layers.dcp.comm", "cp_lse_ag_out_rs_mha", _merge_base2_fault),
    "flashmla-scale-x1.05": ("backend:flashmla", "forward_decode", lambda f: _layer_scaled(f, 1.05)),
    "fa4-scale-x1.05": ("backend:fa4", "forward_decode", lambda f: _layer_scaled(f, 1.05)),
    "fi-a2a-lse-base-swapped": (*_FI_A2A, _fi_a2a_base_fault),
    "fi-a2a-drops-last-rank": (*_FI_A2A, _fi_a2a_drop_fault),
    "trtllm-mha-bmm1-x1.05": ("backend:trtllm_mha", "_get_bmm_scales", lambda f: _bmm1_scaled(f, 1.05)),
    "trtllm-mha-xqa-mask-full": ("backend:trtllm_mha", "_run_fixed_q_len_decode", lambda f: _mask_full(f)),
    "torch-native-scale-x1.05": ("backend:torch_native", "_run_sdpa_forward_decode",
                                 lambda f: _sdpa_scaled(f, 1.05)),
    "flex-scale-x1.05": ("backend:flex_attention", "_run_flex_forward_decode", lambda f: _sdpa_scaled(f, 1.05)),
    "intel-amx-scale-x1.05": ("backend:intel_amx", "forward_decode", lambda f: _layer_scaled(f, 1.05)),
    "intel-xpu-scale-x1.05": ("backend:intel_xpu", "forward_decode", lambda f: _layer_scaled(f, 1.05)),
    "intel-xpu-extend-scale-x1.05": ("backend:intel_xpu", "forward_extend", lambda f: _layer_scaled(f, 1.05)),
    # the KV-scale loader forgets that e4m3fnuz halves each value (kv_cache.py's own binding only: the
    # platform's fp8 type, derived from the same probe elsewhere, stays e4m3fnuz)
    "kv-scale-not-doubled-on-fnuz": ("only:sglang.srt.layers.quantization.kv_cache", "is_fp8_fnuz",
                                     lambda f: (lambda: False)),
}


def _sdpa_scaled(original: Any, factor: float) -> Any:
    """torch_native's ``_run_sdpa_forward_decode`` / flex_attention's ``_run_flex_forward_decode`` given the
    layer's scale times ``factor``."""
    def decode(self, *args, scaling=None, **kwargs):
        if scaling is None:
            raise RuntimeError("fault: the decode was called without a scaling to scale")
        return original(self, *args, scaling=scaling * factor, **kwargs)
    return decode


def _bmm1_scaled(original: Any, factor: float) -> Any:
    """``_get_bmm_scales`` whose ``bmm1_scale`` is ``factor`` times SGLang's."""
    def _get_bmm_scales(self, layer, *args, **kwargs):
        bmm1, bmm2 = original(self, layer, *args, **kwargs)
        return bmm1 * factor, bmm2
    return _get_bmm_scales


def _mask_full(original: Any) -> Any:
    """``_run_fixed_q_len_decode`` handing XQA a verify mask with every bit set (no causality in the draft)."""
    import torch

    def _run_fixed_q_len_decode(self, *args, mask=None, **kwargs):
        if mask is not None:
            mask = torch.full_like(mask.view(torch.int16), -1).view(torch.uint16)
        return original(self, *args, mask=mask, **kwargs)
    return _run_fixed_q_len_decode


def _layer_scaled(original: Any, factor: float) -> Any:
    """A backend's ``forward_decode`` that hands its kernel the layer's softmax scale times ``factor``
    (the backend's own code around an emulated kernel computing the wrong scale)."""
    def forward_decode(self, q, k, v, layer, *args, **kwargs):
        saved = layer.scaling
        layer.scaling = saved * factor
        try:
            return original(self, q, k, v, layer, *args, **kwargs)
        finally:
            layer.scaling = saved
    return forward_decode


@contextlib.contextmanager
def injected(fault: str) -> Iterator[None]:
    """Replace one SGLang function, and every module's binding of it, for the block."""
    if fault == "none":
        yield
        return
    import importlib

    from pytest_mla.engines.sglang.rank import load_engine

    load_engine()  # the Triton mode and stubs first, as the runner does
    module_name, attr, make = FAULTS[fault]
    importlib.import_module("sglang.srt.layers.attention.triton_backend")
    if module_name.startswith("backend:"):  # a method of the class SGLang's factory builds, for the block
        name = module_name.split(":", 1)[1]
        backends = importlib.import_module("sglang.srt.layers.attention.attention_registry").ATTENTION_BACKENDS
        factory, patched = backends[name], {}

        def faulty_factory(*args: Any, **kwargs: Any) -> Any:
            backend = factory(*args, **kwargs)  # inside the check: its kernel library is importable
            owner = next(k for k in type(backend).__mro__ if attr in vars(k))
            if owner not in patched:
                patched[owner] = vars(owner)[attr]
                setattr(owner, attr, make(patched[owner]))
            return backend

        backends[name] = faulty_factory
        try:
            yield
        finally:
            backends[name] = factory
            for owner, original in patched.items():
                setattr(owner, attr, original)
        return
    only = module_name.startswith("only:")  # that module's binding alone
    module = importlib.import_module(module_name.removeprefix("only:"))
    original = getattr(module, attr)
    faulty = make(original)
    bound = [(m, name) for m in ([module] if only else list(sys.modules.values()))
             if m is not None and getattr(m, "__name__", "").startswith("sglang")
             for name in (attr,) if getattr(m, name, None) is original]
    for m, name in bound:
        setattr(m, name, faulty)
    try:
        yield
    finally:
        for m, name in bound:
            setattr(m, name, original)


def run(inputs: Any, ctx: Any, options: Any) -> Any:
    """The engine runner with the fault named in the spec's ``fault`` option or ``PYTEST_MLA_SGLANG_FAULT``
    (for distributed rank processes, and platform children, which keep their first environment)."""
    from pytest_mla.engines.sglang.checks import run as sglang_run

    with injected(options.get("fault") or os.environ.get(FAULT_ENV, "none")):
        return sglang_run(inputs, ctx, options)


def platform_check(cell: Any, config: Any, *, fault: str, dtype: str, dcp_mode: str) -> dict[str, Any]:
    """A cell of another platform as a matrix run checks it: configured in its platform's child, checked
    there (the fault travels with the spec, ``run`` puts it in inside the child)."""
    import dataclasses

    from pytest_mla.engines.sglang.adapter import SGLangEngine
    from pytest_mla.kernels import harness

    engine = _PARENT.get("engine")
    if engine is None:
        engine = _PARENT["engine"] = SGLangEngine()
    configured = engine.configure(cell, config)
    kernel = configured.kernel
    if kernel is None:
        raise SystemExit(f"{cell.id}: no check ({configured.kernel_reason})")
    overrides = dict(kernel.case)
    if fault == SPARSE_SCENARIO:  # not a fault: the case's requests outgrow the model's top-k (see the docstring)
        overrides["sparse_topk"], fault = harness.SPARSE_CHECK_TOPK, "none"
    kernel = dataclasses.replace(kernel, target="sglang_faults:run", options=kernel.options + (("fault", fault),))
    case = harness.case_for(cell.coords, config, seed=0, dtype=dtype, overrides=overrides)
    return engine.run_check(case, kernel, where="interpreter", dcp_mode=dcp_mode, timeout_s=600)


_PARENT: dict[str, Any] = {}


def check(case_id: str, *, dtype: str, dcp_mode: str, wrapped: bool, fault: str = "none") -> dict[str, Any]:
    """One cell's kernel record, with the spec SGLang's resolution gives it (page size 1, tp = dcp)."""
    import dataclasses

    from pytest_mla.core.matrix import load_matrix
    from pytest_mla.engines.sglang.checks import kernel_for
    from pytest_mla.kernels import harness
    from pytest_mla.runner import run_check

    entry = CASES[case_id]
    model, spec, dcp, kv = entry[:4]
    backend, page, arch = (*entry[4:], *("triton", 1, "sm90")[len(entry) - 4:])
    matrix = load_matrix(ROOT / "matrix" / "sglang.toml")
    coords = {"model": model, "backend": backend, "dcp": dcp, "spec": spec, "arch": arch, "kv_dtype": kv}
    cell = next(c for c in matrix.cells() if c.coords == coords)
    config = matrix.models[model]
    if not arch.startswith("sm"):
        return platform_check(cell, config, fault=fault, dtype=dtype, dcp_mode=dcp_mode)
    tp = dcp
    kv_heads = 1 if config.mla else max(1, config.num_kv_heads // (tp // dcp))
    kernel, why = kernel_for(cell, config, decode_backend=backend, page_size=page, kv_cache_dtype=kv, tp=tp,
                             num_heads=config.num_heads // tp, num_kv_heads=kv_heads, host_arch=None)
    if kernel is None:
        raise SystemExit(f"{case_id}: no check ({why})")
    if wrapped:
        kernel = dataclasses.replace(kernel, target="sglang_faults:run")
    case = harness.case_for(cell.coords, config, seed=0, dtype=dtype, overrides=dict(kernel.case))
    return run_check(case, kernel, where="interpreter", dcp_mode=dcp_mode, timeout_s=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang_faults")
    parser.add_argument("scenarios", nargs="+", metavar="FAULT:CASE")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--dcp-mode", default="in-process")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # rank processes inherit this path
    for scenario in args.scenarios:
        fault, _, case_id = scenario.partition(":")
        distributed = args.dcp_mode == "distributed"
        if _platform_case(case_id):
            # another platform's cell: the fault goes with the spec into the platform's child
            record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=True, fault=fault)
        elif distributed:
            os.environ[FAULT_ENV] = fault
            record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=True)
        else:
            with injected(fault):
                record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=False)
        _print(scenario, record)
    return 0


def _platform_case(case_id: str) -> bool:
    entry = CASES[case_id]
    return len(entry) > 6 and not entry[6].startswith("sm")


def _print(scenario: str, record: dict[str, Any]) -> None:
    errors = record.get("errors") or {}
    print(json.dumps({"scenario": scenario, "status": record.get("status"), "finding": record.get("finding", False),
                      "message": record.get("message"), "function": record.get("function"),
                      "functions": record.get("functions"), "emulated": record.get("emulated"),
                      "level": record.get("level"), "max_abs": (errors.get("out") or {}).get("max_abs_err"),
                      "notes": record.get("notes"), "reason": record.get("reason")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
