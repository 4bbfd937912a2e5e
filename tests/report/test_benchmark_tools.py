"""The measuring tools of benchmarks/ measure what they say (not timed: no number is a target here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_a_commands_peak_memory_is_its_own_not_that_of_the_large_process_that_started_it(tmp_path):
    """``report.run_measured`` once read ``ru_maxrss`` from ``wait4``: Linux starts a child's from its
    parent's peak, so after the benchmark built a large document every command 'peaked' at its size."""
    small = tmp_path / "small.json"
    small.write_text('{"a": [1, 2, 3]}', encoding="utf-8")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import report
        ballast = bytearray(600 * 1024 * 1024)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1  # resident, as a built synthetic document is
        wall, peak_mb, _ = report.run_measured([sys.executable, "-m", "json.tool", {str(small)!r}])
        print(peak_mb)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    peak_mb = float(out.stdout.split()[-1])
    assert 1 < peak_mb < 200, f"json.tool on a 16-byte file peaked at {peak_mb:.0f} MB"
