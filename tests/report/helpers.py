"""Builders for result documents and a small matrix, shared by the report tests (no fixtures here)."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pytest_mla.core.cells import Cell, expand_cells

SMALL_MATRIX = """
title = "Small matrix"

[engine]
name = "reference"

[axes]
model   = ["deepseek-v3", "llama-3.1-8b"]
backend = ["triton", "flashmla", "trtllm_mla"]
dcp     = [1, 2]
spec    = ["none", "eagle-1x3"]
arch    = ["sm90", "sm100"]

[[rule]]
when = { backend = "trtllm_mla", arch = "sm90" }
reject = { error = "ValueError", message = "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend." }

[[rule]]
when = { backend = ["flashmla", "trtllm_mla"], "model.mla" = false }
reject = { error = "ValueError", message = "{backend} backend can only be used with MLA models." }

[[rule]]
when = { dcp = ">1", "model.mla" = false }
reject = { error = "ValueError", message = "Decode context parallelism needs an MLA model (one latent KV head shared by all heads); {model} has {model.num_kv_heads} KV heads." }

[[rule]]
when = { backend = "trtllm_mla", dcp = ">1", "spec.enabled" = true }
reject = { error = "ValueError", message = "trtllm_mla cannot serve decode context parallelism with speculative decoding: it does not forward the cyclic DCP metadata to its decode kernel and returns no rank-local LSE for the cross-rank merge. Select cutedsl_mla." }
"""

AXES: dict[str, list[Any]] = {
    "model": ["deepseek-v3", "llama-3.1-8b"],
    "backend": ["triton", "flashmla", "trtllm_mla"],
    "dcp": [1, 2, 4],
    "spec": ["none", "eagle-1x3"],
    "arch": ["sm90", "sm100"],
}
MSG_ARCH = "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x)."
MSG_DCP = "trtllm_mla cannot serve decode context parallelism with speculative decoding."


def verified(where: str = "sm90", max_abs: float = 1e-4) -> dict[str, Any]:
    return {"status": "verified", "where": where, "reason": None, "seed": 7, "case": {"batch": 2, "s_q": 1},
            "errors": {"out": {"max_abs_err": max_abs, "max_rel_err": 2e-3, "cos_diff": 1e-8},
                       "lse": {"max_abs_err": 1e-7, "max_rel_err": 1e-7, "cos_diff": 0.0}},
            "tolerance": {"out": {"abs": 1e-3, "rel": 0.0157, "cos": 1e-5}, "lse": {"abs": 1e-4}},
            "time_s": 0.01, "message": None, "kernel": "triton", "reused": False}


def not_run(reason: str = "needs an sm100 GPU; this host is sm90") -> dict[str, Any]:
    return {"status": "not-run", "where": None, "reason": reason}


def record(cell: Cell, verdict: str = "pass", *, reject: str | None = None, kernel: dict | None = None,
           reason: str | None = None, xfail: str | None = None) -> dict[str, Any]:
    expectation = {"kind": "reject" if reject else "accept", "error": "ValueError" if reject else None,
                   "message": reject, "match": None, "xfail": xfail, "rule": 0 if reject else None,
                   "rule_line": 10 if reject else None}
    if reject:
        outcome = {"kind": "rejected", "error": "ValueError", "message": reject}
    else:
        outcome = {"kind": "accepted", "error": None, "message": None, "backends": {"decode": cell.backend}}
    return {"id": cell.id, "nodeid": f"matrix/t.toml::{cell.name}", "matrix": "t", "coords": cell.coords,
            "expectation": expectation, "outcome": outcome, "verdict": verdict, "reason": reason,
            "kernel": None if reject else (kernel or not_run()), "duration_s": 0.001}


def decide(cell: Cell) -> str | None:
    """The rejection message the synthetic matrix documents for a cell (None: accepted)."""
    if cell.backend == "trtllm_mla" and cell.arch == "sm90":
        return MSG_ARCH
    if cell.backend == "trtllm_mla" and cell.dcp > 1 and cell.spec != "none":
        return MSG_DCP
    return None


def make_document(axes: dict[str, list[Any]] | None = None, *, host_arch: str = "sm90",
                  hostname: str = "host-a", only_arch: str | None = None,
                  started: str = "2026-01-01T00:00:00+00:00") -> dict[str, Any]:
    """A document as one host of a nightly job writes it: kernels verified on its own arch."""
    axes = copy.deepcopy(axes or AXES)
    if only_arch:
        axes["arch"] = [only_arch]
    cells = []
    for cell in expand_cells(axes):
        msg = decide(cell)
        if msg:
            cells.append(record(cell, reject=msg))
        elif cell.arch == host_arch and cell.backend == "triton":
            cells.append(record(cell, kernel=verified(host_arch)))
        else:
            cells.append(record(cell, kernel=not_run(f"needs an {cell.arch} GPU; this host is {host_arch}")))
    counts = {v: sum(1 for c in cells if c["verdict"] == v) for v in ("pass", "fail", "error", "skip", "xfail", "xpass")}
    run = {"matrix": "t", "matrix_file": "matrix/t.toml", "title": "Test matrix",
           "engine": {"name": "reference", "version": "0.1.0", "described_versions": "*", "metadata": {},
                      "unavailable": None},
           "host": {"arch": host_arch, "gpu": f"GPU-{host_arch}", "gpus": 1, "machine": "x86_64",
                    "system": "Linux", "hostname": hostname},
           "versions": {"python": "3.11", "pytest_mla": "0.1.0"}, "triton_mode": host_arch, "git_commit": None,
           "started": started, "finished": started, "seed": 0, "kernel_dtype": "bf16", "dcp_mode": "in-process",
           "args": [], "complete": True, "interrupted": False, "cells_total": len(cells),
           "cells_reported": len(cells), "counts": counts, "axes": axes}
    return {"schema": "pytest-mla/result", "schema_version": 1, "run": run, "cells": cells}


def find(document: dict[str, Any], cell_id: str) -> dict[str, Any]:
    return next(c for c in document["cells"] if c["id"] == cell_id)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def chromium_args(browser: str, profile: str) -> list[str]:
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=5000"]


def dump_dom(browser: str, url: str, timeout: float = 60) -> str:
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(chromium_args(browser, profile) + ["--dump-dom", url],
                             capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def screenshot(browser: str, url: str, out: Path, size: str = "1400,900", timeout: float = 60) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(chromium_args(browser, profile) + [f"--window-size={size}", f"--screenshot={out}", url],
                       capture_output=True, text=True, timeout=timeout, check=True)


def table_after(md: str, heading: str, *, links: bool = True) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading``; the no-break spaces inside entries read as
    spaces; ``links=False``: each link is its text (``[text](url)`` → ``text``)."""
    lines = md.splitlines()
    i = lines.index(heading)
    while not lines[i].startswith("|"):
        i += 1
    rows = []
    while i < len(lines) and lines[i].startswith("|"):
        line = lines[i] if links else re.sub(r"\[((?:\\.|[^\]\\])*)\]\([^)]*\)", r"\1", lines[i])
        rows.append([c.strip().replace("\u00a0", " ") for c in line.strip("|").split(" | ")])
        i += 1
    return rows
