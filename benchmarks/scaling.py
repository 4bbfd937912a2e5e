"""How the cost of a matrix grows with its cells: the numbers and the plot of docs/scaling.md.

    .venv/bin/python benchmarks/scaling.py [--run 1000,10000,100000] [--render 10000,100000,1000000]
                                           [--merge 2,4,8,16] [--repeat 3] [--svg docs/scaling.svg]

Measures, each as a user meets it (fresh processes, wall time):

- run: ``overhead.py``'s validation-only matrix run (JSON, Markdown, HTML written) and bare
  parametrized pytest with as many tests, best of --repeat, side by side;
- render: ``pytest-mla render`` of an N-cell result file to Markdown and to HTML (wall time and
  peak memory of each command; ``report.py --cli``);
- merge: ``pytest-mla merge`` of S shards of 10,000 cells (``report.py --merge``).

Prints a Markdown table and writes the plot (an SVG drawn here: time against cells, both
logarithmic; no plotting library) to --svg.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402
import report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="1000,10000,100000", help="cell counts of the matrix runs ('' for none)")
    parser.add_argument("--render", default="10000,100000,1000000", help="cell counts of the rendered files")
    parser.add_argument("--merge", default="2,4,8,16", help="shard counts (10,000 cells each) to merge")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--svg", default=None, help="write the plot here")
    opts = parser.parse_args()
    sizes = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
    print(f"(load average {os.getloadavg()[0]:.2f} at the start; {os.cpu_count()} CPUs)", flush=True)

    runs = []
    for n in sizes(opts.run):
        r = overhead.measure(n, opts.repeat)
        runs.append(r)
        print(f"run {r['cells']}: matrix {r['matrix']:.2f} s, bare pytest {r['plain']:.2f} s, "
              f"ratio {r['matrix'] / r['plain']:.2f}x; CPU {r['matrix_cpu']:.2f} s / {r['plain_cpu']:.2f} s, ratio "
              f"{r['matrix_cpu'] / r['plain_cpu']:.2f}x (load {r['load_before']:.1f}/{r['load_after']:.1f})", flush=True)
    renders = []
    for n in sizes(opts.render):
        r = report.render_cli(n)
        renders.append(r)
        print(f"render {r['cells']}: md {r['md_s']:.1f} s ({r['md_cpu_s']:.1f} CPU) / {r['md_rss_mb']:.0f} MB, html "
              f"{r['html_s']:.1f} s ({r['html_cpu_s']:.1f} CPU) / {r['html_rss_mb']:.0f} MB, both in one command "
              f"{r['both_s']:.1f} s ({r['both_cpu_s']:.1f} CPU) / {r['both_rss_mb']:.0f} MB, file "
              f"{r['bytes_per_cell']:.0f} B/cell", flush=True)
    merges = []
    for shards in sizes(opts.merge):
        r = report.merge_cli(shards, 10_000)
        merges.append(r)
        print(f"merge {shards} x {r['per_shard']}: {r['merge_s']:.1f} s ({r['merge_cpu_s']:.1f} CPU) / "
              f"{r['rss_mb']:.0f} MB", flush=True)

    print()
    print(table(runs, renders, merges))
    if opts.svg:
        Path(opts.svg).write_text(svg(runs, renders, merges), encoding="utf-8")
        print(f"\nplot written to {opts.svg}")


def table(runs: Sequence[dict[str, Any]], renders: Sequence[dict[str, Any]], merges: Sequence[dict[str, Any]]) -> str:
    lines = ["| cells (run / rendered) | matrix run | bare pytest | ratio (CPU ratio) | render md | render html "
             "| md + html, one command | peak memory (md / html / both) | result file |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by_cells: dict[int, dict[str, Any]] = {}
    for r in runs:  # by order of magnitude: 10,080 run cells and 9,720 rendered ones share a row
        by_cells.setdefault(round(math.log10(r["cells"])), {}).update(run=r)
    for r in renders:
        by_cells.setdefault(round(math.log10(r["cells"])), {}).update(render=r)
    for n in sorted(by_cells):
        run, rnd = by_cells[n].get("run"), by_cells[n].get("render")
        cells = " / ".join(f"{r['cells']:,}" for r in (run, rnd) if r)
        lines.append("| " + " | ".join([
            cells,
            f"{run['matrix']:.2f} s" if run else "",
            f"{run['plain']:.2f} s" if run else "",
            f"{run['matrix'] / run['plain']:.2f}× ({run['matrix_cpu'] / run['plain_cpu']:.2f}×)" if run else "",
            f"{rnd['md_s']:.1f} s ({rnd['md_cpu_s']:.1f} s CPU)" if rnd else "",
            f"{rnd['html_s']:.1f} s ({rnd['html_cpu_s']:.1f} s CPU)" if rnd else "",
            f"{rnd['both_s']:.1f} s ({rnd['both_cpu_s']:.1f} s CPU)" if rnd else "",
            f"{rnd['md_rss_mb']:.0f} / {rnd['html_rss_mb']:.0f} / {rnd['both_rss_mb']:.0f} MB" if rnd else "",
            f"{rnd['json_mb']:.1f} MB ({rnd['bytes_per_cell']:.0f} B/cell)" if rnd else "",
        ]) + " |")
    if merges:
        lines += ["", "| shards × 10,000 cells | cells | pytest-mla merge | peak memory |", "|---:|---:|---:|---:|"]
        lines += [f"| {m['shards']} | {m['cells']:,} | {m['merge_s']:.1f} s ({m['merge_cpu_s']:.1f} s CPU) "
                  f"| {m['rss_mb']:.0f} MB |" for m in merges]
    return "\n".join(lines)


def svg(runs: Sequence[dict[str, Any]], renders: Sequence[dict[str, Any]], merges: Sequence[dict[str, Any]]) -> str:
    """Seconds against cells, log-log, one polyline per measure."""
    series = [
        ("bare pytest", "#57606a", [(r["cells"], r["plain"]) for r in runs]),
        ("matrix run (JSON, Markdown, HTML)", "#0969da", [(r["cells"], r["matrix"]) for r in runs]),
        ("pytest-mla render → Markdown", "#1a7f37", [(r["cells"], r["md_s"]) for r in renders]),
        ("pytest-mla render → HTML", "#9a6700", [(r["cells"], r["html_s"]) for r in renders]),
        ("pytest-mla merge (shards of 10,000)", "#cf222e", [(m["cells"], m["merge_s"]) for m in merges]),
    ]
    series = [s for s in series if s[2]]
    points = [p for _, _, pts in series for p in pts]
    if not points:
        return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    W, H, L, R, T, B = 720, 420, 70, 45, 20, 110
    x0, x1 = math.floor(math.log10(min(p[0] for p in points))), math.ceil(math.log10(max(p[0] for p in points)))
    y0, y1 = math.floor(math.log10(min(p[1] for p in points))), math.ceil(math.log10(max(p[1] for p in points)))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)

    def px(cells: float) -> float:
        return L + (math.log10(cells) - x0) / (x1 - x0) * (W - L - R)

    def py(seconds: float) -> float:
        return H - B - (math.log10(seconds) - y0) / (y1 - y0) * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="#fff"/>']
    for e in range(x0, x1 + 1):
        x = px(10 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#d0d7de"/>')
        out.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{10 ** e:,}</text>')
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        label = f"{10 ** e:g} s"
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#d0d7de"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - B + 34}" text-anchor="middle">cells</text>')
    for i, (name, colour, pts) in enumerate(series):
        pts = sorted(pts)
        path = " ".join(f"{px(c):.1f},{py(s):.1f}" for c, s in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{px(c):.1f}" cy="{py(s):.1f}" r="3" fill="{colour}"/>' for c, s in pts]
        ly = H - B + 52 + 16 * (i // 2)
        lx = L + (i % 2) * 320
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 30}" y="{ly}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
