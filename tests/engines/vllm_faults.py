"""Faults injected at run time into the installed vLLM's own MLA kernel and DCP merge, and a driver that checks cells.

Run inside a vLLM venv (``tests/engines/test_vllm_backend.py`` does)::

    python tests/engines/vllm_faults.py SCENARIO [SCENARIO ...] [--dcp-mode distributed]

A scenario is ``FAULT:CASE`` (``none`` for no fault); the driver prints one
JSON line per scenario with the kernel record's status, message and errors.
Nothing in the venv is edited: each fault replaces a vLLM function in this
process (and, for ``--dcp-mode distributed``, in every rank process, which
runs ``run`` below as its engine runner) and is undone afterwards.

Faults (what a buggy release could ship):

* ``decode-drops-last-token``: ``decode_attention_fwd`` reads one key fewer
  per row (an off-by-one in the sequence lengths it is given).
* ``merge-ignores-lse``: ``cp_lse_ag_out_rs`` averages the ranks' partial
  outputs instead of weighting them by their LSE.
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
FAULT_ENV = "PYTEST_MLA_VLLM_FAULT"

#: Cells the driver knows: id -> (model, backend, spec, dcp, kv_dtype, page_size).
CASES = {
    "v2lite-decode": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "auto", 16),
    "v2lite-chain": ("deepseek-v2-lite", "TRITON_MLA", "eagle-1x3", 1, "auto", 16),
    "v2lite-decode-dcp2": ("deepseek-v2-lite", "TRITON_MLA", "none", 2, "auto", 16),
    "v2lite-decode-fp8": ("deepseek-v2-lite", "TRITON_MLA", "none", 1, "fp8", 16),
    "llama-decode": ("llama-3.1-8b", "TRITON_ATTN", "none", 1, "auto", 16),
}


def _decode_fault(original: Any) -> Any:
    def decode_attention_fwd(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, *args, **kwargs):
        return original(q, k_buffer, v_buffer, o, lse, req_to_token, (b_seq_len - 1).clamp(min=1), *args, **kwargs)

    return decode_attention_fwd


def _merge_fault(original: Any) -> Any:
    def cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group, ctx=None, return_lse=False, **kwargs):
        if cp_group.world_size == 1:
            return original(cp_attn_out, cp_attn_lse, cp_group, ctx=ctx, return_lse=return_lse, **kwargs)
        # The ranks' outputs averaged, the LSEs ignored; heads scattered as vLLM does.
        out = cp_group.reduce_scatter(cp_attn_out.nan_to_num(0.0) / cp_group.world_size, dim=1)
        if return_lse:
            heads = cp_attn_lse.shape[1] // cp_group.world_size
            return out, cp_attn_lse[:, heads * cp_group.rank_in_group: heads * (cp_group.rank_in_group + 1)]
        return out

    return cp_lse_ag_out_rs


FAULTS = {
    "decode-drops-last-token": ("vllm.v1.attention.ops.triton_decode_attention", "decode_attention_fwd",
                                _decode_fault),
    "merge-ignores-lse": ("vllm.v1.attention.ops.dcp", "cp_lse_ag_out_rs", _merge_fault),
}


@contextlib.contextmanager
def injected(fault: str) -> Iterator[None]:
    """Replace one vLLM function, and every vLLM module's binding of it, for the block."""
    if fault == "none":
        yield
        return
    import importlib

    from pytest_mla.engines.vllm import checks as vllm_backend
    from pytest_mla.engines.vllm import VLLMEngine

    vllm_backend.adopt_factory(VLLMEngine)  # a rank process has no engine yet: make it as the runner would
    vllm_backend.prepare_process()  # the Triton mode and the engine's import, as the runner does
    module_name, attr, make = FAULTS[fault]
    importlib.import_module("vllm.v1.attention.backends.mla.triton_mla")
    module = importlib.import_module(module_name)
    original = getattr(module, attr)
    faulty = make(original)
    bound = [m for m in list(sys.modules.values())
             if m is not None and getattr(m, "__name__", "").startswith("vllm") and getattr(m, attr, None) is original]
    for m in bound:
        setattr(m, attr, faulty)
    try:
        yield
    finally:
        for m in bound:
            setattr(m, attr, original)


def run(inputs: Any, ctx: Any, options: Any) -> Any:
    """The TRITON_MLA runner with the fault named in ``PYTEST_MLA_VLLM_FAULT`` (for distributed ranks)."""
    from pytest_mla.engines.vllm.startup import run_triton_mla

    with injected(os.environ.get(FAULT_ENV, "none")):
        return run_triton_mla(inputs, ctx, options)


def check(case_id: str, *, dtype: str, dcp_mode: str, wrapped: bool) -> dict[str, Any]:
    """One cell's kernel record, with the spec the vLLM adapter gives it on this host."""
    import dataclasses

    from pytest_mla.core.matrix import load_matrix
    from pytest_mla.engines.vllm import VLLMEngine
    from pytest_mla.kernels import harness
    from pytest_mla.runner import run_check

    model, backend, spec, dcp, kv, page = CASES[case_id]
    matrix = load_matrix(ROOT / "matrix" / "vllm.toml")
    want = {"model": model, "backend": backend, "dcp": dcp, "spec": spec, "arch": "sm90", "kv_dtype": kv,
            "page_size": page}
    cell = next(c for c in matrix.cells() if all(c.coords.get(k) == v for k, v in want.items()))
    configured = VLLMEngine().configure(cell, matrix.models[model])
    kernel = configured.kernel
    assert kernel is not None, configured.kernel_reason
    if wrapped:
        kernel = dataclasses.replace(kernel, target="vllm_faults:run")
    case = harness.case_for(cell.coords, matrix.models[model], seed=0, dtype=dtype, overrides=dict(kernel.case))
    return run_check(case, kernel, where="interpreter", dcp_mode=dcp_mode, timeout_s=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm_faults")
    parser.add_argument("scenarios", nargs="+", metavar="FAULT:CASE")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--dcp-mode", default="in-process")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # rank processes inherit this path
    for scenario in args.scenarios:
        fault, _, case_id = scenario.partition(":")
        if args.dcp_mode == "distributed":
            # no fault: the adapter's own target, as a matrix run starts it in each rank process
            os.environ[FAULT_ENV] = fault
            record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=fault != "none")
        else:
            with injected(fault):
                record = check(case_id, dtype=args.dtype, dcp_mode=args.dcp_mode, wrapped=False)
        errors = record.get("errors") or {}
        print(json.dumps({"scenario": scenario, "status": record.get("status"), "finding": record.get("finding", False),
                          "message": record.get("message"), "function": record.get("function"),
                          "functions": record.get("functions"), "max_abs": (errors.get("out") or {}).get("max_abs_err"),
                          "reason": record.get("reason")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
