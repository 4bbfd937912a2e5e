"""Wall time of a 10,000-cell validation-only matrix run against plain pytest.

Both sides run as fresh `pytest` processes, several times each (best of N):

  matrix: the built-in rules on the built-in engine with 21 models
          (5 from the catalogue, 16 synthetic) × 8 backends × 5 DCP sizes ×
          4 spec settings × 3 archs = 10,080 cells, --mla-kernel=off, writing
          its JSON, Markdown and HTML reports;
  plain:  one test file with 10,080 trivially parametrized tests.

Prints both times and their ratio (target: ≤ 1.5×).

    python benchmarks/overhead.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


def build(workdir: Path) -> int:
    text = (ROOT / "matrix" / "reference.toml").read_text()
    text = re.sub(r"(?m)^model\s*=.*$", "model = " + repr(MODELS).replace("'", '"'), text)
    text = re.sub(r"(?m)^dcp\s*=.*$", "dcp = [1, 2, 4, 8, 16]", text)
    text = re.sub(r"(?m)^spec\s*=.*$", 'spec = ["none", "eagle-1x1", "eagle-1x3", "eagle-4x3"]', text)
    text = text.replace("[kernel]", SYNTHETIC + "\n[kernel]")
    (workdir / "big.toml").write_text(text)
    n = len(MODELS) * 8 * 5 * 4 * 3
    (workdir / "test_plain.py").write_text(
        "import pytest\n\n"
        f"@pytest.mark.parametrize('i', range({n}))\n"
        "def test_trivial(i):\n    assert i >= 0\n"
    )
    return n


def timed(args: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode not in (0, 1):
        raise SystemExit(f"pytest {' '.join(args)} exited {proc.returncode}: {tail}")
    return elapsed, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n = build(work)
        matrix_args = ["--mla-matrix=big.toml", "--mla-kernel=off", "-p", "no:xdist"]
        plain_args = ["test_plain.py", "-p", "no:xdist"]
        best = {"matrix": float("inf"), "plain": float("inf")}
        tails = {}
        for _ in range(opts.repeat):  # interleaved, so drift of the machine hits both
            for name, args in (("matrix", matrix_args), ("plain", plain_args)):
                t, tails[name] = timed(args, work)
                best[name] = min(best[name], t)
        print(f"cells/tests: {n}")
        print(f"matrix run (validation only, JSON+MD+HTML written): {best['matrix']:.2f} s   [{tails['matrix']}]")
        print(f"plain pytest, trivially parametrized:              {best['plain']:.2f} s   [{tails['plain']}]")
        print(f"ratio matrix/plain: {best['matrix'] / best['plain']:.2f}x (target <= 1.5x; best of {opts.repeat})")


if __name__ == "__main__":
    main()
