"""What this host can run, found without importing torch when it can be helped.

The report header and the JSON metadata want the host's GPU arch. Importing
torch costs about a second, too much for a validation-only run, so the probe
asks ``nvidia-smi`` (or torch, if the process already imported it). The
kernel path confirms with torch itself when it runs a kernel.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from .cells import ARCH_HINT, is_arch

HOST_ARCH_ENV = "PYTEST_MLA_HOST_ARCH"  # override the probe (tests, unusual setups)
HOST_GPUS_ENV = "PYTEST_MLA_HOST_GPUS"  # with it: how many GPUs (default 1)
INTERPRET_ENV = "TRITON_INTERPRET"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: The values Triton reads as on and off (case-insensitive; unset or empty: off, or decided here).
TRUE_WORDS = ("1", "true", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "no", "n", "off", "")


def environment_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each environment variable pytest-mla reads whose value it cannot use.

    Checked once, before any cell runs: a garbage value found at session end
    would cost the report of a run that is otherwise complete.
    """
    env = os.environ if environ is None else environ
    problems = []
    arch = env.get(HOST_ARCH_ENV)
    if arch is not None and arch.strip() != "cpu" and not is_arch(arch.strip()):
        problems.append(f"{HOST_ARCH_ENV}: expected 'cpu' or a GPU arch such as sm90, got {arch!r} ({ARCH_HINT})")
    gpus = env.get(HOST_GPUS_ENV)
    if gpus is not None and parse_gpu_count(gpus) is None:
        problems.append(f"{HOST_GPUS_ENV}: expected a number of GPUs (0 or more), got {gpus!r}")
    interpret = env.get(INTERPRET_ENV)
    if interpret is not None and interpret.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
        problems.append(f"{INTERPRET_ENV}: expected 1 or 0 (or true/false, yes/no, on/off), got {interpret!r}")
    summary = env.get(STEP_SUMMARY_ENV)
    if summary:
        reason = unwritable_file(summary)
        if reason:
            problems.append(f"{STEP_SUMMARY_ENV}: cannot append the run's summary to {summary!r}: {reason}")
    return problems


def parse_gpu_count(text: str) -> int | None:
    """``"2"`` → 2; None for anything that is not a small non-negative integer."""
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 4:
        return None
    return int(text)


def unwritable_file(path: str) -> str | None:
    """Why ``path`` cannot be appended to (None: it can), without creating it."""
    target = Path(path)
    if target.is_dir():
        return "it is a folder"
    if target.exists() and not target.is_file():  # a FIFO would hang the append, a device take it
        return "it is not a regular file"
    if target.exists():
        return None if os.access(target, os.W_OK) else "permission denied"
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        return f"no folder {os.fspath(parent)!r}"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot create files in {os.fspath(parent)!r}"


@functools.lru_cache(maxsize=1)
def probe_host() -> dict[str, Any]:
    """{"arch": "sm90" | "gfx942" | "cpu", "gpu": name or None, "gpus": count, "machine": ...}."""
    info: dict[str, Any] = {"arch": "cpu", "gpu": None, "gpus": 0,
                            "machine": platform.machine(), "system": platform.system(),
                            "hostname": platform.node()}
    forced = os.environ.get(HOST_ARCH_ENV)
    if forced:
        gpus = parse_gpu_count(os.environ.get(HOST_GPUS_ENV, "1"))  # checked up front (environment_problems)
        info.update(arch=forced.strip(), source=HOST_ARCH_ENV, gpus=1 if gpus is None else gpus)
        return info
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        try:
            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                arch = getattr(props, "gcnArchName", None)
                arch = arch.split(":")[0] if arch else f"sm{props.major}{props.minor}"
                info.update(arch=arch, gpu=props.name, gpus=torch.cuda.device_count(), source="torch")
        except Exception:  # a broken driver is a CPU host for our purposes
            pass
        return info
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            rows = [r.rsplit(",", 1) for r in out.strip().splitlines() if "," in r]
            if rows:
                name, cap = rows[0]
                major, _, minor = cap.strip().partition(".")
                info.update(arch=f"sm{major}{minor or '0'}", gpu=name.strip(), gpus=len(rows), source="nvidia-smi")
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return info


#: Why kernel checks cannot run in a validation-only install.
#: ``pip install 'pytest-mla[kernels]'`` alone would pull a multi-GB CUDA torch onto a CPU machine: the
#: hint names the CPU wheel first (docs/troubleshooting.md, "Torch installs").
KERNELS_MISSING = ("torch/triton not installed (without a GPU: pip install torch --index-url "
                   "https://download.pytorch.org/whl/cpu && pip install triton numpy; with one: "
                   "pip install 'pytest-mla[kernels]')")


@functools.lru_cache(maxsize=1)
def kernel_dependencies_missing() -> str | None:
    """``KERNELS_MISSING`` when torch or triton cannot be imported here, else None.

    ``find_spec`` looks for the packages without importing them (cheap)."""
    import importlib.util

    for name in ("torch", "triton"):
        try:
            if importlib.util.find_spec(name) is None:
                return KERNELS_MISSING
        except (ImportError, ValueError):
            return KERNELS_MISSING
    return None


def worker_gpu(workerid: str, gpus: int) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of xdist worker ``gwN`` on a host with ``gpus`` GPUs (None: leave it)."""
    if gpus > 1 and workerid.startswith("gw") and workerid[2:].isdigit():
        return str(int(workerid[2:]) % gpus)
    return None
