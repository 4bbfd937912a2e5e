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
from typing import Any

HOST_ARCH_ENV = "PYTEST_MLA_HOST_ARCH"  # override the probe (tests, unusual setups)
HOST_GPUS_ENV = "PYTEST_MLA_HOST_GPUS"


@functools.lru_cache(maxsize=1)
def probe_host() -> dict[str, Any]:
    """{"arch": "sm90" | "gfx942" | "cpu", "gpu": name or None, "gpus": count, "machine": ...}."""
    info: dict[str, Any] = {"arch": "cpu", "gpu": None, "gpus": 0,
                            "machine": platform.machine(), "system": platform.system(),
                            "hostname": platform.node()}
    forced = os.environ.get(HOST_ARCH_ENV)
    if forced:
        info.update(arch=forced, source=HOST_ARCH_ENV, gpus=int(os.environ.get(HOST_GPUS_ENV, "1")))
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
KERNELS_MISSING = "torch/triton not installed (pip install 'pytest-mla[kernels]')"


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
