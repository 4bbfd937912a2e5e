"""Wall time of an N-cell validation-only matrix run against bare parametrized pytest.

Both sides run as fresh `pytest` processes, side by side, several times each
(best of --repeat, interleaved so that drift of a shared machine hits both):

  matrix: the built-in rules on the built-in engine with 21 models
          (5 from the catalogue, 16 synthetic) × 8 backends × 5 DCP sizes ×
          4 spec settings × 3 archs = 10,080 cells, times a `tp` axis of
          round(N / 10,080) values when N is larger (the reference engine
          ignores tp: each value repeats the 10,080 verdicts), run with
          --mla-kernel=off, writing its JSON, Markdown and HTML reports;
  plain:  one test file with as many trivially parametrized tests.

Prints both times, the load of the machine before and after, and, last,
the ratio (target: <= 1.10x, issue 24).

    python benchmarks/overhead.py [--cells 10000] [--repeat 3] [--profile]

--profile runs the matrix side once under cProfile and prints the 30
functions with the most cumulative time instead.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_CELLS = 10_080

SYNTHETIC = "\n".join(
    f"[models.synth-mla-{h}]\nmla = true\nnum_heads = {h}\nkv_lora_rank = 512\n"
    f"qk_rope_head_dim = 64\nqk_nope_head_dim = 128\nv_head_dim = 128\n"
    for h in (8, 12, 24, 32, 40, 48, 56, 96)
) + "\n".join(
    f"[models.synth-gqa-{h}]\nmla = false\nnum_heads = {h}\nnum_kv_heads = 4\nhead_dim = 128\n"
    for h in (8, 12, 16, 20, 24, 36, 40, 48)
)
MODELS = ["deepseek-v3", "deepseek-v2-lite", "kimi-k2", "llama-3.1-8b", "qwen2.5-7b"] + [
    f"synth-mla-{h}" for h in (8, 12, 24, 32, 40, 48, 56, 96)
] + [f"synth-gqa-{h}" for h in (8, 12, 16, 20, 24, 36, 40, 48)]


def build(workdir: Path, cells: int = BASE_CELLS) -> int:
    """Write big.toml (about ``cells`` cells) and test_plain.py (as many tests); returns the count."""
    text = (ROOT / "matrix" / "reference.toml").read_text()
    models = MODELS
    if cells < BASE_CELLS:  # fewer models (480 cells each), MLA and GQA alike (some rules need each)
        mla, gqa = [m for m in MODELS if "gqa" not in m and "llama" not in m and "qwen" not in m], \
            [m for m in MODELS if "gqa" in m or "llama" in m or "qwen" in m]
        count = max(2, round(cells / 480))
        models = [(mla if i % 2 == 0 else gqa)[i // 2] for i in range(count)]
    text = re.sub(r"(?m)^model\s*=.*$", "model = " + repr(models).replace("'", '"'), text)
    text = re.sub(r"(?m)^dcp\s*=.*$", "dcp = [1, 2, 4, 8, 16]", text)
    text = re.sub(r"(?m)^spec\s*=.*$", 'spec = ["none", "eagle-1x1", "eagle-1x3", "eagle-4x3"]', text)
    tp = max(1, round(cells / BASE_CELLS))
    if tp > 1:
        text = re.sub(r"(?m)^(arch\s*=.*)$", r"\1\ntp = " + repr(list(range(1, tp + 1))), text)
    text = text.replace("[kernel]", SYNTHETIC + "\n[kernel]")
    (workdir / "big.toml").write_text(text)
    n = len(models) * 8 * 5 * 4 * 3 * tp
    (workdir / "test_plain.py").write_text(
        "import pytest\n\n"
        f"@pytest.mark.parametrize('i', range({n}))\n"
        "def test_trivial(i):\n    assert i >= 0\n"
    )
    return n


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(args: list[str], cwd: Path) -> tuple[float, str]:
    """(wall seconds, last line) of one pytest run; ``timed.cpu_s``: its user + system CPU seconds."""
    start, cpu = time.perf_counter(), cpu_of_children()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    timed.cpu_s = cpu_of_children() - cpu  # type: ignore[attr-defined]
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode not in (0, 1):
        raise SystemExit(f"pytest {' '.join(args)} exited {proc.returncode}: {tail}")
    return elapsed, tail


def matrix_args(cells: int) -> list[str]:
    return ["--mla-matrix=big.toml", "--mla-kernel=off", "-p", "no:xdist", f"--mla-max-cells={max(cells, 200_000)}"]


def measure(cells: int, repeat: int) -> dict[str, float | int | str]:
    """Best-of-``repeat`` wall times of both sides; interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n = build(work, cells)
        sides = (("matrix", matrix_args(n)), ("plain", ["test_plain.py", "-p", "no:xdist"]))
        best = {"matrix": float("inf"), "plain": float("inf")}
        cpu = {"matrix": float("inf"), "plain": float("inf")}  # best CPU time (of any run: another measure)
        tails: dict[str, str] = {}
        load_before = os.getloadavg()[0]
        for _ in range(repeat):
            for name, args in sides:
                t, tails[name] = timed(args, work)
                best[name] = min(best[name], t)
                cpu[name] = min(cpu[name], timed.cpu_s)  # type: ignore[attr-defined]
        json_bytes = (work / "reports" / "big.json").stat().st_size
        return {"cells": n, "matrix": best["matrix"], "plain": best["plain"], "matrix_cpu": cpu["matrix"],
                "plain_cpu": cpu["plain"], "matrix_tail": tails["matrix"],
                "plain_tail": tails["plain"], "load_before": load_before, "load_after": os.getloadavg()[0],
                "json_bytes": json_bytes}


def profile(cells: int) -> None:
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n = build(work, cells)
        out = work / "prof.out"
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", *matrix_args(n)], cwd=work, capture_output=True, check=False)
        pstats.Stats(str(out)).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=BASE_CELLS,
                        help="about how many cells (a multiple of 10,080 is exact; default 10,080)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile the matrix side once instead")
    opts = parser.parse_args()
    if opts.profile:
        profile(opts.cells)
        return
    r = measure(opts.cells, opts.repeat)
    print(f"cells/tests: {r['cells']}  (load average {r['load_before']:.2f} before, {r['load_after']:.2f} after; "
          f"{os.cpu_count()} CPUs)")
    print(f"matrix run (validation only, JSON+MD+HTML written): {r['matrix']:.2f} s ({r['matrix_cpu']:.2f} s CPU)"
          f"   [{r['matrix_tail']}]")
    print(f"plain pytest, trivially parametrized:              {r['plain']:.2f} s ({r['plain_cpu']:.2f} s CPU)"
          f"   [{r['plain_tail']}]")
    print(f"ratio of CPU times (user + system; less swayed by load): {r['matrix_cpu'] / r['plain_cpu']:.2f}x")
    print(f"result file: {r['json_bytes'] / r['cells']:.0f} bytes per cell")
    print(f"ratio matrix/plain: {r['matrix'] / r['plain']:.2f}x (target <= 1.10x; best of {opts.repeat})")


if __name__ == "__main__":
    main()
