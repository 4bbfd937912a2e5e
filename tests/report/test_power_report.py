"""``kernel.power`` reaches the reader: a line in the HTML cell details, a count in the run summary
and the Markdown header. Records are written by hand; the expected counts are counted by hand."""

from __future__ import annotations

from pytest_mla.core.cells import expand_cells
from pytest_mla.report.html import describe_kernel
from pytest_mla.report.markdown import render_markdown
from pytest_mla.report.summary import build_summary

from .helpers import record, verified

AXES = {"model": ["deepseek-v3"], "backend": ["a", "b", "c"], "dcp": [1], "spec": ["none"], "arch": ["sm90"]}


def power(**detected: bool) -> dict:
    return {"margin": 2.0, "undetected": [k for k, v in detected.items() if not v],
            "faults": {k: {"detected": v, "max_abs": 0.01, "cos_diff": 3e-4} for k, v in detected.items()}}


def document() -> dict:
    kernels = {
        "a": {**verified(), "power": power(**{"scale_x1.05": True, "misread_token": True})},
        "b": {**verified(), "power": power(**{"scale_x1.05": True, "misread_token": True, "mask_dropped": True})},
        "c": verified(),  # an old record without power
    }
    cells = [record(c, kernel=kernels[c.backend]) for c in expand_cells(AXES)]
    run = {"matrix": "p", "matrix_file": "matrix/p.toml", "engine": {"name": "tiny", "version": "1"},
           "host": {"arch": "cpu"}, "axes": AXES, "cells_total": 3, "seed": 0, "kernel_dtype": "bf16",
           "models": {"deepseek-v3": {"mla": True}}}
    return {"schema": "pytest-mla/result", "schema_version": 1, "run": run, "cells": cells}


EXPECTED = ("power (verified checks that would catch each planted fault): scale_x1.05 2/2, misread_token 2/2, "
            "mask_dropped 1/1; 1 without a power record")


def test_summary_and_markdown_count_what_the_checks_could_catch():
    doc = document()
    lines = [text for text, _ in build_summary(doc["cells"], [], verbosity=-1, baseline=None, regressions=[],
                                               written=[])]
    assert "  " + EXPECTED in lines
    assert f"- {EXPECTED}" in render_markdown(doc).replace("\\_", "_")


def test_html_details_name_each_fault_and_a_missed_one_loudly():
    k = {**verified(), "power": power(**{"scale_x1.05": False, "lse_base_swapped": True}),
         "variants": [{"kv_scale": 1.0, "status": "verified", "out_max_abs": 0.01, "out_cos_diff": 2e-5}]}
    text = describe_kernel(k)
    assert "power: scale_x1.05 MISSED (cos 0.0003) · lse_base_swapped caught (cos 0.0003); margin 2x the tolerance" \
        in text
    assert "k_scale 1: verified, out max_abs_err 0.01 · cos_diff 2e-05" in text


def test_split_schedules_reach_the_header_and_the_cell_details():
    """``kernel.schedule`` (the split counts the engine handed its kernel) per backend; the schedule case's
    lengths in the cell details."""
    long = {"kv_scale": None, "status": "verified", "out_max_abs": 0.002, "out_cos_diff": 1e-6,
            "seqlens": [1, 1035, 17, 32], "schedule": {"num_kv_splits": [2]}}
    short = {"kv_scale": None, "status": "verified", "out_max_abs": 0.001, "out_cos_diff": 1e-6,
             "schedule": {"num_kv_splits": [1]}}
    kernels = {
        "a": {**verified(), "kernel": "a", "schedule": {"num_kv_splits": [1, 2]}, "variants": [long, short]},
        "b": {**verified(), "kernel": "b", "schedule": {"num_kv_splits": [1]}},
        "c": {**verified(), "status": "failed", "schedule": {"num_kv_splits": [4]}},  # not verified: not counted
    }
    doc = document()
    doc["cells"] = [record(c, kernel=kernels[c.backend]) for c in expand_cells(AXES)]
    text = render_markdown(doc).replace("\\_", "_")
    assert ("- split-KV schedules verified (the KV split counts the engine handed its decode kernel): "
            "a 1, 2 (1 of 1 checks split a request); b 1 (0 of 1 checks split a request)") in text
    details = describe_kernel(kernels["a"])
    assert "  schedule: num_kv_splits 1, 2" in details
    assert "  schedule case (seqlens 1, 1035, 17, 32): verified, out max_abs_err 0.002 · cos_diff 1e-06 · KV splits 2" \
        in details


def test_graph_padded_batches_reach_the_header_and_the_cell_details():
    """``kernel.schedule["graph_padded_to"]``: how many verified checks per backend ran a batch padded as a
    FULL CUDA graph replays it, and to what; the padded run named in the cell details."""
    padded = {"kv_scale": 1.0, "status": "verified", "out_max_abs": 0.002, "out_cos_diff": 1e-6,
              "schedule": {"graph_padded_to": [4]}}
    calibrated = {"kv_scale": 0.00275, "status": "verified", "out_max_abs": 0.001, "out_cos_diff": 1e-6}
    kernels = {
        "a": {**verified(), "kernel": "a", "schedule": {"graph_padded_to": [4]}, "variants": [padded, calibrated]},
        "b": {**verified(), "kernel": "b", "schedule": {"graph_padded_to": [8], "num_kv_splits": [1]}},
        "c": {**verified(), "status": "failed", "schedule": {"graph_padded_to": [4]}},  # not verified: not counted
    }
    doc = document()
    doc["cells"] = [record(c, kernel=kernels[c.backend]) for c in expand_cells(AXES)]
    text = render_markdown(doc).replace("\\_", "_")
    assert ("- CUDA-graph-padded batches verified (dummy requests after the real ones, as the engine's runner pads "
            "a batch for a FULL graph): a 1 (padded to 4 requests); b 1 (padded to 8 requests)") in text
    details = describe_kernel(kernels["a"])
    assert "  schedule: graph_padded_to 4" in details
    assert ("  k_scale 1: verified, out max_abs_err 0.002 · cos_diff 1e-06 · CUDA-graph batch padded to 4 requests"
            in details)
    assert "  k_scale 0.00275: verified, out max_abs_err 0.001 · cos_diff 1e-06\n" in details + "\n"
